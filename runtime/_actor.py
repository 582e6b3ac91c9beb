"""The actor base class and the context an actor sees of itself.

Subclass ``Actor`` and override ``receive``: it is called with one message at a time,
in arrival order per sender, and what it returns answers the ``ask`` (a ``tell``
discards it). The instance's attributes are the actor's private state: nothing
outside the actor's task touches them, so no locks are needed.

``accepts`` names the message types the actor handles: a message of another type is
refused at the sender with ``UnknownMessage`` before it is queued. ``controls`` names
the control questions ``control`` answers at once, past the mailbox
(``ActorRef.inspect``). ``on_failure``
says what a raising handler does to the actor: ``"resume"`` goes on with the next
message, ``"stop"`` stops it (its pending asks then fail with ``ActorStopped``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from ._exceptions import UnknownMessage

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from ._cell import Cell
    from ._messages import MailboxStatistics
    from ._ref import ActorRef
    from ._runtime import Runtime

__all__ = ["Actor", "ActorContext", "FailurePolicy", "Spawnable"]

FailurePolicy = Literal["resume", "stop"]
R_co = TypeVar("R_co", covariant=True)


class Spawnable(Protocol[R_co]):
    """Anything ``Runtime.spawn`` accepts: it makes a fresh actor and wraps its ref.

    ``Actor`` instances are spawnable (once each) and give an ``ActorRef``; the
    ``actors`` package makes its immutable ``Agent`` definitions spawnable, giving an
    ``AgentRef``. The kernel needs to know nothing more about them.
    """

    def new_actor(self) -> Actor: ...

    def make_ref(self, ref: ActorRef) -> R_co: ...


class ActorContext:
    """What an actor may know and do about itself, from inside its own task."""

    __slots__ = ("_cell",)

    def __init__(self, cell: Cell) -> None:
        self._cell = cell

    @property
    def id(self) -> str:
        return self._cell.id

    @property
    def name(self) -> str:
        return self._cell.name

    @property
    def parent_id(self) -> str | None:
        return self._cell.parent_id

    @property
    def named(self) -> bool:
        """Whether ``id`` was given at spawn (``spawn(..., id="support")``), whatever
        its shape, rather than made up by the runtime (``name-N``)."""
        return self._cell.named

    @property
    def runtime(self) -> Runtime:
        """The runtime this actor runs in."""
        return self._cell.runtime

    @property
    def ref(self) -> ActorRef:
        """This actor's own reference (to hand to others)."""
        return self._cell.ref

    async def spawn(
        self,
        spawnable: Spawnable[R_co],
        *,
        id: str | None = None,
        name: str | None = None,
        mailbox_size: int | None = None,
    ) -> R_co:
        """Spawn a child actor. It lives in this actor's task group: it stops when
        this actor stops, and never outlives it."""
        return await self._cell.runtime.spawn_child(
            self._cell, spawnable, id=id, name=name, mailbox_size=mailbox_size
        )

    def spawn_soon(
        self,
        spawnable: Spawnable[R_co],
        *,
        task_group: TaskGroup,
        id: str | None = None,
        name: str | None = None,
        mailbox_size: int | None = None,
    ) -> R_co:
        """Spawn a child actor in ``task_group`` and return its reference at once.

        ``task_group`` is one this actor's task opened (inside a handler, say): the
        child then lives in that block, is cancelled with it, and never outlives it.
        Messages can be sent at once; they queue until the child has started. If its
        ``on_start`` fails, the child stops and its pending asks fail with
        ``ActorStopped`` naming the error. Never waits, so it costs no trip through
        the event loop, unlike ``spawn``.
        """
        return self._cell.runtime.spawn_soon(
            self._cell,
            spawnable,
            task_group=task_group,
            id=id,
            name=name,
            mailbox_size=mailbox_size,
        )

    def stop(self) -> None:
        """Stop this actor once the messages already queued are handled.

        New messages are refused from now on. Never waits, so a handler may call it.
        """
        self._cell.mailbox.close("stopped")

    def statistics(self) -> MailboxStatistics:
        return self._cell.mailbox.statistics()


class Actor:
    """Base class of kernel actors. Override ``receive`` (and optionally the hooks)."""

    #: Message types this actor handles; empty means any (``receive`` decides).
    accepts: ClassVar[tuple[type, ...]] = ()
    #: Control questions ``control`` answers at once (``ActorRef.inspect``).
    controls: ClassVar[tuple[type, ...]] = ()
    #: What a handler that raises does to the actor.
    on_failure: ClassVar[FailurePolicy] = "resume"
    #: Mailbox capacity (a class default; an instance may set its own before spawn).
    mailbox_size: int = 64
    #: Whether the actor may spawn children: it then gets a task group of its own for
    #: them. An actor that never does can say False and save that per spawn.
    spawns_children: bool = True

    _context: ActorContext | None = None

    @property
    def context(self) -> ActorContext:
        """The actor's own context; available from ``on_start`` on."""
        if self._context is None:
            raise RuntimeError(f"{type(self).__qualname__} is not running: spawn it first")
        return self._context

    async def on_start(self) -> None:
        """Called in the actor's task before it is reported ready."""

    async def receive(self, message: Any) -> Any:
        """Handle one message; the return value answers an ``ask``."""
        raise UnknownMessage(self.context.id, message)

    async def on_stop(self) -> None:
        """Called once when the actor stops (shielded, with a short deadline)."""

    def control(self, message: Any) -> Any:
        """Answer a control question (one of ``controls``) at once.

        Called from the asker's task while this actor's task waits at an await, so
        it sees a consistent state; it must not block and should change nothing
        (build an immutable snapshot and return it).
        """
        raise UnknownMessage(self.context.id, message)

    # Spawnable: an Actor instance is its own actor, spawned once.
    def new_actor(self) -> Actor:
        if self._context is not None:
            raise ValueError(
                f"this {type(self).__qualname__} instance was already spawned as "
                f"{self._context.id!r}; spawn a new instance instead"
            )
        return self

    def make_ref(self, ref: ActorRef) -> ActorRef:
        return ref
