"""Events: what happens in the tree, for observers and for the logs.

Every event is a frozen ``Event`` Struct naming its kind, the node (execution) and
agent it is about, and a few details. Two ways to see them, both off by default so
that an unobserved runtime pays one attribute check per event site:

- ``async with rt.events() as events: async for event in events: ...`` subscribes.
  Each subscriber has its own bounded buffer: a slow observer never stalls the
  agents. When its buffer is full, new events are **dropped for that subscriber
  only** and counted in ``Subscription.missed``; the next event it does receive
  carries the running count in ``Event.missed`` so a gap is never silent. An event
  that asks something of its observer (``ASKING``: a tool call waiting for a
  person's decision) is never dropped: it waits past the buffer, in order.
- ``Runtime(log_events=True)`` also writes every event through structlog (logger
  ``fractor.events``) at info level, with ``agent_id``, ``parent_id``, ``depth`` and
  ``execution_id`` as keys.

A third way, ``EventBus.listen``, calls a function with every event, synchronously,
where it happens: an integration turning events into something else as they come
(the OpenTelemetry spans of ``fractor.actors.integrations.otel``). It must never block nor
raise.

A fourth way sees one subtree only: a node's ``watch`` (set by whoever streams an
ask) is called with every event of that subtree (stamped with ``now``); the bus
delivers it to its subscribers as well when it is active (``deliver``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._waiter import clock

__all__ = ["ASKING", "Event", "EventBus", "EventKind", "Subscription"]

EventKind = Literal[
    "spawn",
    "execution_start",
    "step_start",
    "step_end",
    "text",
    "tool_start",
    "tool_progress",
    "tool_end",
    "retry",
    "restart",
    "compaction",
    "budget_wait",
    "budget_resume",
    "budget_exceeded",
    "deadline",
    "approval_request",
    "approval_decision",
    "refused",
    "request_start",
    "request_end",
    "execution_end",
    "stop",
]

#: The kinds of events that ask something of whoever watches the tree: someone must
#: answer them (a tool call waits for a person's decision) or the tree waits
#: forever. Every overflow policy reads this: such an event is never dropped,
#: however far behind its observer is (``Event.asks``).
ASKING: frozenset[EventKind] = frozenset({"approval_request"})

log = structlog.get_logger("fractor.events")


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that happened in the tree."""

    kind: EventKind
    #: Seconds since the runtime started.
    at: float
    agent: str = ""
    agent_id: str = ""
    execution_id: str = ""
    parent_id: str = ""
    depth: int = 0
    detail: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Events this subscriber had dropped so far (its buffer was full), in all.
    missed: int = 0

    @property
    def asks(self) -> bool:
        """Whether it asks something of its observer (``ASKING``): never dropped."""
        return self.kind in ASKING


class Subscription:
    """One observer's bounded view of the event stream."""

    def __init__(self, receive: MemoryObjectReceiveStream[Event]) -> None:
        self._receive = receive
        #: Events dropped for this subscriber because its buffer was full.
        self.missed = 0
        #: Events that ask something (``Event.asks``) that came while the buffer was
        #: full: received after the buffer, in order. While any waits here, the
        #: events that ask nothing are dropped (they would overtake it).
        self._held: deque[Event] = deque()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if self._held:
            event = self.receive_nowait()
            assert event is not None
            return event
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def receive_nowait(self) -> Event | None:
        """The next buffered event, or ``None`` if there is none yet."""
        try:
            return self._receive.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream):
            return self._held.popleft() if self._held else None


class EventBus:
    """Fans events out to subscribers and, if asked, to structlog. Never waits."""

    def __init__(self, *, log_events: bool = False) -> None:
        self.log_events = log_events
        self._subscribers: dict[Subscription, MemoryObjectSendStream[Event]] = {}
        self._origin = 0.0
        self._now: Callable[[], float] = anyio.current_time
        #: True when anyone listens: event sites check this before building an event.
        self.active = log_events
        #: Also called with every event when set (a host forwarding its events to the
        #: tree it works for); makes the bus active.
        self.tap: Callable[[Event], None] | None = None
        self._listeners: list[Callable[[Event], None]] = []
        #: How many observers record contents (``otel.instrument(capture_content=True)``):
        #: while any does, the events of model requests carry the request's messages
        #: (``request_start``) and the response (``request_end``), as references.
        self.contents = 0
        #: Called, when set, with an agent's id and a key of the task where a task
        #: from outside is handed to it (``AgentRef.ask``, ``tell``, ``stream``), in
        #: the caller's own task: an observer takes what it needs of the caller's
        #: context there (the OpenTelemetry integration, the caller's current span)
        #: and finds it again by the key, which the task's events carry ("caller").
        self.on_task: Callable[[str, str], None] | None = None
        #: Watchers of one subtree each, by the key a message names them with: the
        #: actor that takes the message takes its watcher out of here, and gives it
        #: to the subtree's node (see ``Node.watch``); whoever finds it gone knows
        #: the message was taken (one still here was not).
        self.watchers: dict[str, Callable[[Event], None]] = {}

    def start(self) -> None:
        self._now = clock()
        self._origin = self._now()

    def emit(
        self,
        kind: EventKind,
        *,
        agent: str = "",
        agent_id: str = "",
        execution_id: str = "",
        parent_id: str = "",
        depth: int = 0,
        **detail: Any,
    ) -> None:
        """Publish one event to every subscriber (and the log, if enabled)."""
        self.deliver(
            Event(
                kind=kind,
                at=self._now() - self._origin,
                agent=agent,
                agent_id=agent_id,
                execution_id=execution_id,
                parent_id=parent_id,
                depth=depth,
                detail=detail,
            )
        )

    def deliver(self, event: Event) -> None:
        """Hand ``event`` (made here) to the tap, the subscribers and the log."""
        if self.tap is not None:
            self.tap(event)
        self.publish(event)

    def listen(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``listener`` with every event from now on, where it happens (it must
        never block nor raise); makes the bus active. Returns the function that
        removes it again."""
        self._listeners.append(listener)
        self.active = True

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
                self._refresh()

        return remove

    def _refresh(self) -> None:
        self.active = (
            self.log_events
            or bool(self._subscribers)
            or self.tap is not None
            or bool(self._listeners)
        )

    def now(self) -> float:
        """Seconds since the runtime started (an event's ``at``)."""
        return self._now() - self._origin

    def publish(self, event: Event) -> None:
        """Publish one event to every subscriber (and the log, if enabled); for an
        event made elsewhere (by a host, for this tree), as it is."""
        for listener in self._listeners:
            listener(event)
        kind, detail = event.kind, event.detail
        agent, agent_id, execution_id = event.agent, event.agent_id, event.execution_id
        parent_id, depth = event.parent_id, event.depth
        if self.log_events:
            log.info(
                kind,
                agent=agent,
                agent_id=agent_id,
                execution_id=execution_id,
                parent_id=parent_id,
                depth=depth,
                **detail,
            )
        for subscription, send in self._subscribers.items():
            held = subscription._held
            try:
                if held:
                    raise anyio.WouldBlock  # behind what waits past the buffer
                if subscription.missed:
                    send.send_nowait(msgspec.structs.replace(event, missed=subscription.missed))
                else:
                    send.send_nowait(event)
            except anyio.WouldBlock:
                if event.asks:
                    held.append(msgspec.structs.replace(event, missed=subscription.missed))
                else:
                    subscription.missed += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the subscriber is leaving; unsubscribe removes it

    @asynccontextmanager
    async def subscribe(self, buffer: int = 1_000) -> AsyncIterator[Subscription]:
        """Receive every event from now on, through a buffer of ``buffer`` events."""
        if not isinstance(buffer, int) or buffer < 1 or buffer == math.inf:
            raise ValueError(f"buffer must be a whole number >= 1, got {buffer!r}")
        send, receive = anyio.create_memory_object_stream[Event](buffer)
        subscription = Subscription(receive)
        self._subscribers[subscription] = send
        self.active = True
        try:
            yield subscription
        finally:
            del self._subscribers[subscription]
            self._refresh()
            send.close()
            receive.close()

    def close(self) -> None:
        """End every subscription's iteration (the runtime is closing)."""
        for send in self._subscribers.values():
            send.close()
