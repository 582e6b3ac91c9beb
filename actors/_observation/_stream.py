"""Streaming an ask: the events of one execution's tree as they happen, then its
``Result`` (``AgentRef.stream``).

::

    async with ref.stream("What's the weather in Paris?") as run:
        async for event in run:
            match event.detail:
                case ModelText(text=text) if event.depth == 1:
                    print(text, end="", flush=True)
                case ToolStart(tool=name):
                    print(f"\\n[{name}...]")
    print(run.result.status)

The stream yields the runtime's own events (``fractor.Event``, as ``rt.events()``
does), those of this tree only: one vocabulary, one class per kind of event
(``_events``), whether it is read from the bus, a stream, the wire from a host or a
log. Which kinds it yields is a property of each class (``EventDetail.streamed``):
the model's text as it is generated (``ModelText``; a ``Retry`` or a ``Restart``
means the text starts over), a tool call's start, progress and end, a budget wait
and its end, a compaction, a stop (``LimitReached``, ``DeadlineReached``), of the
execution asked; its subagents' start and end (``ExecutionStart``, ``ExecutionEnd``
below it); and the approvals asked and decided at every depth (``ApprovalAsked``:
see ``_tools._approval``). Each event names its agent, its execution and its
``depth`` in the tree, counted from the top as the tree counts it everywhere
(``rt.tree()``, an ``ApprovalRequest``): 1 for the agent asked (a top-level agent),
2 for its subagents, and so on, wherever they run. ``subagents=True`` adds the
subagents' events of the kinds the execution asked shows (``streamed == "asked"``):
their text, tool calls, waits and stops. The iteration ends once the execution has
answered; ``run.result`` is the same ``Result`` that ``ask`` returns.

How it works: the ask carries the name of a watcher (``Task.watch``); the execution's
node takes it, and every node opened below inherits it (``Subtree.watch``, kept in
``runtime.Node.layer``), so the events of this tree, and only these, reach the stream,
whether or not anyone subscribes to the runtime's events. They wait in a bounded buffer:
a slow consumer never stalls the agents. While the consumer is behind, consecutive text
pieces of one execution's step merge into one event (no text is lost); once the buffer
is full, other events are dropped and counted in ``run.missed`` (and, as a subscriber's
are, in the ``missed`` of the next event yielded), except those that ask something of
the consumer (``runtime.Event.asks``: an ``ApprovalAsked``), which are always shown.

Leaving the block before the answer stops the execution (and its subtree), and
waits briefly for its answer: ``run.result`` then says so (``cancelled``). A task
its agent has not taken yet (it waits in the mailbox behind others, or the agent
has not run since) never starts: the agent takes the stream's watcher out of the
runtime's ``watchers`` with the task, so whichever of the two comes first decides;
``run.result`` is then at once the answer ``withdrawn`` makes (``cancelled``: "The
task was not started"), and nothing of the task joins the conversation, the traces
or the store.

Until the next release, the stream's classes of before (``TextDelta``,
``ToolCallStarted``, ... ``StreamEvent``) are old names (``RENAMED``), each with a
``DeprecationWarning`` naming its new class: ``isinstance(event, TextDelta)`` holds
for an event whose detail is a ``ModelText``, ``case TextDelta(text=text, depth=1)``
matches it, and an event a stream yields reads its detail's fields as its own
(``event.text``, as the old classes were flat), with a ``DeprecationWarning`` too.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from fractor.runtime import Event, EventDetail, Usage

from .._messages import Result, Task
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
    Restart,
    Retry,
    ToolEnd,
    ToolProgress,
    ToolStart,
    WireEvent,
)

if TYPE_CHECKING:
    from fractor.runtime import ActorRef, PendingReply

__all__ = ["RENAMED", "AgentStream", "old_name", "withdrawn"]

#: How long leaving a stream early waits for the stopped execution's answer.
_STOP_WAIT = 5.0
_keys = itertools.count(1)
_replace = msgspec.structs.replace


class AgentStream:
    """One streamed ask: an async context manager, then an async iterator of the
    tree's ``Event``s; ``result`` once the iteration has ended (see the module)."""

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
        self._events: deque[Event] = deque()
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

    async def __anext__(self) -> Event:
        reply = self._reply
        if reply is None:
            raise RuntimeError("use the stream as an async context manager first (async with)")
        while True:
            if self._events:
                return _flat(self._events.popleft())
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
        detail = event.detail
        shown = detail.streamed
        if shown == "never":
            return
        if event.depth > self._root_depth:  # a subagent's
            if shown == "asked" and not self._subagents:
                return
        elif shown == "subagents":
            return  # the execution asked's own start or end: the stream's own
        events = self._events
        if type(detail) is ModelText and events:
            last = events[-1]
            before = last.detail
            if (
                type(before) is ModelText
                and last.execution_id == event.execution_id
                and before.step == detail.step
            ):
                merged = _replace(before, text=before.text + detail.text)
                events[-1] = _replace(last, detail=merged)
                return
        if (
            len(events) >= self._buffer
            and (type(detail) is not ModelText or len(events) >= 2 * self._buffer)
            and not event.asks  # someone must answer it: never dropped
        ):
            self.missed += 1
            return
        if self.missed:  # the gap is said, as to the runtime's subscribers
            event = _replace(event, missed=self.missed)
        events.append(event)
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

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


# -- the stream's classes of before: old names until the next release --------------


class _Flat(Event, frozen=True, kw_only=True, gc=False):
    """An event a stream yields, until the next release: an ``Event`` that also reads
    its detail's fields as its own (``event.text``), as the stream's old classes were
    flat, with a ``DeprecationWarning`` naming the new way (``event.detail.text``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self.detail, name)
        except AttributeError:
            raise AttributeError(
                f"an event of kind {self.detail.kind!r} has no field {name!r}"
            ) from None
        warnings.warn(
            f"event.{name} is deprecated: a stream yields fractor.Event, whose detail "
            f"holds the fields of its kind: read event.detail.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value


_Flat.__name__ = _Flat.__qualname__ = "Event"  # what it shows as: an Event


def _flat(event: Event) -> Event:
    return _Flat(
        at=event.at,
        agent=event.agent,
        agent_id=event.agent_id,
        execution_id=event.execution_id,
        parent_id=event.parent_id,
        depth=event.depth,
        detail=event.detail,
        missed=event.missed,
    )


class _Renamed(type):
    """The class of an old name of a stream event (``TextDelta``): an event is an
    instance of it when its detail is of the new class (``ModelText``), so
    ``isinstance`` and ``match`` go on working; calling it makes such an event from
    the old class's fields."""

    new: tuple[type[EventDetail], ...]

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, Event) and isinstance(instance.detail, cls.new)

    def __call__(cls, *args: Any, **fields: Any) -> Any:
        if args:
            raise TypeError(f"{cls.__name__}() takes keyword arguments only")
        envelope = {
            name: fields.pop(name)
            for name in ("at", "agent", "agent_id", "execution_id", "parent_id", "depth")
            if name in fields
        }
        new = cls.new[0]
        if len(cls.new) > 1:  # Stopped: its status says which
            status = fields.pop("status", None)
            new = next((kind for kind in cls.new if getattr(kind, "status", 0) == status), new)
        if new is ExecutionEnd:
            fields.setdefault("steps", 0)
            fields.setdefault("tokens", 0)
        return _flat(Event(**{"at": 0.0, **envelope}, detail=new(**fields)))


def _renamed(name: str, *new: type[EventDetail]) -> tuple[object, str]:
    said = " or ".join(kind.__name__ for kind in new)
    old = _Renamed(name, (), {"new": new, "__module__": "fractor.actors", "__doc__": said})
    return (
        old,
        f"an Event whose detail is a {said} (match event.detail: case {new[0].__name__}(...))",
    )


#: The stream's classes of before, by name: what each is now (a stand-in that
#: ``isinstance`` and ``match`` take for it), and the new class its warning names.
RENAMED: dict[str, tuple[object, str]] = {
    "TextDelta": _renamed("TextDelta", ModelText),
    "ToolCallStarted": _renamed("ToolCallStarted", ToolStart),
    "ToolCallProgress": _renamed("ToolCallProgress", ToolProgress),
    "ToolCallFinished": _renamed("ToolCallFinished", ToolEnd),
    "SubagentStarted": _renamed("SubagentStarted", ExecutionStart),
    "SubagentFinished": _renamed("SubagentFinished", ExecutionEnd),
    "BudgetWaiting": _renamed("BudgetWaiting", BudgetWait),
    "BudgetResumed": _renamed("BudgetResumed", BudgetResume),
    "Retrying": _renamed("Retrying", Retry),
    "ApprovalRequested": _renamed("ApprovalRequested", ApprovalAsked),
    "ApprovalDecided": _renamed("ApprovalDecided", ApprovalDecision),
    "Restarted": _renamed("Restarted", Restart),
    "Compacted": _renamed("Compacted", CompactionEnd),
    "Stopped": _renamed("Stopped", LimitReached, DeadlineReached),
    "StreamEvent": (WireEvent, "fractor.Event, the runtime's own, its detail one class per kind"),
}


def old_name(module: str, name: str) -> object:
    """``module.name`` for an old name of ``RENAMED`` (a module's ``__getattr__``),
    with a ``DeprecationWarning`` naming the new one; ``AttributeError`` for any other
    name, as for a name a module lacks."""
    try:
        value, said = RENAMED[name]
    except KeyError:
        raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
    warnings.warn(
        f"{module}.{name} is deprecated and goes in the next release: a stream yields {said}",
        DeprecationWarning,
        stacklevel=3,
    )
    return value
