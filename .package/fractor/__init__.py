"""fractor: an asynchronous, actor-style runtime for nested LLM agents.

``from fractor import Agent, Budget, Runtime, tool``: every public name of the two
layers is here, and each stays where it lives:

- ``fractor.runtime``, the kernel: actors, mailboxes, the supervisor and its
  budgets, events, stores. It knows nothing of LLMs.
- ``fractor.actors``, the agents built on it: ``Agent``, tools, models and
  providers (``fractor.actors.providers``), memory, hosts, and the integrations
  (``fractor.actors.integrations``: Ray, MCP, OpenTelemetry) and the command line
  (``fractor.actors.cli``).

Where the files are: this file is ``.package/fractor/__init__.py`` in the
repository, beside links to the top-level folders ``runtime/``, ``actors/`` and
``benchmarks/`` (``.package/fractor/runtime -> ../../runtime``, ...). The wheel
puts them under ``fractor/``; an editable install puts ``.package`` on the path.
Both are set in one place, ``pyproject.toml`` (``[tool.hatch.build.targets.wheel]``).
"""

import typing as _typing

from . import actors as actors
from . import runtime as runtime
from .actors import *  # noqa: F403 (the agents' public names, as __all__ lists them)
from .actors._observation._stream import old_name as _old_name
from .runtime import *  # noqa: F403 (the kernel's)

#: The installed distribution's version.
__version__: str = actors.__version__

__all__ = sorted({*actors.__all__, *runtime.__all__})

if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """The old names of the agents' layer (``fractor.TextDelta``), until the next
        release, each with a ``DeprecationWarning`` naming its new one."""
        return _old_name("fractor", name)
