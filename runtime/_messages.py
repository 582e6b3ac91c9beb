"""What travels through a mailbox, and the snapshots the kernel hands out.

Every type here is a frozen msgspec Struct: it can be encoded to JSON or MessagePack
and decoded back (invariant 6 of DESIGN.md), which is what lets a store or another
process read it later. Nothing that crosses an actor boundary needs pickle.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ._rates import LaneStatistics

__all__ = ["Envelope", "MailboxStatistics", "RuntimeStatistics"]


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """One message in a mailbox.

    ``request_id`` is 0 for a ``tell`` (nobody waits for a reply) and a positive
    number, unique within the runtime, for an ``ask``. The reply itself never
    travels in the envelope: the kernel routes it to the asker by that number.
    """

    message: Any
    request_id: int = 0
    sender: str = ""


class MailboxStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one actor's mailbox."""

    actor_id: str
    capacity: int
    queued: int
    waiting_senders: int
    handled: int
    failed: int
    closed: bool


class RuntimeStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a whole runtime."""

    live_actors: int
    spawned: int
    stopped: int
    handled: int
    failed: int
    pending_asks: int
    #: Model requests waiting for budget now (headroom held by requests in flight).
    budget_waiting: int = 0
    #: Model requests that had to wait for budget, since the runtime started.
    budget_waits: int = 0
    #: Seconds those requests spent waiting, in all.
    budget_wait_seconds: float = 0.0
    #: Asks of subtrees on other hosts for more headroom answered by this runtime's
    #: ledger (each a round trip), those refused, and those that waited for headroom.
    lease_asks: int = 0
    lease_refusals: int = 0
    lease_waits: int = 0
    #: Model requests that waited for a rate limit, the seconds they waited, and the
    #: requests servers refused (429s), over every lane; and each lane (a model's)
    #: as it is now.
    rate_waits: int = 0
    rate_wait_seconds: float = 0.0
    rate_refused: int = 0
    lanes: dict[str, LaneStatistics] = {}
