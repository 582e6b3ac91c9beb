"""``Toolbox``: the tools of one agent definition, by name, and how a call finds its
tool (an unknown name is an error result the model reads, never an exception).

``Toolset``: tools known only once a runtime runs (an MCP server's, say), listed in
an agent's ``tools`` next to its own; the agent's actor resolves them when it is
spawned, once per runtime and definition (``AgentActor.on_start``, with
``actors._agent._definition.with_toolsets``). A toolset that cannot list its tools
now raises ``ToolsUnavailable``: the spawn goes on, and each execution lists them
again first, failing with the reason while they still cannot be.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fractor.runtime import FractorError

from .._messages import ToolCall, ToolOutcome, ToolSpec
from ._tool import DEFAULT_MAX_RESULT_CHARS, Tool, ToolDefinitionError, tool, truncate

if TYPE_CHECKING:
    from fractor.runtime import Runtime


__all__ = ["Toolbox", "ToolsUnavailable", "Toolset", "is_toolset"]


class ToolsUnavailable(FractorError, ConnectionError):
    """A ``Toolset`` cannot list its tools now (its server cannot be reached, is gone,
    or answered an error): says which toolset, and why. Not a mistake of the
    definition: an agent spawned with it starts, and its executions fail saying so
    until the tools can be listed."""


@runtime_checkable
class Toolset(Protocol):
    """Tools an agent gets from outside once a runtime runs: ``tools`` lists them,
    through whatever ``runtime`` holds for it (a connection, a process)."""

    async def tools(self, runtime: Runtime) -> Sequence[Tool[..., Any]]: ...


def is_toolset(entry: object) -> bool:
    """Whether an entry of an agent's ``tools`` is a ``Toolset`` (not a tool)."""
    return not isinstance(entry, Tool) and not callable(entry) and isinstance(entry, Toolset)


class Toolbox:
    """The tools of one agent definition, by unique name, in the order given.

    Plain callables are accepted too and wrapped with ``tool`` (default options).
    """

    __slots__ = ("_no_such_tool", "_tools", "direct", "names", "specs")

    def __init__(self, tools: Iterable[Tool[..., Any] | Callable[..., Any]] = ()) -> None:
        entries = [entry if isinstance(entry, Tool) else tool(entry) for entry in tools]
        names = [entry.name for entry in entries]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            listed = ", ".join(f"{name!r} ({names.count(name)} times)" for name in duplicates)
            raise ToolDefinitionError(
                "cannot build the toolbox",
                f"several tools have the same name: {listed}",
                "give every tool a unique name, e.g. with @tool(name=...)",
            )
        self._tools: dict[str, Tool[..., Any]] = {entry.name: entry for entry in entries}
        self.names: tuple[str, ...] = tuple(names)
        self.specs: tuple[ToolSpec, ...] = tuple(entry.spec for entry in entries)
        #: The tools a caller may await itself (see ``Tool.direct``), by name.
        self.direct: dict[str, Tool[..., Any]] = {e.name: e for e in entries if e.direct}
        self._no_such_tool = (
            f"; available tools: {', '.join(names)}" if names else "; this agent has no tools"
        )

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        return iter(self._tools.values())

    def __repr__(self) -> str:
        return f"Toolbox({', '.join(self.names)})"

    def get(self, name: str) -> Tool[..., Any] | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def run(self, call: ToolCall) -> Awaitable[ToolOutcome]:
        """Run ``call`` with the tool it names; never raises an ``Exception``.

        Not a coroutine of its own: it hands back the tool's, one frame less per call.
        """
        found = self._tools.get(call.name)
        if found is None:
            return self._unknown(call)
        return found.invoke(call)

    async def _unknown(self, call: ToolCall) -> ToolOutcome:
        content = f"unknown tool {call.name!r}{self._no_such_tool}"
        if len(content) > DEFAULT_MAX_RESULT_CHARS:
            content = truncate(content, DEFAULT_MAX_RESULT_CHARS)
        return ToolOutcome(call=call, content=content, is_error=True, seconds=0.0, attempts=0)
