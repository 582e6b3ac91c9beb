"""``Agent``: the immutable definition of an agent, checked when it is made.

``Runtime.spawn(agent)`` runs a definition as an ``AgentActor`` (``actors._agent_actor``:
the running agent, its conversation and traces) and hands back an ``AgentRef``
(``actors._agent_ref``: the handle, and the questions it asks the actor). Both are
re-exported here. A definition is what gets shipped to another host: it pickles as
the arguments it was made with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

from fractor.runtime import ActorRef, Budget

from ._agent_actor import AgentActor
from ._agent_ref import AgentRef, GetConversation, GetProgress, GetTrace
from ._approval import ApprovalPolicy, approver
from ._execution import StopCondition
from ._memory import Compaction
from ._messages import Task, ToolCall, ToolSpec, safe_text
from ._models import Model
from ._output import FINAL_ANSWER, OutputMode, OutputSpec, output_spec
from ._policy import RestartPolicy, RetryPolicy
from ._toolbox import Toolbox, Toolset, is_toolset
from ._tools import Tool, tool

__all__ = [
    "Agent",
    "AgentActor",
    "AgentRef",
    "GetConversation",
    "GetProgress",
    "GetTrace",
    "Task",
]

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class Agent:
    """An immutable agent definition; ``Runtime.spawn`` turns it into a running actor.

    ``tools`` are ``@tool`` functions (a plain function is wrapped with ``tool``).
    ``subagents`` are other agents offered to the model as tools (name, description,
    one ``task`` argument); each call runs the subagent as a child actor and returns
    only its final response. ``budget`` limits each execution, descendants included.
    ``tool_concurrency`` bounds how many tool calls of one step run at once, and
    how many subagents (counted apart: a step may run that many of each).
    ``stop_when`` is called with each step's record after its tools ran; returning
    True ends the execution. ``max_tokens`` caps each model request's output (the
    supervisor may cap it lower). ``retry`` and ``restart`` are the supervision
    policies; ``escalate`` makes a failure of this agent, run as a subagent, fail its
    parent too. ``trace_limit`` is how many execution traces the actor keeps.
    ``host`` names a pool of the runtime's hosts (``Runtime(hosts=...)``): each
    execution of this agent as a subagent runs there, with its whole subtree (by
    default the runtime's placement decides: see ``actors._hosts``).
    ``output_type`` asks for a typed answer (a msgspec Struct, a dataclass, a
    TypedDict or a scalar): ``Result.output`` holds it, ``Result.text`` its JSON;
    ``output_mode`` says how the model is asked for it (``"native"``: the provider's
    structured output; ``"tool"``: a final-answer tool; ``"text"``: instructions and
    a parse; ``"auto"``: the best the model has), and ``output_retries`` how many bad
    answers go back to the model before the execution fails. ``approval`` names the
    tool calls a person must approve first (tool names, or a function of the call;
    ``@tool(approval=True)`` marks a tool itself): see ``AgentRef.approve``.
    ``memory`` folds old turns of a long conversation into a summary
    (``Compaction``: when, how many turns stay, which model summarizes).
    """

    name: str
    model: Model
    tools: Sequence[Tool[..., Any] | Callable[..., Any] | Toolset] = ()
    instructions: str = ""
    subagents: Sequence[Agent] = ()
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
    toolbox: Toolbox = field(init=False, repr=False, compare=False)
    specs: tuple[ToolSpec, ...] = field(init=False, repr=False, compare=False)
    subagents_by_name: dict[str, Agent] = field(init=False, repr=False, compare=False)
    #: The ``Toolset`` entries of ``tools``: resolved when the agent is spawned.
    toolsets: tuple[Toolset, ...] = field(init=False, repr=False, compare=False)
    #: Whether a call needs approval (the ``approval`` policy and the tools marked
    #: so); None when no call of this agent ever does.
    approve: Callable[[ToolCall], bool] | None = field(init=False, repr=False, compare=False)
    #: The typed answer derived from ``output_type`` and its options (see
    #: ``actors._output``); None without an ``output_type``.
    output_spec: OutputSpec | None = field(init=False, repr=False, compare=False)

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
        by_name: dict[str, Agent] = {}
        for subagent in subagents:
            if not isinstance(subagent, Agent):
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

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the arguments it was made with (for an agent shipped to another
        host, as Ray ships code): what ``__post_init__`` derives is derived again."""
        arguments = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return (_rebuilt_agent, (arguments,))

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
            if isinstance(value, str | Agent) or callable(value) or not isinstance(value, Iterable):
                raise TypeError(
                    f"{prefix} {option} must be a sequence (a list or a tuple), "
                    f"got {type(value).__qualname__}; write {option}=[...]"
                )

    # Spawnable
    def new_actor(self) -> AgentActor:
        return AgentActor(self)

    def make_ref(self, ref: ActorRef) -> AgentRef:
        return AgentRef(ref, self)


def _rebuilt_agent(arguments: dict[str, Any]) -> Agent:
    """An agent again, from what ``Agent.__reduce__`` kept."""
    return Agent(**arguments)


def _subagent_spec(agent: Agent) -> ToolSpec:
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
