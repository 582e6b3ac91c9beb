"""The events of the agent layer: one frozen Struct per kind, defined here once.

Each class is a kind of event an execution of an agent emits, tagged with the
kind's name (``ToolStart`` is ``"tool_start"``), its fields typed; the kernel
defines the envelope (``fractor.runtime.Event``), the base (``EventDetail``) and its
own kinds (``ActorStop``), and knows none of these. It is the one vocabulary: the bus
carries these classes, a stream of an ask yields the bus's events themselves (which
kinds, each class says: ``streamed``), the wire from a host decodes them (``Details``),
and OpenTelemetry, the live view's and the web view's lines and ``fractor run``
dispatch on them; ``tests/actors/observation/test_events.py`` sends one event of every kind of
``Details`` through each of them.

``agent_event`` is the one place an agent's event is built (the execution's ``emit``
calls it), from a kind's name and its fields or from a detail made already.

Adding a kind: its class here (saying whether a stream yields it, ``streamed``; in
``Details`` and ``__all__``: ``fractor.actors`` exports what ``__all__`` lists), and
its emit site (``execution.emit(TheKind(...))``), and a test. Every consumer shows a
kind it has no words for from its fields (a span event ``fractor.<kind>``; a line
``kind field=value``; ``fractor run``'s note ``[kind field=value]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, TypeAlias

from msgspec.structs import force_setattr

from fractor.runtime import ActorStop, Event, EventDetail

from .._messages import Message, ModelResponse, Status

#: The kinds, one class each: what ``fractor.actors`` exports of this module (its
#: ``DETAILS``, ``Details``, ``WireEvent`` and ``agent_event`` are the package's own).
__all__ = [
    "ApprovalAsked",
    "ApprovalDecision",
    "BudgetResume",
    "BudgetWait",
    "CompactionEnd",
    "DeadlineReached",
    "ExecutionEnd",
    "ExecutionStart",
    "LimitReached",
    "ModelText",
    "RateResume",
    "RateWait",
    "Refused",
    "RequestEnd",
    "RequestStart",
    "Restart",
    "Retry",
    "Spawn",
    "StepEnd",
    "StepStart",
    "ToolEnd",
    "ToolProgress",
    "ToolStart",
]


class ExecutionStart(EventDetail, frozen=True, kw_only=True, tag="execution_start"):
    """An execution starts: its task (the first 200 characters)."""

    streamed = "subagents"

    task: str
    #: The key of the task handed in from outside, when it was (``EventBus.on_task``).
    caller: str = ""
    #: The task's images and documents, each as its one line (``describe_part``).
    parts: tuple[str, ...] = ()


class ExecutionEnd(EventDetail, frozen=True, kw_only=True, tag="execution_end"):
    """An execution ended: how, after how many steps and tokens, with what answer
    (the first 200 characters)."""

    streamed = "subagents"

    status: Status
    reason: str
    steps: int
    tokens: int
    answer: str = ""
    #: The answer's images and documents, each as its one line (``describe_part``).
    parts: tuple[str, ...] = ()


class Refused(EventDetail, frozen=True, kw_only=True, tag="refused"):
    """A task refused before it started (a depth or agents limit)."""

    streamed = "never"

    reason: str
    caller: str = ""


class StepStart(EventDetail, frozen=True, kw_only=True, tag="step_start"):
    """A step (a model request and the tool calls it asks for) starts."""

    streamed = "never"

    step: int


class StepEnd(EventDetail, frozen=True, kw_only=True, tag="step_end"):
    """A step ended: the tools it called, its tokens and seconds."""

    streamed = "never"

    step: int
    tool_calls: tuple[str, ...] = ()
    tokens: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.tool_calls.__class__ is not tuple:  # given as a list
            force_setattr(self, "tool_calls", tuple(self.tool_calls))


class ModelText(EventDetail, frozen=True, kw_only=True, tag="text"):
    """A piece of the model's text (a stream's delta, or a response's whole text)."""

    streamed = "asked"

    text: str
    step: int = 0


class RequestStart(EventDetail, frozen=True, kw_only=True, tag="request_start"):
    """A model request is sent (attempt 1, 2, ...)."""

    streamed = "never"

    step: int
    attempt: int
    model: str
    purpose: str = "step"
    #: The request's messages, as a reference, while an observer records contents
    #: (``EventBus.contents``).
    messages: tuple[Message, ...] | None = None


class RequestEnd(EventDetail, frozen=True, kw_only=True, tag="request_end"):
    """A model request answered (or failed: ``error``)."""

    streamed = "never"

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    #: The model the provider says answered.
    response_model: str = ""
    #: The tool calls it asks for, (id, name).
    tool_calls: tuple[tuple[str, str], ...] = ()
    error: str = ""
    #: The response, as a reference, while an observer records contents.
    response: ModelResponse | None = None

    def __post_init__(self) -> None:
        calls = self.tool_calls
        if calls.__class__ is not tuple or any(call.__class__ is not tuple for call in calls):
            force_setattr(self, "tool_calls", tuple((str(i), str(n)) for i, n in calls))


class ToolStart(EventDetail, frozen=True, kw_only=True, tag="tool_start"):
    """A tool call starts: its JSON arguments (the first 200 characters)."""

    streamed = "asked"

    tool: str
    call_id: str
    arguments: str = ""


class ToolProgress(EventDetail, frozen=True, kw_only=True, tag="tool_progress"):
    """What a running tool reported of its progress (an MCP server's progress
    notifications), between its ``ToolStart`` and its ``ToolEnd``."""

    streamed = "asked"

    tool: str
    call_id: str
    progress: float
    total: float | None = None
    message: str = ""


class ToolEnd(EventDetail, frozen=True, kw_only=True, tag="tool_end"):
    """A tool call ended: its result (the first 200 characters)."""

    streamed = "asked"

    tool: str
    call_id: str
    is_error: bool = False
    seconds: float = 0.0
    result: str = ""
    #: Answered from an earlier attempt's outcome, not run again.
    reused: bool = False
    #: The result's images and documents, each as its one line (``describe_part``).
    parts: tuple[str, ...] = ()


class Spawn(EventDetail, frozen=True, kw_only=True, tag="spawn"):
    """A subagent call starts its child (``host``: where, if on a host)."""

    streamed = "never"

    child: str
    child_id: str
    call_id: str = ""
    task: str = ""


class Retry(EventDetail, frozen=True, kw_only=True, tag="retry"):
    """A model request (or an answer that did not parse) is tried again."""

    streamed = "asked"

    attempt: int
    error: str
    delay: float = 0.0


class Restart(EventDetail, frozen=True, kw_only=True, tag="restart"):
    """A failed execution runs again (``digest``: it reads a digest of the earlier
    attempts), or a lost host's subtree is placed again (``host``)."""

    streamed = "asked"

    reason: str
    restarts: int
    digest: bool = False


class CompactionEnd(EventDetail, frozen=True, kw_only=True, tag="compaction"):
    """The agent folded old turns into its summary (``ok``), or failed to (``error``)."""

    streamed = "asked"

    ok: bool
    turns: int
    covered: int
    input_tokens: int = 0
    output_tokens: int = 0
    error: str = ""


class BudgetWait(EventDetail, frozen=True, kw_only=True, tag="budget_wait"):
    """A request waits for budget others hold."""

    streamed = "asked"

    reason: str


class BudgetResume(EventDetail, frozen=True, kw_only=True, tag="budget_resume"):
    """A request that waited for budget goes on, after ``seconds``."""

    streamed = "asked"

    seconds: float


class RateWait(EventDetail, frozen=True, kw_only=True, tag="rate_wait"):
    """A request waits for room in its model's rate limits (``lane``: the model)."""

    streamed = "never"

    lane: str
    reason: str


class RateResume(EventDetail, frozen=True, kw_only=True, tag="rate_resume"):
    """A request that waited for a rate limit goes on, after ``seconds``."""

    streamed = "never"

    lane: str
    seconds: float


class LimitReached(EventDetail, frozen=True, kw_only=True, tag="budget_exceeded"):
    """A budget limit stopped the execution."""

    streamed = "asked"
    #: What the execution ends as.
    status: ClassVar[Status] = "budget_exceeded"

    reason: str


class DeadlineReached(EventDetail, frozen=True, kw_only=True, tag="deadline"):
    """The deadline stopped the execution."""

    streamed = "asked"
    #: What the execution ends as.
    status: ClassVar[Status] = "timed_out"

    reason: str


class ApprovalAsked(EventDetail, frozen=True, kw_only=True, tag="approval_request"):
    """A tool call waits for a person's decision (``ApprovalRequest``): it asks
    something of whoever observes, so no observer ever drops it."""

    streamed = "always"

    asks: ClassVar[bool] = True

    id: str
    tool: str
    call_id: str
    arguments: str = ""
    #: The agents from the top-level agent down to the one that asks.
    path: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.path.__class__ is not tuple:  # given as a list
            force_setattr(self, "path", tuple(self.path))


class ApprovalDecision(EventDetail, frozen=True, kw_only=True, tag="approval_decision"):
    """A held tool call was approved or denied, after ``waited`` seconds."""

    streamed = "always"

    id: str
    tool: str
    call_id: str
    approved: bool
    reason: str = ""
    waited: float = 0.0


#: Every kind of detail an event of an agent's tree may carry: the kernel's and the
#: agent layer's (what the wire decodes an event's detail as).
Details: TypeAlias = (
    ActorStop
    | ExecutionStart
    | ExecutionEnd
    | Refused
    | StepStart
    | StepEnd
    | ModelText
    | RequestStart
    | RequestEnd
    | ToolStart
    | ToolProgress
    | ToolEnd
    | Spawn
    | Retry
    | Restart
    | CompactionEnd
    | BudgetWait
    | BudgetResume
    | RateWait
    | RateResume
    | LimitReached
    | DeadlineReached
    | ApprovalAsked
    | ApprovalDecision
)

#: Each detail class by its kind's name (built once).
DETAILS: dict[str, type[EventDetail]] = {cls.kind: cls for cls in Details.__args__}


#: An event as the wire from a host decodes it: its detail any of ``Details`` (a bare
#: ``Event`` names the base alone, which knows no kind). For type checkers, any
#: ``Event`` (a host sends the events it made, of any kind).
if TYPE_CHECKING:
    WireEvent: TypeAlias = Event
else:
    WireEvent = Event[Details]


def agent_event(
    detail: EventDetail,
    *,
    at: float,
    agent: str,
    agent_id: str,
    execution_id: str,
    parent_id: str,
    depth: int,
) -> Event:
    """One event of an execution of ``agent``, its ``detail`` made where it happened
    (``ToolStart(tool=..., call_id=...)``; a detail from a kind's name and fields is
    the kernel's ``make_detail``, as ``EventBus.emit`` does)."""
    return Event(
        at=at,
        agent=agent,
        agent_id=agent_id,
        execution_id=execution_id,
        parent_id=parent_id,
        depth=depth,
        detail=detail,
    )
