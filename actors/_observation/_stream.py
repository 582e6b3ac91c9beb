"""Streaming an ask: the events of one execution's tree as they happen, then its
``Result`` (``AgentRef.stream``).

::

    async with ref.stream("What's the weather in Paris?") as run:
        async for event in run:
            match event:
                case TextDelta(text=text, depth=1):
                    print(text, end="", flush=True)
                case ToolCallStarted(tool=name):
                    print(f"\\n[{name}...]")
    print(run.result.status)

The stream yields typed events (frozen Structs, a tagged union on ``kind``):
``TextDelta`` (the model's text as it is generated), ``ToolCallStarted``,
``ToolCallProgress`` (what a running tool reports of its progress: an MCP server's)
and ``ToolCallFinished``, ``SubagentStarted`` and ``SubagentFinished``, ``BudgetWaiting``
and ``BudgetResumed``, ``Retrying`` (text after it starts over), ``Restarted`` (a
failed execution runs again), ``Compacted`` (old turns folded into the summary
first), ``Stopped`` (a budget limit or the deadline), and ``ApprovalRequested`` /
``ApprovalDecided`` (a tool call held for a person's decision: see ``_tools._approval``).
Each names its agent, its execution and its ``depth`` in the tree, counted from the
top as the tree counts it everywhere (``rt.tree()``, the runtime's events, an
``ApprovalRequest``): 1 for the agent asked (a top-level agent), 2 for its
subagents, and so on, wherever they run. By default the events of subagents are
their start and finish and their approvals only; ``subagents=True`` adds their
text, tool calls, waits and stops. The iteration ends once the execution has
answered; ``run.result`` is the same ``Result`` that ``ask`` returns.

How it works: the ask carries the name of a watcher (``Task.watch``); the execution's
node takes it, and every node opened below inherits it (``runtime.Node.watch``), so
the events of this tree, and only these, reach the stream, whether or not anyone
subscribes to the runtime's events. They wait in a bounded buffer: a slow consumer
never stalls the agents. While the consumer is behind, consecutive text pieces of one
execution merge into one event (no text is lost); once the buffer is full, other
events are dropped and counted in ``run.missed``, except those that ask something
of the consumer (``runtime.Event.asks``: an ``ApprovalRequested``), which are
always shown.

Leaving the block before the answer stops the execution (and its subtree), and
waits briefly for its answer: ``run.result`` then says so (``cancelled``). A task
its agent has not taken yet (it waits in the mailbox behind others, or the agent
has not run since) never starts: the agent takes the stream's watcher out of the
runtime's ``watchers`` with the task, so whichever of the two comes first decides;
``run.result`` is then at once the answer ``withdrawn`` makes (``cancelled``: "The
task was not started"), and nothing of the task joins the conversation, the traces
or the store.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Literal, TypeAlias

import anyio
import msgspec

from fractor.runtime import ActorStop, Event, EventDetail, Usage

from .._messages import Result, Status, Task
from ._events import (
    ApprovalAsked,
    ApprovalDecision,
    BudgetResume,
    BudgetWait,
    CompactionEnd,
    DeadlineReached,
    ExecutionEnd,
    ExecutionStart,
    LimitReached,
    ModelText,
    RateResume,
    RateWait,
    Refused,
    RequestEnd,
    RequestStart,
    Restart,
    Retry,
    Spawn,
    StepEnd,
    StepStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
)

if TYPE_CHECKING:
    from fractor.runtime import ActorRef, PendingReply

__all__ = [
    "AgentStream",
    "ApprovalDecided",
    "ApprovalRequested",
    "BudgetResumed",
    "BudgetWaiting",
    "Compacted",
    "Restarted",
    "Retrying",
    "Stopped",
    "StreamEvent",
    "SubagentFinished",
    "SubagentStarted",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallProgress",
    "ToolCallStarted",
    "withdrawn",
]

#: How long leaving a stream early waits for the stopped execution's answer.
_STOP_WAIT = 5.0
_keys = itertools.count(1)


class _Base(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    #: The agent whose execution this is about.
    agent: str
    execution_id: str
    #: Its depth in the tree, from the top as the tree counts it: 1 for the agent
    #: asked (a top-level agent), 2 for its subagents...
    depth: int
    #: Seconds since the runtime started.
    at: float


class TextDelta(_Base, frozen=True, kw_only=True, tag="text"):
    """A piece of the model's text, as it is generated (``step``: which step's
    request; the text of a step that calls tools is trace, not the answer)."""

    text: str
    step: int = 0


class ToolCallStarted(_Base, frozen=True, kw_only=True, tag="tool_start"):
    tool: str
    call_id: str
    #: The call's JSON arguments (the first 200 characters).
    arguments: str = ""


class ToolCallProgress(_Base, frozen=True, kw_only=True, tag="tool_progress"):
    """What a running tool reported of its progress (an MCP server's progress
    notifications): ``progress`` out of ``total`` (None: not known), and a message."""

    tool: str
    call_id: str
    progress: float
    total: float | None = None
    message: str = ""


class ToolCallFinished(_Base, frozen=True, kw_only=True, tag="tool_end"):
    tool: str
    call_id: str
    is_error: bool
    #: The result (the first 200 characters).
    result: str = ""
    seconds: float = 0.0
    #: The images and documents it returned, a line each (``describe_part``).
    parts: tuple[str, ...] = ()


class SubagentStarted(_Base, frozen=True, kw_only=True, tag="subagent_start"):
    """A subagent's execution began (``parent_id``: the execution that called it)."""

    parent_id: str
    task: str = ""


class SubagentFinished(_Base, frozen=True, kw_only=True, tag="subagent_end"):
    status: Status
    reason: str = ""


class BudgetWaiting(_Base, frozen=True, kw_only=True, tag="budget_wait"):
    """A model request waits for headroom that requests in flight hold."""

    reason: str


class BudgetResumed(_Base, frozen=True, kw_only=True, tag="budget_resume"):
    seconds: float


class Retrying(_Base, frozen=True, kw_only=True, tag="retry"):
    """A model request is sent again; its text streams again from the start."""

    attempt: int
    error: str
    delay: float = 0.0


class ApprovalRequested(_Base, frozen=True, kw_only=True, tag="approval_request"):
    """A tool call waits for a person's decision: answer it with the ref of the agent
    asked, ``ref.approve(id)`` or ``ref.deny(id, reason)``. Shown at every depth.
    ``path`` names the agents from the top-level agent down to the one that asked,
    as its ``ApprovalRequest`` does (and ``depth`` is its ``depth``)."""

    id: str
    tool: str
    call_id: str
    arguments: str = ""
    path: tuple[str, ...] = ()


class ApprovalDecided(_Base, frozen=True, kw_only=True, tag="approval_decision"):
    id: str
    tool: str
    call_id: str
    approved: bool
    reason: str = ""
    waited: float = 0.0


class Restarted(_Base, frozen=True, kw_only=True, tag="restart"):
    """The execution failed and runs again (``RestartPolicy``): its text starts over;
    ``digest``: the new attempt reads a digest of the earlier ones."""

    restarts: int
    reason: str
    digest: bool = False


class Compacted(_Base, frozen=True, kw_only=True, tag="compaction"):
    """The agent folded its oldest turns into its summary before this execution
    (``Agent(memory=...)``); ``ok`` False: nothing was folded, ``error`` says why."""

    ok: bool
    turns: int
    covered: int
    error: str = ""


class Stopped(_Base, frozen=True, kw_only=True, tag="stopped"):
    """A budget limit or the deadline stopped this execution."""

    status: Literal["budget_exceeded", "timed_out"]
    reason: str


StreamEvent: TypeAlias = (
    ApprovalDecided
    | ApprovalRequested
    | TextDelta
    | ToolCallStarted
    | ToolCallProgress
    | ToolCallFinished
    | SubagentStarted
    | SubagentFinished
    | BudgetWaiting
    | BudgetResumed
    | Retrying
    | Restarted
    | Compacted
    | Stopped
)


class AgentStream:
    """One streamed ask: an async context manager, then an async iterator of
    ``StreamEvent``; ``result`` once the iteration has ended (see the module)."""

    __slots__ = (
        "_buffer",
        "_closed",
        "_error",
        "_events",
        "_key",
        "_ref",
        "_reply",
        "_result",
        "_root",
        "_root_depth",
        "_subagents",
        "_task",
        "_wake",
        "missed",
    )

    def __init__(self, ref: ActorRef, task: Task, *, subagents: bool, buffer: int) -> None:
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise ValueError(f"buffer must be a whole number >= 1, got {buffer!r}")
        if not isinstance(subagents, bool):
            raise TypeError(f"subagents must be a bool, got {subagents!r}")
        self._ref = ref
        self._key = f"stream-{next(_keys)}"
        self._task = msgspec.structs.replace(task, watch=self._key)
        self._subagents = subagents
        self._buffer = buffer
        self._events: deque[StreamEvent] = deque()
        self._wake: anyio.Event | None = None
        self._reply: PendingReply | None = None
        self._result: Result | None = None
        self._error: BaseException | None = None
        self._root = ""
        self._root_depth = 0
        self._closed = False
        #: Events dropped because the buffer was full (text is merged, never dropped).
        self.missed = 0

    @property
    def result(self) -> Result:
        """The execution's ``Result``, once the iteration has ended (or the block was
        left: then it says how the task was stopped, or that it never started)."""
        if self._error is not None:
            raise self._error
        if self._result is None:
            if self._closed:
                raise RuntimeError(
                    f"the stream was left and its task's answer did not come within "
                    f"{_STOP_WAIT:g} s of the stop: there is no result"
                )
            raise RuntimeError(
                "the stream has not ended yet: iterate it to the end (async for) first"
            )
        return self._result

    async def __aenter__(self) -> AgentStream:
        watchers = self._ref.runtime.event_bus.watchers
        watchers[self._key] = self._watch
        try:
            reply = await self._ref.ask_pending(self._task)
        except BaseException:
            del watchers[self._key]
            raise
        self._reply = reply
        reply.add_done_callback(self._answered)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        reply = self._reply
        if reply is None or reply.done():
            if reply is not None and self._result is None and self._error is None:
                self._take(reply)
            self._close()
            return
        # Left before the answer.
        self._closed = True
        if self._ref.runtime.event_bus.watchers.pop(self._key, None) is not None:
            # Its agent has not taken the task (it waits in the mailbox): it never
            # starts, and leaves nothing (the agent takes the watcher with the task).
            self._result = withdrawn(self._ref.id)
            self._events.clear()
            return
        # Taken: stop the execution (at once if it began, else as it begins: see
        # ``_watch``), and wait (a little) for its answer.
        if self._root:
            self._stop(self._root)
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(_STOP_WAIT),
            contextlib.suppress(Exception),  # an error answer is taken below
        ):
            await reply.wait()
        if reply.done():
            self._take(reply)
        self._close()

    def __aiter__(self) -> AgentStream:
        return self

    async def __anext__(self) -> StreamEvent:
        reply = self._reply
        if reply is None:
            raise RuntimeError("use the stream as an async context manager first (async with)")
        while True:
            if self._events:
                return self._events.popleft()
            if reply.done():
                self._take(reply)
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._wake = wake = anyio.Event()
            await wake.wait()

    # -- what the execution's tree reports, in the actors' tasks: never waits ---------

    def _watch(self, event: Event) -> None:
        if not self._root:
            if type(event.detail) is not ExecutionStart:
                return
            self._root, self._root_depth = event.execution_id, event.depth
            if self._closed:  # left once its agent took it, before it began: stop it now
                self._stop(event.execution_id)
                return
        if self._closed:
            return
        converted = self._convert(event)
        if converted is None:
            return
        events = self._events
        if type(converted) is TextDelta and events:
            last = events[-1]
            if (
                type(last) is TextDelta
                and last.execution_id == converted.execution_id
                and last.step == converted.step
            ):
                events[-1] = msgspec.structs.replace(last, text=last.text + converted.text)
                return
        if (
            len(events) >= self._buffer
            and (type(converted) is not TextDelta or len(events) >= 2 * self._buffer)
            and not event.asks  # someone must answer it: never dropped
        ):
            self.missed += 1
            return
        events.append(converted)
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    def _convert(self, event: Event) -> StreamEvent | None:
        """The stream's event for ``event`` (None: not one the stream shows)."""
        detail = event.detail
        cls = type(detail)
        below = event.depth - self._root_depth  # 0: the execution asked
        if below and not self._subagents and cls not in _SUBAGENT_EDGES:
            return None
        shown = SHOWN.get(cls)
        if shown is None:
            return None  # one of IGNORED
        kind_of, names = shown
        if kind_of is None:  # the start or end of an execution: a subagent's only
            if not below:
                return None
            kind_of = SubagentStarted if cls is ExecutionStart else SubagentFinished
        fields = {name: getattr(detail, name) for name in names}
        fields.update(
            agent=event.agent, execution_id=event.execution_id, depth=event.depth, at=event.at
        )
        if kind_of is SubagentStarted:
            fields["parent_id"] = event.parent_id
        elif kind_of is Stopped:
            fields["status"] = "budget_exceeded" if cls is LimitReached else "timed_out"
        return msgspec.convert(fields, kind_of)

    def _answered(self, reply: PendingReply) -> None:
        self._ref.runtime.event_bus.watchers.pop(self._key, None)
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    # -- helpers -----------------------------------------------------------------------

    def _take(self, reply: PendingReply) -> None:
        error = reply.error
        if error is not None:
            self._error = error
        else:
            self._result = reply.result()

    def _stop(self, execution_id: str) -> None:
        supervisor = self._ref.runtime.supervisor
        try:
            node = supervisor.get(execution_id)
        except KeyError:
            return  # it has ended already
        if node.status == "running":
            supervisor.stop_subtree(
                node, "cancelled", "cancelled: the stream's consumer left before the answer"
            )

    def _close(self) -> None:
        self._closed = True
        self._events.clear()
        self._ref.runtime.event_bus.watchers.pop(self._key, None)


def withdrawn(agent_id: str) -> Result:
    """The answer of a streamed task whose consumer left before its agent took it (see
    ``AgentStream.__aexit__``): it never starts, and nothing of it joins the
    conversation, the traces or the store. The stream gives it at once; the agent,
    taking the task later, answers the same without running it."""
    reason = "the stream's consumer left before the task started"
    return Result(
        text=f"[cancelled] The task was not started: {reason}.",
        status="cancelled",
        stop_reason=f"cancelled: {reason}",
        usage=Usage(),
        agent_id=agent_id,
    )


#: The events of a subagent that a stream shows without ``subagents=True``: its start
#: and end, and the approvals it waits for (someone must answer them).
_SUBAGENT_EDGES: frozenset[type[EventDetail]] = frozenset(
    {ExecutionStart, ExecutionEnd, ApprovalAsked, ApprovalDecision}
)

#: For each kind of runtime event a stream shows (its detail's class): its type here
#: (None: a subagent's start or end) and the details it keeps.
SHOWN: dict[type[EventDetail], tuple[type[StreamEvent] | None, tuple[str, ...]]] = {
    ModelText: (TextDelta, ("text", "step")),
    ToolStart: (ToolCallStarted, ("tool", "call_id", "arguments")),
    ToolProgress: (ToolCallProgress, ("tool", "call_id", "progress", "total", "message")),
    ToolEnd: (ToolCallFinished, ("tool", "call_id", "is_error", "result", "seconds", "parts")),
    ExecutionStart: (None, ("task",)),
    ExecutionEnd: (None, ("status", "reason")),
    BudgetWait: (BudgetWaiting, ("reason",)),
    BudgetResume: (BudgetResumed, ("seconds",)),
    Retry: (Retrying, ("attempt", "error", "delay")),
    Restart: (Restarted, ("restarts", "reason", "digest")),
    CompactionEnd: (Compacted, ("ok", "turns", "covered", "error")),
    LimitReached: (Stopped, ("reason",)),
    DeadlineReached: (Stopped, ("reason",)),
    ApprovalAsked: (ApprovalRequested, ("id", "tool", "call_id", "arguments", "path")),
    ApprovalDecision: (
        ApprovalDecided,
        ("id", "tool", "call_id", "approved", "reason", "waited"),
    ),
}

#: The kinds a stream does not show, on purpose: the tree's structure and the model's
#: requests (a subagent shows as its start and end), a refusal (the ask answers it),
#: an actor's stop, a wait for a rate limit (the runtime's events and lines show it).
IGNORED: frozenset[type[EventDetail]] = frozenset(
    {StepStart, StepEnd, RequestStart, RequestEnd, Spawn, Refused, ActorStop, RateWait, RateResume}
)
