"""From a typed Python function to a tool's JSON schema (used by ``@tool``).

Read once, at decoration time: the name (checked against what provider APIs accept),
the description (the docstring's text before its first Google-style section), and the
arguments as a msgspec Struct built from the signature, with descriptions from the
docstring's ``Args:`` section. Anything a schema cannot be built for fails here, with
``ToolDefinitionError``, naming what is wrong and what is expected.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import typing
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from fractor.runtime import FractorError

__all__ = [
    "ToolDefinitionError",
    "build_arguments",
    "check_options",
    "describe",
    "introspect",
    "parse_docstring",
]

#: Smallest allowed ``max_result_chars``: room for some text and the truncation marker.
MIN_RESULT_CHARS = 100

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# The generated argument Structs live in their own (virtual) module, so that their
# names never collide with a user's type of the same name inside one JSON schema.
_ARGUMENTS_MODULE = "fractor.actors._tools.arguments"
_ARG_SECTIONS = frozenset(
    {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"}
)
_OTHER_SECTIONS = frozenset(
    {
        "returns",
        "return",
        "yields",
        "yield",
        "raises",
        "example",
        "examples",
        "note",
        "notes",
        "attributes",
        "see also",
        "todo",
        "warning",
        "warnings",
        "references",
    }
)
_ARG_ENTRY = re.compile(r"\*{0,2}(?P<name>\w+)\s*(?:\([^)]*\))?\s*:(?P<text>.*)")
_SUPPORTED_TYPES = (
    "str, int, float, bool, None, list, tuple, dict, set, Literal, Enum, datetime, "
    "unions of those, msgspec.Struct, dataclass or TypedDict"
)


class ToolDefinitionError(FractorError, TypeError):
    """A function cannot become a tool, or a set of tools cannot form a toolbox.

    Raised at decoration (or toolbox construction) time, never while a tool runs.
    """

    def __init__(self, subject: str, problem: str, expected: str) -> None:
        super().__init__(f"{subject}: {problem}; {expected}")
        self.subject = subject
        self.problem = problem
        self.expected = expected


def describe(fn: object) -> str:
    """How errors name the thing being turned into a tool."""
    if isinstance(fn, functools.partial):
        return f"partial of {describe(fn.func)}"
    qualname = getattr(fn, "__qualname__", None)
    if inspect.isroutine(fn) and isinstance(qualname, str):
        return f"function {getattr(fn, '__module__', '?')}.{qualname}"
    return f"{fn!r} ({type(fn).__qualname__})"


def check_options(
    subject: str,
    *,
    name: object,
    timeout: object,
    retries: object,
    retry_delay: object,
    max_result_chars: object,
    limiter: object,
) -> None:
    """Refuse option values that cannot work, naming the option and what it accepts."""

    def is_number(value: object) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problem = "the name is empty" if name == "" else f"the name {name!r} is not valid"
        raise ToolDefinitionError(
            subject,
            problem,
            "a tool name is 1 to 64 characters among letters, digits, '_' and '-' "
            "(set it with @tool(name=...))",
        )
    # ``not value > 0`` also refuses NaN.
    if timeout is not None and (not is_number(timeout) or not timeout > 0):  # type: ignore[operator]
        raise ToolDefinitionError(
            subject,
            f"timeout={timeout!r} is not allowed",
            "timeout is a number of seconds greater than 0, or None for no timeout",
        )
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ToolDefinitionError(
            subject,
            f"retries={retries!r} is not allowed",
            "retries is a whole number of extra attempts, 0 or more",
        )
    if not is_number(retry_delay) or not 0 <= retry_delay < math.inf:  # type: ignore[operator]
        raise ToolDefinitionError(
            subject,
            f"retry_delay={retry_delay!r} is not allowed",
            "retry_delay is a finite number of seconds, 0 or more",
        )
    if (
        not isinstance(max_result_chars, int)
        or isinstance(max_result_chars, bool)
        or max_result_chars < MIN_RESULT_CHARS
    ):
        raise ToolDefinitionError(
            subject,
            f"max_result_chars={max_result_chars!r} is not allowed",
            f"max_result_chars is a whole number of at least {MIN_RESULT_CHARS}",
        )
    if limiter is not None and not isinstance(limiter, anyio.CapacityLimiter):
        raise ToolDefinitionError(
            subject,
            f"limiter={limiter!r} is not an anyio.CapacityLimiter",
            "limiter is an anyio.CapacityLimiter, or None for anyio's default thread limiter",
        )


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description and the per-parameter descriptions of a Google-style docstring.

    The description is the text before the first section header, whitespace
    normalised. Entries of an ``Args:`` section look like ``name: text`` or
    ``name (type): text``; lines indented further continue the entry above.
    """
    summary: list[str] = []
    params: dict[str, list[str]] = {}
    section = ""  # "" before any section, then "args" or "other"
    entry_indent = -1
    current: list[str] | None = None
    for line in inspect.cleandoc(doc).splitlines():
        text = line.strip()
        if not text:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0 and text.endswith(":"):
            header = " ".join(text[:-1].split()).lower()
            if header in _ARG_SECTIONS or header in _OTHER_SECTIONS:
                section = "args" if header in _ARG_SECTIONS else "other"
                entry_indent, current = -1, None
                continue
        if section == "":
            summary.append(text)
        elif section == "args":
            if indent == 0:
                section, current = "other", None  # text after the section ends it
                continue
            if entry_indent < 0:
                entry_indent = indent
            entry = _ARG_ENTRY.fullmatch(text) if indent <= entry_indent else None
            if entry is not None:
                current = params.setdefault(entry["name"], [])
                current.append(entry["text"])
            elif current is not None:
                current.append(text)
    described = {name: " ".join(" ".join(parts).split()) for name, parts in params.items()}
    return " ".join(" ".join(summary).split()), {k: v for k, v in described.items() if v}


def _has_description(annotation: object) -> bool:
    if typing.get_origin(annotation) is not typing.Annotated:
        return False
    return any(
        isinstance(meta, msgspec.Meta) and meta.description is not None
        for meta in getattr(annotation, "__metadata__", ())
    )


def introspect(fn: Callable[..., Any]) -> tuple[Callable[..., Any], str | None, str]:
    """What to read type hints from, the docstring, and the default tool name."""
    if isinstance(fn, functools.partial):
        inner: Callable[..., Any] = fn
        while isinstance(inner, functools.partial):
            inner = inner.func
        return inner, inspect.getdoc(inner), getattr(inner, "__name__", "")
    if inspect.isroutine(fn):
        return fn, inspect.getdoc(fn), getattr(fn, "__name__", "")
    call = type(fn).__call__
    return call, inspect.getdoc(call) or inspect.getdoc(fn), type(fn).__name__


def _annotated(annotation: object, description: str) -> object:
    annotated: Any = typing.Annotated
    return annotated[annotation, msgspec.Meta(description=description)]


def build_arguments(
    fn: Callable[..., Any],
    subject: str,
    name: str,
    hints_source: Callable[..., Any],
    param_docs: dict[str, str],
) -> tuple[type[msgspec.Struct], dict[str, Any]]:
    """The Struct of the tool's arguments and its JSON schema, inlined at the top."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(
            subject,
            f"its signature cannot be read ({exc})",
            "decorate a plain function, method or callable object with a Python signature",
        ) from None
    try:
        hints = typing.get_type_hints(hints_source, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(
            subject,
            f"its type annotations cannot be resolved ({type(exc).__name__}: {exc})",
            "every annotation must name a type importable from the function's module",
        ) from None

    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for param in signature.parameters.values():
        if param.kind is param.VAR_POSITIONAL or param.kind is param.VAR_KEYWORD:
            stars = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise ToolDefinitionError(
                subject,
                f"parameter '{stars}{param.name}' takes a variable number of arguments",
                "a tool takes named parameters only, since the model sends one JSON object",
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                subject,
                f"parameter {param.name!r} is positional-only",
                "tool parameters are passed by keyword: remove the '/' from the signature",
            )
        if param.annotation is param.empty or param.name not in hints:
            raise ToolDefinitionError(
                subject,
                f"parameter {param.name!r} has no type annotation",
                f"annotate every parameter (e.g. '{param.name}: str') so that its JSON "
                "schema can be built",
            )
        annotation: object = hints[param.name]
        try:
            msgspec.json.schema(annotation)
        except Exception as exc:
            raise ToolDefinitionError(
                subject,
                f"msgspec cannot build a JSON schema for parameter {param.name!r} of type "
                f"{annotation!r} ({' '.join(str(exc).split())})",
                f"use JSON-friendly types: {_SUPPORTED_TYPES}",
            ) from None
        description = param_docs.get(param.name)
        if description and not _has_description(annotation):
            annotation = _annotated(annotation, description)
        if param.default is param.empty:
            fields.append((param.name, annotation))
        else:
            fields.append((param.name, annotation, param.default))

    try:
        struct = msgspec.defstruct(
            name, fields, kw_only=True, forbid_unknown_fields=True, module=_ARGUMENTS_MODULE
        )
        # Through JSON and back: plain JSON data only (a tuple default becomes a list).
        schema = msgspec.json.decode(msgspec.json.encode(msgspec.json.schema(struct)))
        # Fails on types such as unions of several untagged Structs.
        msgspec.json.Decoder(struct)
    except Exception as exc:
        raise ToolDefinitionError(
            subject,
            f"msgspec cannot build a JSON schema or a decoder for its parameters "
            f"({' '.join(str(exc).split())})",
            f"use JSON-friendly types: {_SUPPORTED_TYPES}; a default must be "
            "immutable (a tuple rather than a non-empty list)",
        ) from None

    defs: dict[str, Any] = dict(schema["$defs"])
    top: dict[str, Any] = dict(defs.pop(schema["$ref"].removeprefix("#/$defs/")))
    top.pop("title", None)
    top.pop("description", None)
    if defs:
        top["$defs"] = defs
    return struct, top
