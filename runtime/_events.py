"""Events: what happens in the tree, for observers and for the logs.

Every event is a frozen ``Event`` Struct: the envelope (when, which agent and node)
around a typed ``detail``, one frozen Struct per kind of event (``EventDetail``'s
subclasses, a tagged union on ``kind``). A kind is defined once, as its class: the
kernel defines the envelope, the base of every detail and the kinds it emits itself
(``ActorStop``); the agent layer defines its own (``fractor.actors``: ``ToolStart``,
``StepEnd``, ...). The kernel knows no agent kind: what it needs to know of one is a
property of its class (``EventDetail.asks``), and so is what a stream of one subtree
shows of it (``EventDetail.streamed``). ``event.kind`` is the kind's name
(``"tool_start"``); observers dispatch on the detail's class::

    match event.detail:
        case ToolStart(tool=tool, arguments=arguments): ...

(``event.detail["tool"]`` and ``event.detail.get("tool")`` read a field by its name
too, as the details' dicts did before they were typed.)

Two ways to see them, both off by default so that an unobserved runtime pays one
attribute check per event site:

- ``async with rt.events() as events: async for event in events: ...`` subscribes.
  Each subscriber has its own bounded buffer: a slow observer never stalls the
  agents. When its buffer is full, new events are **dropped for that subscriber
  only** and counted in ``Subscription.missed``; the next event it does receive
  carries the running count in ``Event.missed`` so a gap is never silent. An event
  that asks something of its observer (``Event.asks``: its class says so; a tool
  call waiting for a person's decision) is never dropped: it waits past the buffer,
  in order.
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
from collections.abc import AsyncIterator, Callable, Iterator, Set
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, Literal, TypeAlias

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._waiter import clock

__all__ = [
    "ASKING",
    "ActorStop",
    "Event",
    "EventBus",
    "EventDetail",
    "EventKind",
    "Streamed",
    "Subscription",
    "detail_class",
    "detail_classes",
    "make_detail",
]

#: The name of a kind of event (``"tool_start"``): the tag of its detail's class
#: (``EventDetail.kind``), a ``str``. Once a ``Literal`` listing every kind, agent
#: kinds included; now any kind a detail class defines (``detail_classes()``).
EventKind: TypeAlias = Annotated[str, "the name of a kind of event"]

#: Which events of a kind a stream of one subtree shows (``EventDetail.streamed``):
#: ``"never"``; ``"asked"``, those of the subtree's top (the execution asked, in an
#: agent's stream), and of the nodes below it when the stream asks for everything
#: (``AgentRef.stream(subagents=True)``); ``"subagents"``, those of the nodes below
#: the top only, whatever the stream asks (a subagent's start and end: the top's are
#: the stream's own beginning and end); ``"always"``, those of every node of the
#: subtree (an approval asked deep in the tree, which someone must answer).
Streamed: TypeAlias = Literal["never", "asked", "subagents", "always"]

log = structlog.get_logger("fractor.events")


class _KindOf:
    """``EventDetail.kind``: the class's tag, read once per class, then a plain class
    attribute (msgspec sets a class's tag after its ``__init_subclass__`` runs)."""

    def __get__(self, detail: object, owner: type[EventDetail]) -> str:
        tag = owner.__struct_config__.tag
        kind = tag if isinstance(tag, str) else ""
        if owner is not EventDetail:
            owner.kind = kind  # cached: the descriptor steps aside
        return kind


class EventDetail(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag_field="kind",
    omit_defaults=True,
    repr_omit_defaults=True,
    gc=False,
):
    """The base of every event's detail: one subclass per kind of event, tagged with
    the kind's name (``class ToolStart(EventDetail, tag="tool_start")``), its fields
    typed. A subclass is its kind's one definition: the bus builds it from the kind's
    name (``EventBus.emit``), the wire decodes it, every observer dispatches on it.

    Fields are also read by name, as a mapping's (``detail["tool"]``,
    ``detail.get("tool")``, ``"tool" in detail``, ``dict(detail)``), for code written
    when details were dicts.

    Details and events are never tracked by the garbage collector (``gc=False``,
    inherited by every kind): they are frozen values (strings, numbers, tuples of
    frozen Structs) that take part in no reference cycle, and an observed tree makes
    one per step, call and request: tracked, their allocations alone would trigger
    collections of everything the tree holds (the web view's W6 run spent about a
    third of its time there). A kind of your own whose fields hold a mutable container
    that may refer back to it sets ``gc=True``."""

    if TYPE_CHECKING:
        #: The kind's name, ``"tool_start"``: the class's tag.
        kind: ClassVar[str]
    else:
        kind = _KindOf()
    #: Whether an event of this kind asks something of its observer, which someone
    #: must answer or the tree waits forever (a tool call waiting for a person's
    #: decision): every overflow policy reads it, and never drops such an event.
    asks: ClassVar[bool] = False
    #: Which events of this kind a stream of one subtree yields (``Streamed``: never,
    #: the execution asked's, its subagents' only, always): ``AgentRef.stream`` reads
    #: it, and yields the events themselves, the same ``Event`` the bus carries. A kind
    #: of your own says so too (``streamed = "asked"``) to be streamed.
    streamed: ClassVar[Streamed] = "never"

    #: The host the event happened on, when it came from one ("": here).
    host: str = ""

    @staticmethod
    def of(kind: str, fields: dict[str, Any]) -> EventDetail:
        """The detail of an event of kind ``kind`` with ``fields``, its class found
        among those defined (``ValueError`` for a kind none defines, ``TypeError``
        for a field its class lacks or a required one missing)."""
        return make_detail(kind, fields)

    def __getitem__(self, name: str) -> Any:
        if name in self.__struct_fields__:
            return getattr(self, name)
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        """The field ``name``, or ``default`` if this kind has none of that name."""
        if name in self.__struct_fields__:
            return getattr(self, name)
        return default

    def __contains__(self, name: object) -> bool:
        return name in self.__struct_fields__

    def __iter__(self) -> Iterator[str]:
        return iter(self.__struct_fields__)

    def __len__(self) -> int:
        return len(self.__struct_fields__)

    def keys(self) -> tuple[str, ...]:
        """The names of its fields."""
        return self.__struct_fields__

    def items(self) -> Iterator[tuple[str, Any]]:
        """Its fields' names and values."""
        return ((name, getattr(self, name)) for name in self.__struct_fields__)


class ActorStop(EventDetail, frozen=True, kw_only=True, tag="stop"):
    """An actor stopped (the kernel's own event): why, in words."""

    streamed = "never"

    reason: str


#: Every detail class by its kind, found among ``EventDetail``'s subclasses: filled
#: when a kind is first asked for, and again when a kind not known yet is (a module
#: defining kinds imported since).
_CLASSES: dict[str, type[EventDetail]] = {}


def detail_classes() -> dict[str, type[EventDetail]]:
    """Every kind of event defined so far (the kernel's, and those of every module
    imported that defines some), by name."""
    found: dict[str, type[EventDetail]] = {}
    pending = list(EventDetail.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        kind = cls.kind
        if kind:
            other = found.setdefault(kind, cls)
            if other is not cls:
                raise TypeError(
                    f"two classes define the event kind {kind!r}: "
                    f"{other.__qualname__} and {cls.__qualname__}"
                )
    _CLASSES.clear()
    _CLASSES.update(found)
    return dict(found)


def detail_class(kind: str) -> type[EventDetail]:
    """The detail class of the event kind ``kind``; ``ValueError`` if none defines it."""
    try:
        return _CLASSES[kind]
    except KeyError:
        pass
    known = detail_classes()
    if kind not in known:
        raise ValueError(
            f"no event kind {kind!r}: expected one of {', '.join(sorted(known))} "
            "(an EventDetail subclass tagged with it defines a kind)"
        )
    return known[kind]


def make_detail(kind: str, fields: dict[str, Any]) -> EventDetail:
    """The detail of an event of kind ``kind`` with ``fields``; a clear error for a
    kind nobody defines or a field its class does not have (or lacks)."""
    cls = _CLASSES.get(kind)
    if cls is None:
        cls = detail_class(kind)
    try:
        return cls(**fields)
    except TypeError as exc:
        expected = ", ".join(cls.__struct_fields__)
        raise TypeError(
            f"event {kind!r} ({cls.__qualname__}): {exc}; its fields are {expected}"
        ) from None


class _Asking(Set[str]):
    """The names of the kinds whose class says they ask something of their observer
    (``EventDetail.asks``), derived from the classes defined so far."""

    def __contains__(self, kind: object) -> bool:
        cls = _CLASSES.get(kind) if isinstance(kind, str) else None
        if cls is None and isinstance(kind, str):
            cls = detail_classes().get(kind)
        return cls is not None and cls.asks

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(kind for kind, cls in detail_classes().items() if cls.asks))

    def __len__(self) -> int:
        return sum(1 for cls in detail_classes().values() if cls.asks)

    def __repr__(self) -> str:
        return f"ASKING({set(self)!r})"


#: The kinds of events that ask something of whoever watches the tree (their class's
#: ``asks``): someone must answer them (a tool call waits for a person's decision)
#: or the tree waits forever. Such an event is never dropped, however far behind
#: its observer is (``Event.asks``). Once a fixed set of names; now read from the
#: classes, so ``kind in ASKING`` holds for every kind whose class asks.
ASKING: Set[str] = _Asking()


if TYPE_CHECKING:
    from typing_extensions import TypeVar

    D = TypeVar("D", bound=EventDetail, default=EventDetail, covariant=True)
else:
    from typing import TypeVar

    D = TypeVar("D", bound=EventDetail, covariant=True)  # a bare Event: its bound


class Event(msgspec.Struct, Generic[D], frozen=True, kw_only=True, gc=False):
    """One thing that happened in the tree: where and when (the envelope), and what
    (``detail``, one class per kind).

    Generic in its detail's class, for the types only: ``Event`` is
    ``Event[EventDetail]``; ``Event[ToolStart]`` one whose detail is a ``ToolStart``.
    A decoder of ``Event[A | B]`` decodes the detail as one of those classes (by its
    ``kind``): how the wire from a host decodes an agent's events."""

    #: Seconds since the runtime started.
    at: float
    agent: str = ""
    agent_id: str = ""
    execution_id: str = ""
    parent_id: str = ""
    depth: int = 0
    #: What happened: an instance of the kind's class (``ToolStart``, ``ActorStop``).
    detail: D
    #: Events this subscriber had dropped so far (its buffer was full), in all.
    missed: int = 0

    @property
    def kind(self) -> EventKind:
        """The kind's name (``"tool_start"``): the tag of the detail's class."""
        return self.detail.kind

    @property
    def asks(self) -> bool:
        """Whether it asks something of its observer (its class's ``asks``): never
        dropped."""
        return self.detail.asks


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
        #: to the subtree's node (the agent layer keeps it in ``Node.layer``);
        #: whoever finds it gone knows the message was taken (one still here was not).
        self.watchers: dict[str, Callable[[Event], None]] = {}

    def start(self) -> None:
        self._now = clock()
        self._origin = self._now()

    def emit(
        self,
        kind: EventKind | EventDetail,
        *,
        agent: str = "",
        agent_id: str = "",
        execution_id: str = "",
        parent_id: str = "",
        depth: int = 0,
        **fields: Any,
    ) -> None:
        """Publish one event to every subscriber (and the log, if enabled): ``kind``
        is its detail (``ActorStop(reason=...)``), or the kind's name with the
        detail's ``fields`` (``emit("stop", reason=...)``; ``ValueError`` for a kind
        no class defines, ``TypeError`` for a field its class lacks)."""
        if isinstance(kind, EventDetail):
            if fields:
                raise TypeError(
                    f"emit({type(kind).__qualname__}(...)) takes no detail fields besides "
                    f"it, got {', '.join(fields)}"
                )
            detail = kind
        else:
            detail = make_detail(kind, fields)
        self.deliver(
            Event(
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
        if self.log_events:
            log.info(
                event.kind,
                agent=event.agent,
                agent_id=event.agent_id,
                execution_id=event.execution_id,
                parent_id=event.parent_id,
                depth=event.depth,
                **msgspec.structs.asdict(event.detail),
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
