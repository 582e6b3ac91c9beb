"""The cell: one actor's task, mailbox, pending asks and children.

``Cell.run`` is the actor's whole life, run inside a task group of its parent (the
runtime's, another actor's, or one a parent's handler opened): it opens a task group
for its own children, calls ``on_start``, reports ready through
``task_status.started``, then handles one envelope at a time until its mailbox is
closed and drained, it is cancelled, or a failing handler stops it. On every path it
ends in ``_finish``, which refuses new messages and settles every pending ask with
``ActorStopped`` exactly once. No await stands between marking the cell stopped and
failing its asks.

A cell cancels its actor through a cancel scope of its own, or, for a child started
with ``spawn_soon``, through the handle anyio gives the child's task (anyio 4.14 and
later): one scope less for a cancellation to reach and unwind, per child.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskGroup, TaskStatus

if TYPE_CHECKING:
    from anyio import TaskHandle

from ._actor import Actor, ActorContext
from ._events import ActorStop
from ._exceptions import RuntimeClosed, UnknownMessage
from ._mailbox import Mailbox
from ._ref import ActorRef, PendingReply

if TYPE_CHECKING:
    from ._runtime import Runtime

#: Whether ``TaskGroup.start_soon`` returns a handle that can cancel the task (4.14+).
TASK_HANDLES = hasattr(anyio, "TaskHandle")

__all__ = ["ActorGroup", "Cell"]

log = structlog.get_logger("fractor.runtime")

#: The cell whose task (or one of its subtasks) is running: an actor awaiting its own
#: stop would wait forever.
_running_cell: contextvars.ContextVar[Cell] = contextvars.ContextVar("fractor_running_cell")

#: How long ``on_stop`` may take once an actor is stopping.
STOP_HOOK_TIMEOUT = 1.0


class ActorGroup:
    """The live actors that one owner (the runtime, or an actor) started.

    Wraps the owner's task group: every actor of the group runs in it, so none can
    outlive the owner.
    """

    __slots__ = ("live", "task_group")

    def __init__(self) -> None:
        self.task_group: TaskGroup | None = None
        self.live: dict[str, Cell] = {}

    async def start(self, cell: Cell) -> ActorRef:
        if self.task_group is None:
            raise RuntimeClosed("not accepting new actors")
        self.live[cell.id] = cell
        try:
            ref: ActorRef = await self.task_group.start(cell.run)
        except BaseException:
            self.live.pop(cell.id, None)
            raise
        return ref

    def close_all(self, reason: str) -> None:
        """Refuse new messages to every actor of the group; they drain and stop."""
        self.task_group = None
        for cell in list(self.live.values()):
            cell.mailbox.close(reason)


_NO_CHILDREN = ActorGroup()
#: What an actor that spawns no children enters instead of a task group of its own.
_NO_TASK_GROUP = contextlib.nullcontext()
#: What a cell cancelled through its task's handle enters instead of a scope of its own.
_NO_SCOPE = contextlib.nullcontext()


class Cell:
    """Everything the kernel keeps for one actor."""

    __slots__ = (
        "_cancel_reason",
        "_finished",
        "_start_error",
        "accepts",
        "actor",
        "children",
        "depth",
        "group",
        "handle",
        "id",
        "mailbox",
        "name",
        "named",
        "parent_id",
        "pending",
        "runtime",
        "scope",
        "stopped",
    )

    def __init__(
        self,
        actor: Actor,
        *,
        id: str,
        name: str,
        parent_id: str | None,
        mailbox_size: int,
        runtime: Runtime,
        group: ActorGroup | None,
        own_scope: bool = True,
        depth: int = 1,
        named: bool = False,
    ) -> None:
        self.actor = actor
        self.id = id
        self.name = name
        #: Whether ``id`` was given at spawn, not made up by the runtime (``name-N``).
        self.named = named
        self.parent_id = parent_id
        #: 1 for an actor of the runtime's own, its parent's depth + 1 for a child.
        self.depth = depth
        self.runtime = runtime
        self.group = group
        self.mailbox = Mailbox(id, mailbox_size)
        self.accepts = actor.accepts
        self.pending: dict[int, PendingReply] = {}
        # An actor that spawns no children shares one empty group (it stays empty).
        self.children = ActorGroup() if actor.spawns_children else _NO_CHILDREN
        # Without a scope of its own, the cell is cancelled through ``handle``, which
        # whoever starts its task sets (see ``Runtime.spawn_soon``).
        self.scope: anyio.CancelScope | None = anyio.CancelScope() if own_scope else None
        self.handle: TaskHandle[None] | None = None
        self._finished: anyio.Event | None = None  # made only if someone waits
        self.stopped = False
        self._cancel_reason = ""
        self._start_error: Exception | None = None
        actor._context = ActorContext(self)

    @property
    def ref(self) -> ActorRef:
        """A reference to the actor (equal to every other one). Made when asked,
        not kept: a cell that kept its ref would be a reference cycle (the ref keeps
        the cell), left to the garbage collector when the actor ends."""
        return ActorRef(self)

    def check_accepts(self, message: object) -> None:
        accepts = self.accepts
        if accepts and not isinstance(message, accepts):
            expected = " or ".join(kind.__qualname__ for kind in accepts)
            raise UnknownMessage(self.id, message, expected)

    async def run(self, *, task_status: TaskStatus[ActorRef] = anyio.TASK_STATUS_IGNORED) -> None:
        """The actor's life: start, report ready, then handle one envelope at a time
        until the mailbox is closed and drained, or a failing handler stops it.

        Started with ``TaskGroup.start``, a failing ``on_start`` is raised to the
        spawner; started with ``start_soon`` (``spawn_soon``), the failure only stops
        the actor, and its pending asks say why. One frame for all of it: 10,000 idle
        actors each keep it, and a cancellation unwinds it for every actor.
        """
        _running_cell.set(self)
        actor = self.actor
        mailbox = self.mailbox
        scope = self.scope
        reason = "stopped"
        try:
            with scope if scope is not None else _NO_SCOPE:
                async with (
                    anyio.create_task_group() if actor.spawns_children else _NO_TASK_GROUP
                ) as children:
                    if children is not None:
                        self.children.task_group = children
                    try:
                        await actor.on_start()
                    except Exception as exc:
                        self._start_error = exc
                        reason = f"failed to start: {exc!r}"
                    else:
                        task_status.started(self.ref)
                        receive = mailbox.receive
                        pending = self.pending
                        handle = actor.receive
                        stop_on_failure = actor.on_failure == "stop"
                        while (envelope := await receive()) is not None:
                            request_id = envelope.request_id
                            try:
                                value = await handle(envelope.message)
                            except Exception as exc:
                                mailbox.failed += 1
                                if request_id:
                                    reply = pending.pop(request_id, None)
                                    if reply is not None:
                                        reply.set_error(exc)
                                else:
                                    log.warning(
                                        "message failed",
                                        actor_id=self.id,
                                        message_type=type(envelope.message).__qualname__,
                                        error=repr(exc),
                                    )
                                if stop_on_failure:
                                    reason = f"failed: {exc!r}"
                                    break
                                continue
                            mailbox.handled += 1
                            if request_id:
                                reply = pending.pop(request_id, None)
                                if reply is not None:
                                    reply.set_result(value)
                        else:  # closed and drained: a graceful stop
                            reason = mailbox.reason or "stopped"
                    if children is not None:
                        self._close_children(reason)
            if self._start_error is not None and task_status is not anyio.TASK_STATUS_IGNORED:
                # Raised here, outside the task group, so the spawner gets it unwrapped.
                raise self._start_error
            if scope is not None and scope.cancelled_caught:
                reason = self._cancel_reason or "cancelled"
        except self.runtime.cancelled_exc:
            # Through the handle, the cancellation is caught outside this frame: the
            # reason is the one ``cancel`` (or a grace period) gave, if any.
            reason = self._cancel_reason if scope is None and self._cancel_reason else "cancelled"
            raise
        except BaseException as exc:
            if not reason.startswith("failed"):
                reason = f"failed: {exc!r}"
            raise
        finally:
            if self.children is not _NO_CHILDREN:
                self._close_children("stopped")
            self._finish(reason)
            if type(actor).on_stop is not Actor.on_stop:
                await self._run_stop_hook()
            # The actor is done with: the cell lets it go (its context points back
            # here), so that an ended actor is freed as soon as nothing refers to it
            # rather than by the garbage collector, whose passes over thousands of
            # short-lived actors would cost more than the actors themselves.
            del self.actor

    def _close_children(self, reason: str) -> None:
        why = "" if reason == "stopped" else f" ({reason})"
        self.children.close_all(f"parent {self.id!r} stopped{why}")

    def _finish(self, reason: str) -> None:
        """Mark the actor stopped and settle every pending ask. Never awaits."""
        self.stopped = True
        self.handle = None  # it keeps the task's outcome (and traceback): no cycle
        self.mailbox.discard(reason)
        pending = self.pending
        while pending:
            _, reply = pending.popitem()
            reply.set_stopped(reason)
        if self.group is not None:
            self.group.live.pop(self.id, None)
        self.runtime.cell_finished(self)
        bus = self.runtime.event_bus
        if bus.active:
            bus.emit(
                ActorStop(reason=reason),
                agent=self.name,
                agent_id=self.id,
                parent_id=self.parent_id or "",
                depth=self.depth,
            )
        if self._finished is not None:
            self._finished.set()

    async def _run_stop_hook(self) -> None:
        with anyio.move_on_after(STOP_HOOK_TIMEOUT, shield=True):
            try:
                await self.actor.on_stop()
            except Exception as exc:
                log.warning("on_stop failed", actor_id=self.id, error=repr(exc))

    async def stop(self, *, grace: float | None) -> None:
        if _running_cell.get(None) is self:
            raise RuntimeError(
                f"actor {self.id!r} cannot await its own stop; call context.stop() instead"
            )
        self.mailbox.close("stopped")
        if grace is not None:
            reason = f"stopped, cancelled after a {grace:g} s grace period"
            if self.scope is not None:
                self._cancel_reason = reason
                self.scope.deadline = min(self.scope.deadline, anyio.current_time() + grace)
            else:
                with anyio.move_on_after(grace):
                    await self.wait_finished()
                if not self.stopped:
                    self._cancel_reason = self._cancel_reason or reason
                    self._cancel_task()
        await self.wait_finished()

    async def wait_finished(self) -> None:
        """Wait until the actor has stopped (returns at once if it has)."""
        if self.stopped:
            await anyio.lowlevel.checkpoint()
            return
        if self._finished is None:
            self._finished = anyio.Event()
        await self._finished.wait()

    def stop_nowait(self) -> None:
        self.mailbox.close("stopped")

    def cancel(self) -> None:
        if not self.stopped:
            self._cancel_reason = "cancelled"
            self.mailbox.close("cancelled")
            self._cancel_task()

    def _cancel_task(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
        elif self.handle is not None:
            self.handle.cancel()
