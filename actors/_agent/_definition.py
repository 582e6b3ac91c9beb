"""``AgentDefinition``: what an agent is, checked when it is made; the bottom of
the agent core.

The public ``Agent`` (``actors._agent._agent``) is this definition plus how the runtime
spawns it (``new_actor``, ``make_ref``: the kernel's ``Spawnable``). Everything that
runs a definition (``AgentActor``, ``Execution`` and its parts, ``AgentRef``) reads it
as an ``AgentDefinition``, and this module imports nothing of the running side: the
agent core's modules import one way, the definition below, the running agent above
it, ``Agent`` on top. ``StopCondition`` (the type of ``stop_when``) is written here
too, and ``with_toolsets``, which resolves a definition's toolsets in a runtime.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from fractor.runtime import Budget

from .._execution._output import FINAL_ANSWER, OutputMode, OutputSpec, output_spec
from .._memory._compaction import Compaction
from .._messages import StepRecord, ToolCall, ToolSpec, safe_text
from .._models._protocol import Model
from .._parts import ContentLimits
from .._requests import Requests, build
from .._tools._approval import ApprovalPolicy, approver
from .._tools._tool import Tool, tool
from .._tools._toolbox import Toolbox, Toolset, is_toolset
from ._policy import RestartPolicy, RetryPolicy

if TYPE_CHECKING:
    from fractor.runtime import Runtime

__all__ = ["AgentDefinition", "StopCondition", "with_toolsets"]

#: A user stop condition: called after each step that ran tools; True ends the execution.
StopCondition = Callable[[StepRecord], bool]

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class AgentDefinition:
    """What an agent is: its data, checked when it is made, and what is derived
    from it (see ``Agent``, the public class, which adds only how it is spawned).
    The running side (the actor, its executions, the ref) reads a definition as
    this class, so nothing below ``actors._agent._agent`` names ``Agent``."""

    name: str
    model: Model
    tools: Sequence[Tool[..., Any] | Callable[..., Any] | Toolset] = ()
    instructions: str = ""
    subagents: Sequence[AgentDefinition] = ()
    budget: Budget | None = None
    description: str = ""
    tool_concurrency: int = 256
    stop_when: StopCondition | None = None
    max_tokens: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    escalate: bool = False
    mailbox_size: int = 16
    trace_limit: int = 100
    host: str | None = None
    output_type: Any = None
    output_mode: OutputMode = "auto"
    output_retries: int = 2
    approval: ApprovalPolicy | None = None
    memory: Compaction | None = None
    content_limits: ContentLimits = field(default_factory=ContentLimits)
    toolbox: Toolbox = field(init=False, repr=False, compare=False)
    specs: tuple[ToolSpec, ...] = field(init=False, repr=False, compare=False)
    subagents_by_name: dict[str, AgentDefinition] = field(init=False, repr=False, compare=False)
    #: The ``Toolset`` entries of ``tools``: resolved when the agent is spawned.
    toolsets: tuple[Toolset, ...] = field(init=False, repr=False, compare=False)
    #: Whether a call needs approval (the ``approval`` policy and the tools marked
    #: so); None when no call of this agent ever does.
    approve: Callable[[ToolCall], bool] | None = field(init=False, repr=False, compare=False)
    #: The typed answer derived from ``output_type`` and its options (see
    #: ``actors._execution._output``); None without an ``output_type``.
    output_spec: OutputSpec | None = field(init=False, repr=False, compare=False)
    #: How its executions send model requests: the stages of its model, built
    #: once (``actors._requests.build``).
    requests: Requests = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"Agent name must be 1 to 64 letters, digits, '_' or '-', got {self.name!r}"
            )
        if not callable(getattr(self.model, "request", None)):
            raise TypeError(
                f"Agent {self.name!r}: model must implement the Model protocol "
                f"(an async request() method), got {type(self.model).__qualname__}"
            )
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise TypeError(f"Agent {self.name!r}: budget must be a fractor.Budget")
        for option in ("tool_concurrency", "mailbox_size", "trace_limit"):
            value = getattr(self, option)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Agent {self.name!r}: {option} must be >= 1, got {value!r}")
        if self.host is not None and (not isinstance(self.host, str) or not self.host):
            raise ValueError(
                f"Agent {self.name!r}: host must name a pool of hosts, got {self.host!r}"
            )
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 1
        ):
            raise ValueError(
                f"Agent {self.name!r}: max_tokens must be >= 1, got {self.max_tokens!r}"
            )
        self._check_types()
        if not isinstance(self.content_limits, ContentLimits):
            raise TypeError(
                f"Agent {self.name!r}: content_limits must be a fractor.ContentLimits, "
                f"got {type(self.content_limits).__qualname__}"
            )
        for option in ("instructions", "description"):  # text from outside: made safe
            object.__setattr__(self, option, safe_text(getattr(self, option)))
        entries = tuple(
            t if isinstance(t, Tool) or is_toolset(t) else tool(cast("Callable[..., Any]", t))
            for t in self.tools
        )
        tools = tuple(t for t in entries if isinstance(t, Tool))
        toolsets = tuple(t for t in entries if not isinstance(t, Tool))
        toolbox = Toolbox(tools)
        subagents = tuple(self.subagents)
        by_name: dict[str, AgentDefinition] = {}
        for subagent in subagents:
            if not isinstance(subagent, AgentDefinition):
                raise TypeError(
                    f"Agent {self.name!r}: subagents are Agent definitions, "
                    f"got {type(subagent).__qualname__}"
                )
            if subagent.name in toolbox or subagent.name in by_name:
                raise ValueError(
                    f"Agent {self.name!r}: the name {subagent.name!r} is used twice among "
                    "its tools and subagents; the model tells them apart by name"
                )
            by_name[subagent.name] = subagent
        object.__setattr__(self, "tools", entries)
        object.__setattr__(self, "subagents", subagents)
        object.__setattr__(self, "toolbox", toolbox)
        object.__setattr__(self, "subagents_by_name", by_name)
        object.__setattr__(self, "toolsets", toolsets)
        try:
            approve = approver(self.approval, [t.name for t in tools if t.approval])
        except TypeError as exc:
            raise TypeError(f"Agent {self.name!r}: {exc}") from None
        object.__setattr__(self, "approve", approve)
        output = output_spec(
            self.name, self.model, self.output_type, self.output_mode, self.output_retries
        )
        if (
            output is not None
            and output.tool is not None
            and (FINAL_ANSWER in toolbox or FINAL_ANSWER in by_name)
        ):
            raise ValueError(
                f"Agent {self.name!r}: the name {FINAL_ANSWER!r} is its typed answer's tool "
                "(output_mode='tool'); rename its tool or subagent of that name"
            )
        object.__setattr__(self, "output_spec", output)
        object.__setattr__(
            self, "specs", toolbox.specs + tuple(_subagent_spec(s) for s in subagents)
        )
        object.__setattr__(self, "requests", build(self.model, self.retry))

    def _check_types(self) -> None:
        """The options whose type alone can be wrong, each named with what it takes."""
        prefix = f"Agent {self.name!r}:"
        for option in ("instructions", "description"):
            value = getattr(self, option)
            if not isinstance(value, str):
                raise TypeError(f"{prefix} {option} must be a str, got {type(value).__qualname__}")
        if self.stop_when is not None and not callable(self.stop_when):
            raise TypeError(
                f"{prefix} stop_when must be a function of a step's record or None, "
                f"got {type(self.stop_when).__qualname__}"
            )
        for option, kind in (("retry", RetryPolicy), ("restart", RestartPolicy)):
            value = getattr(self, option)
            if not isinstance(value, kind):
                raise TypeError(
                    f"{prefix} {option} must be a fractor.{kind.__name__}, "
                    f"got {type(value).__qualname__}"
                )
        if self.memory is not None and not isinstance(self.memory, Compaction):
            raise TypeError(
                f"{prefix} memory must be a fractor.Compaction or None, "
                f"got {type(self.memory).__qualname__}"
            )
        if not isinstance(self.escalate, bool):
            raise TypeError(f"{prefix} escalate must be a bool, got {self.escalate!r}")
        for option in ("tools", "subagents"):
            value = getattr(self, option)
            if (
                isinstance(value, str | AgentDefinition)
                or callable(value)
                or not isinstance(value, Iterable)
            ):
                raise TypeError(
                    f"{prefix} {option} must be a sequence (a list or a tuple), "
                    f"got {type(value).__qualname__}; write {option}=[...]"
                )


def _subagent_spec(agent: AgentDefinition) -> ToolSpec:
    """A subagent as its parent's model sees it; one with an ``output_type`` says
    that it answers JSON, and the schema."""
    description = agent.description or agent.instructions or f"The {agent.name} agent."
    if agent.output_spec is not None:
        description += agent.output_spec.returns()
    return ToolSpec(
        name=agent.name,
        description=f"Delegate a task to the {agent.name} subagent: {description}",
        parameters={
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "What the subagent should do."}
            },
            "required": ["task"],
            "additionalProperties": False,
        },
    )


#: Agent definitions with their toolsets resolved, per runtime (by the definition's
#: identity; the definition is kept with it, so the identity stays its own).
_resolved: weakref.WeakKeyDictionary[
    Runtime, dict[int, tuple[AgentDefinition, AgentDefinition]]
] = weakref.WeakKeyDictionary()


async def with_toolsets(agent: AgentDefinition, runtime: Runtime) -> AgentDefinition:
    """``agent`` with each of its toolsets replaced by the tools it lists in
    ``runtime``; resolved once per runtime and definition (a subagent spawned a
    thousand times lists its server's tools once). The same class comes back (an
    ``Agent`` stays one)."""
    cache = _resolved.setdefault(runtime, {})
    found = cache.get(id(agent))
    if found is not None:
        return found[1]
    entries: list[Any] = []
    for entry in agent.tools:
        if isinstance(entry, Tool):
            entries.append(entry)
        else:
            entries.extend(await cast("Toolset", entry).tools(runtime))
    resolved = dataclasses.replace(agent, tools=tuple(entries))
    cache.setdefault(id(agent), (agent, resolved))
    return cache[id(agent)][1]
