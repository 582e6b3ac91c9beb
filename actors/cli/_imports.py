"""What a user names on the command line as ``MODULE:NAME``, imported one way for all.

``fractor run --tool``, ``fractor bench --tool`` and ``fractor mcp-serve`` name a
function, a tool or an agent of the user's own module. ``import_spec`` imports it
with the current directory importable, as ``python -m`` makes it (the console
script's ``sys.path`` starts at the script's folder instead), and turns every way
it can fail into a ``SpecError`` of one line naming the spec and what is wrong: no
``:``, no such module (where it was looked for), a module that fails to import (the
exception it raised), no such attribute (with the names of the module that would
fit). Each command prints it after its own name and exits with status 2.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable

from .._tools._tool import Tool

__all__ = ["SpecError", "import_spec", "is_function_of"]


class SpecError(ValueError):
    """A ``MODULE:NAME`` that names nothing; the message says what is wrong, starting
    with the option and the spec as the user gave them."""


def import_spec(
    spec: str,
    *,
    option: str = "",
    form: str = "MODULE:NAME",
    example: str,
    fits: Callable[[object, str], bool] | None = None,
    kind: str = "names",
) -> object:
    """The object that ``spec`` (``module:attribute``, the attribute dotted or not)
    names, imported with the current directory importable.

    ``option`` (``"--tool"``) and ``form`` and ``example`` word the messages; when the
    attribute is missing, the message lists the module's public names whose value
    ``fits`` (called with the value and the module's name), as ``its {kind}: ...``."""
    subject = f"{option} {spec!r}" if option else repr(spec)
    module_name, colon, attribute = spec.partition(":")
    module_name, attribute = module_name.strip(), attribute.strip()
    if not colon or not module_name or not attribute:
        raise SpecError(f"{subject}: expected {form}, e.g. {example}")
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)  # as `python -m` does: the user's modules are here
    importlib.invalidate_caches()  # a module written since the last import is found
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(f"{missing}.")):
            raise SpecError(
                f"{subject}: cannot import module {module_name!r}: no module named "
                f"{missing!r} in the current directory ({here}) nor among the installed "
                "packages"
            ) from None
        raise SpecError(f"{subject}: importing module {module_name!r} failed: {exc}") from None
    except Exception as exc:
        raise SpecError(
            f"{subject}: importing module {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    found: object = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            listed = _listing(module, module_name, fits, kind)
            raise SpecError(
                f"{subject}: module {module_name!r} has no attribute {attribute!r}{listed}"
            )
        found = getattr(found, part)
    return found


def is_function_of(value: object, module_name: str) -> bool:
    """Whether ``value`` is a function (or a ``@tool`` of one) defined in ``module_name``:
    what ``--tool`` may name, listed when it names nothing."""
    fn = value.fn if isinstance(value, Tool) else value
    return inspect.isfunction(fn) and fn.__module__ == module_name


def _listing(
    module: object, module_name: str, fits: Callable[[object, str], bool] | None, kind: str
) -> str:
    if fits is None:
        return ""
    names = sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and fits(value, module_name)
    )
    return f"; its {kind}: {', '.join(names)}" if names else ""
