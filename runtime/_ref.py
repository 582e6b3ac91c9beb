"""References to actors: the only handle the outside world gets.

An ``ActorRef`` talks to an actor through its mailbox and nothing else. ``tell`` and
``ask`` wait for room in a full mailbox (backpressure); ``tell_nowait`` and
``ask_nowait`` never wait and raise ``MailboxFull`` instead. Every ask gets exactly
one outcome: the handler's return value, the handler's exception, ``AskTimeout``, or
``ActorStopped`` when the actor stops before answering.

Beside the mailbox runs a **control lane**: ``inspect`` asks one of the actor's
control questions (``Actor.controls``, a snapshot of its progress, say) and gets
the answer at once, even while the actor is busy with a long message. The actor's
sync ``control`` method answers it while the actor's task waits at one of its
awaits: it sees the actor's state between two steps, never half-way through one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from ._exceptions import ActorStopped, AskTimeout, MailboxFull, UnknownMessage
from ._messages import Envelope, MailboxStatistics
from ._waiter import Waiter, new_waiter, park, wake

if TYPE_CHECKING:
    from ._cell import Cell
    from ._runtime import Runtime

__all__ = ["ActorRef", "PendingReply"]

_request_ids = itertools.count(1)


class PendingReply:
    """The one reply to one ask, to be awaited with ``wait``.

    Settled exactly once: by the actor's answer, by its exception, or with
    ``ActorStopped`` when the actor stops first.
    """

    __slots__ = (
        "_callback",
        "_cell",
        "_error",
        "_message",
        "_settled",
        "_stopped",
        "_value",
        "_waiter",
        "request_id",
    )

    def __init__(self, cell: Cell, message: object) -> None:
        self._cell = cell
        self._message = message
        self._waiter: Waiter | None = None  # made by the first wait, if it must wait
        self._callback: Callable[[PendingReply], None] | None = None
        self._settled = False
        self._value: Any = None
        self._error: BaseException | None = None
        #: Why the actor stopped before answering (its ``ActorStopped`` is made when
        #: someone looks: a cancelled tree of a thousand children builds none).
        self._stopped: str | None = None
        self.request_id = next(_request_ids)

    def done(self) -> bool:
        """Whether the reply (or its error) has arrived."""
        return self._settled

    def set_result(self, value: object) -> None:
        if not self._settled:
            self._settled = True
            self._value = value
            self._settled_now()

    def set_error(self, error: BaseException) -> None:
        if not self._settled:
            self._settled = True
            self._error = error
            self._settled_now()

    def set_stopped(self, reason: str) -> None:
        """Settle with ``ActorStopped``: the actor stopped (for ``reason``) first.
        (``_settled_now`` inlined: a cancelled tree settles one of these per actor.)"""
        if not self._settled:
            self._settled = True
            self._stopped = reason
            if self._waiter is not None:
                wake(self._waiter)
            if self._callback is not None:
                self._callback(self)

    @property
    def error(self) -> BaseException | None:
        """The error the ask settled with, if it did (None for an answer, or not yet)."""
        if self._error is None and self._stopped is not None:
            self._error = ActorStopped(self._cell.id, self._stopped)
        return self._error

    def _settled_now(self) -> None:
        if self._waiter is not None:
            wake(self._waiter)
        if self._callback is not None:
            self._callback(self)

    def add_done_callback(self, callback: Callable[[PendingReply], None]) -> None:
        """Call ``callback(reply)`` once the reply settles (at once if it has).

        It runs synchronously in the task that settles the reply (usually the
        actor's), so it must be quick and must not raise. One callback per reply:
        this is how a parent waits for many asks without a task for each.
        """
        if self._callback is not None:
            raise RuntimeError("this reply already has a done callback")
        self._callback = callback
        if self._settled:
            callback(self)

    def result(self) -> Any:
        """The reply if it has arrived; raises its error, or ``RuntimeError`` if not yet."""
        if not self._settled:
            raise RuntimeError(f"no reply yet from actor {self._cell.id!r}; await wait() first")
        error = self.error
        if error is not None:
            raise error
        return self._value

    async def wait(self, timeout: float | None = None) -> Any:
        """Wait for the reply and return it (or raise its error).

        On timeout or cancellation the ask is withdrawn: a late answer is dropped.
        """
        if not self._settled:
            try:
                if timeout is None:
                    await self._settle()
                else:
                    with anyio.fail_after(timeout):
                        await self._settle()
            except TimeoutError:
                self._withdraw()
                raise AskTimeout(self._cell.id, timeout or 0.0, self._message) from None
            except BaseException:
                self._withdraw()
                raise
        error = self.error
        if error is not None:
            raise error
        return self._value

    async def _settle(self) -> None:
        """Wait until settled; a checkpoint even when it already is."""
        if self._settled:
            await anyio.lowlevel.checkpoint()
            return
        if self._waiter is None:
            self._waiter = new_waiter()
        await park(self._waiter)

    def _withdraw(self) -> None:
        self._cell.pending.pop(self.request_id, None)


class ActorRef:
    """A handle to a running actor. Cheap to copy and to pass around."""

    __slots__ = ("_cell",)

    def __init__(self, cell: Cell) -> None:
        self._cell = cell

    @property
    def id(self) -> str:
        """The actor's id, unique within its runtime."""
        return self._cell.id

    @property
    def name(self) -> str:
        return self._cell.name

    @property
    def runtime(self) -> Runtime:
        """The runtime the actor runs in."""
        return self._cell.runtime

    def __repr__(self) -> str:
        state = "stopped" if self._cell.stopped else "running"
        return f"<ActorRef {self._cell.id!r} {state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorRef) and other._cell is self._cell

    def __hash__(self) -> int:
        return hash(self._cell.id)

    @property
    def stopped(self) -> bool:
        """Whether the actor has stopped (it will handle nothing more)."""
        return self._cell.stopped

    async def tell(self, message: object, *, sender: str = "") -> None:
        """Send ``message`` without waiting for an answer; waits while the mailbox is full."""
        cell = self._cell
        cell.check_accepts(message)
        await cell.mailbox.send(Envelope(message=message, sender=sender))

    def tell_nowait(self, message: object, *, sender: str = "") -> None:
        """Send ``message`` now, or raise ``MailboxFull`` if the mailbox is at capacity."""
        cell = self._cell
        cell.check_accepts(message)
        cell.mailbox.send_nowait(Envelope(message=message, sender=sender))

    def ask_nowait(self, message: object, *, sender: str = "") -> PendingReply:
        """Queue a request now and return its ``PendingReply``; raises ``MailboxFull``."""
        cell = self._cell
        cell.check_accepts(message)
        reply = PendingReply(cell, message)
        cell.pending[reply.request_id] = reply
        try:
            cell.mailbox.send_nowait(
                Envelope(message=message, request_id=reply.request_id, sender=sender)
            )
        except BaseException:
            reply._withdraw()
            raise
        return reply

    async def ask_pending(self, message: object, *, sender: str = "") -> PendingReply:
        """Queue a request, waiting for room in the mailbox if it is full, and return
        its ``PendingReply`` (to ``wait`` for, or to be told of with a callback)."""
        try:
            return self.ask_nowait(message, sender=sender)
        except MailboxFull:
            pass
        cell = self._cell
        reply = PendingReply(cell, message)
        cell.pending[reply.request_id] = reply
        try:
            await cell.mailbox.send(
                Envelope(message=message, request_id=reply.request_id, sender=sender)
            )
        except BaseException:
            reply._withdraw()
            raise
        return reply

    def inspect(self, message: object) -> Any:
        """Ask the actor a control question (``Actor.controls``) and get its answer at
        once, past the mailbox: ``Actor.control`` answers it between two of the
        actor's awaits, even while a long message is being handled."""
        cell = self._cell
        if cell.stopped:
            raise ActorStopped(cell.id, "stopped")
        actor = cell.actor
        if not isinstance(message, actor.controls):
            expected = " or ".join(kind.__qualname__ for kind in actor.controls) or "nothing"
            raise UnknownMessage(cell.id, message, f"a control message ({expected})")
        return actor.control(message)

    async def ask(self, message: object, *, timeout: float | None = None, sender: str = "") -> Any:
        """Send ``message`` and wait for the actor's answer.

        The timeout covers both the wait for room in the mailbox and the wait for
        the answer; it raises ``AskTimeout``. A handler's exception is raised here.
        """
        if timeout is not None:
            _check_timeout(timeout)
        cell = self._cell
        cell.check_accepts(message)
        reply = PendingReply(cell, message)
        cell.pending[reply.request_id] = reply
        envelope = Envelope(message=message, request_id=reply.request_id, sender=sender)
        mailbox = cell.mailbox
        try:
            if timeout is None:
                # Waiting for the reply is the checkpoint; only a full mailbox waits here.
                try:
                    mailbox.send_nowait(envelope)
                except MailboxFull:
                    await mailbox.send(envelope)
                await reply._settle()
            else:
                with anyio.fail_after(timeout):
                    await mailbox.send(envelope)
                    await reply._settle()
        except TimeoutError:
            reply._withdraw()
            raise AskTimeout(cell.id, timeout or 0.0, message) from None
        except BaseException:
            reply._withdraw()
            raise
        error = reply.error
        if error is not None:
            raise error
        return reply._value

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop the actor and wait until it has.

        New messages are refused at once; those already queued are handled first.
        With ``grace``, whatever is still running after that many seconds is cancelled.
        """
        await self._cell.stop(grace=grace)

    def stop_nowait(self) -> None:
        """Ask the actor to stop once its queued messages are handled; never waits.

        New messages are refused at once. Unlike ``cancel``, nothing is interrupted.
        """
        self._cell.stop_nowait()

    def cancel(self) -> None:
        """Cancel the actor now: its current handler is interrupted, nothing more runs."""
        self._cell.cancel()

    async def wait_stopped(self) -> None:
        """Wait until the actor has stopped, for whatever reason."""
        await self._cell.wait_finished()

    def statistics(self) -> MailboxStatistics:
        """A snapshot of the actor's mailbox."""
        return self._cell.mailbox.statistics()


def _check_timeout(timeout: object) -> None:
    """``timeout`` is a number of seconds (0 or less times out at once), never NaN."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if math.isnan(timeout):
        raise ValueError("timeout must be a number of seconds or None, got nan")
