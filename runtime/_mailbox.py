"""A private, bounded mailbox: the only way into an actor.

A queue of envelopes with a fixed capacity and one receiver (the actor's task). A
full mailbox makes ``send`` wait (backpressure) and ``send_nowait`` raise
``MailboxFull``; it never grows without bound. Closing it refuses new messages at
once while the ones already queued stay there for the actor to handle.

It is written here rather than on anyio's memory object streams for size and speed:
an idle actor waits on one waiter (``_waiter.py``) instead of a stream pair, its
shared state, an ``anyio.Event`` and the ``WouldBlock`` its wait keeps alive (about
3 KiB less per actor), and a message that is already queued is taken without a trip
through the event loop. So that a busy actor still lets others run and still sees
its cancellation, ``receive`` checkpoints once every ``_STREAK`` messages taken
without waiting.
"""

from __future__ import annotations

import anyio.lowlevel

from ._exceptions import ActorStopped, MailboxFull
from ._messages import Envelope, MailboxStatistics
from ._waiter import Waiter, new_waiter, park, wake

__all__ = ["Mailbox"]

#: Messages a receiver takes in a row without waiting before it checkpoints.
_STREAK = 16

#: How many taken slots the queue's list keeps before it is compacted.
_COMPACT_AFTER = 64


class Mailbox:
    """The bounded queue of envelopes in front of one actor."""

    __slots__ = (
        "_head",
        "_queue",
        "_receiver",
        "_senders",
        "_streak",
        "actor_id",
        "capacity",
        "failed",
        "handled",
        "reason",
    )

    def __init__(self, actor_id: str, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(
                f"mailbox capacity must be a whole number of at least 1, got {capacity!r}"
            )
        self.actor_id = actor_id
        self.capacity = capacity
        self.handled = 0
        self.failed = 0
        #: Why the mailbox was closed; empty while it is open.
        self.reason = ""
        # The queue is ``_queue[_head:]``: a list and an index are 700 bytes smaller
        # than an empty deque, and taking a message is still O(1) (amortized).
        self._queue: list[Envelope | None] = []
        self._head = 0
        self._receiver: Waiter | None = None  # the actor, parked on an empty mailbox
        self._senders: list[Waiter] = []  # senders parked on a full one, oldest first
        self._streak = 0

    @property
    def closed(self) -> bool:
        return bool(self.reason)

    def __len__(self) -> int:
        """How many messages are queued."""
        return len(self._queue) - self._head

    def send_nowait(self, envelope: Envelope) -> None:
        """Queue ``envelope`` now, or raise ``MailboxFull`` / ``ActorStopped``."""
        if self.reason:
            raise ActorStopped(self.actor_id, self.reason)
        queue = self._queue
        if len(queue) - self._head >= self.capacity:
            raise MailboxFull(self.actor_id, self.capacity)
        queue.append(envelope)
        receiver = self._receiver
        if receiver is not None:
            self._receiver = None
            wake(receiver)

    async def send(self, envelope: Envelope) -> None:
        """Queue ``envelope``, waiting for room while the mailbox is full.

        A checkpoint, like every anyio send, and like them it either queues the
        envelope or raises (cancelled, ``ActorStopped``), never both.
        """
        await anyio.lowlevel.checkpoint()
        while True:
            try:
                self.send_nowait(envelope)
            except MailboxFull:
                pass
            else:
                return
            waiter = new_waiter()
            senders = self._senders
            senders.append(waiter)
            try:
                await park(waiter)
            except BaseException:
                try:
                    senders.remove(waiter)
                except ValueError:
                    # Woken for a free slot but leaving: pass the turn to the next one.
                    self._wake_sender()
                raise

    def _wake_sender(self) -> None:
        if self._senders:
            wake(self._senders.pop(0))

    async def receive(self) -> Envelope | None:
        """The next envelope, or ``None`` once the mailbox is closed and drained.

        For the actor's own task only: a mailbox has one receiver.
        """
        while True:
            envelope = self.receive_nowait()
            if envelope is not None:
                self._streak += 1
                if self._streak >= _STREAK:
                    self._streak = 0
                    await anyio.lowlevel.checkpoint()
                return envelope
            if self.reason:
                return None
            self._streak = 0
            waiter = self._receiver = new_waiter()
            try:
                await park(waiter)
            finally:
                if self._receiver is waiter:
                    self._receiver = None

    def receive_nowait(self) -> Envelope | None:
        """The next queued envelope if there is one, else ``None``; never waits."""
        queue = self._queue
        head = self._head
        if head == len(queue):
            return None
        envelope = queue[head]
        head += 1
        if head == len(queue):
            queue.clear()
            head = 0
        else:
            queue[head - 1] = None  # not kept alive by the queue once taken
            if head >= _COMPACT_AFTER and head * 2 >= len(queue):
                del queue[:head]
                head = 0
        self._head = head
        if self._senders:
            self._wake_sender()
        return envelope

    def close(self, reason: str) -> None:
        """Refuse new messages; what is queued stays for the actor to handle."""
        if not self.reason:
            self.reason = reason
        receiver = self._receiver
        if receiver is not None:
            self._receiver = None
            wake(receiver)
        senders = self._senders
        while senders:
            wake(senders.pop(0))  # each finds the mailbox closed: ActorStopped

    def discard(self, reason: str = "stopped") -> list[Envelope]:
        """Close the mailbox (with ``reason`` unless it was closed already) and return
        what was still queued (the actor is gone)."""
        self.close(reason)
        left: list[Envelope] = []
        if self._head == len(self._queue):
            return left
        while (envelope := self.receive_nowait()) is not None:
            left.append(envelope)
        return left

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(
            actor_id=self.actor_id,
            capacity=self.capacity,
            queued=len(self),
            waiting_senders=len(self._senders),
            handled=self.handled,
            failed=self.failed,
            closed=self.closed,
        )
