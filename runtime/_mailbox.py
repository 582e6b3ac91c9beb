"""A private, bounded mailbox: the only way into an actor.

A thin layer over an anyio memory object stream with a fixed capacity. A full
mailbox makes ``send`` wait (backpressure) and ``send_nowait`` raise ``MailboxFull``;
it never grows without bound. Closing it refuses new messages at once while the
ones already queued stay there for the actor to handle.
"""

from __future__ import annotations

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._exceptions import ActorStopped, MailboxFull
from ._messages import Envelope, MailboxStatistics

__all__ = ["Mailbox"]

# Subscripted once: ``create_memory_object_stream[Envelope]`` builds a typing alias.
_create_stream = anyio.create_memory_object_stream[Envelope]


class Mailbox:
    """The bounded queue of envelopes in front of one actor."""

    __slots__ = (
        "_receive",
        "_send",
        "actor_id",
        "capacity",
        "failed",
        "handled",
        "reason",
        "receive_stream",
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
        send: MemoryObjectSendStream[Envelope]
        receive: MemoryObjectReceiveStream[Envelope]
        send, receive = _create_stream(capacity)
        self._send = send
        self._receive = receive
        #: The raw receiving end, for the actor's own loop only (its hot path).
        self.receive_stream = receive

    @property
    def closed(self) -> bool:
        return bool(self.reason)

    def send_nowait(self, envelope: Envelope) -> None:
        """Queue ``envelope`` now, or raise ``MailboxFull`` / ``ActorStopped``."""
        try:
            self._send.send_nowait(envelope)
        except anyio.WouldBlock:
            raise MailboxFull(self.actor_id, self.capacity) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ActorStopped(self.actor_id, self.reason or "stopped") from None

    async def send(self, envelope: Envelope) -> None:
        """Queue ``envelope``, waiting for room while the mailbox is full."""
        try:
            await self._send.send(envelope)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ActorStopped(self.actor_id, self.reason or "stopped") from None

    async def receive(self) -> Envelope | None:
        """The next envelope, or ``None`` once the mailbox is closed and drained."""
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None

    def receive_nowait(self) -> Envelope | None:
        """The next queued envelope if there is one, else ``None``; never waits."""
        try:
            return self._receive.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return None

    def close(self, reason: str) -> None:
        """Refuse new messages; what is queued stays for the actor to handle."""
        if not self.reason:
            self.reason = reason
        self._send.close()

    def discard(self) -> list[Envelope]:
        """Close both ends and return what was still queued (the actor is gone)."""
        self.close(self.reason or "stopped")
        left: list[Envelope] = []
        while (envelope := self.receive_nowait()) is not None:
            left.append(envelope)
        self._receive.close()
        return left

    def statistics(self) -> MailboxStatistics:
        stats = self._send.statistics()
        return MailboxStatistics(
            actor_id=self.actor_id,
            capacity=self.capacity,
            queued=stats.current_buffer_used,
            waiting_senders=stats.tasks_waiting_send,
            handled=self.handled,
            failed=self.failed,
            closed=self.closed,
        )
