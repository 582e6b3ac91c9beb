"""A lease and its messages: the parts of the ledger that cross between hosts.

A subtree placed on another host runs under a ``Lease`` of its parent's budgets
here, shared with its parent's other subtrees on that host (each a ``Member`` of
it; ``_ledger`` grants, holds and takes back headroom). What crosses between hosts
about it: each subtree's ``Tally`` (what it used, what it holds in flight), the
``Want`` of an operation waiting there for more, a ``Refusal`` (a
``BudgetExceeded``, whole); and on each node here, ``Held``: what the leases below
it hold. ``HeldUp`` is the signal of a charge that must wait for held headroom.

Nothing here knows the tree: a node holds a ``Lease``, a ``Held`` and a ``Lender``
(``_tree``), so they sit below it; the ledger above both keeps its own asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import msgspec

from ._budget import FIELDS, LEASED, Budget, Usage
from ._exceptions import BudgetExceeded
from ._snapshots import NodeSnapshot

__all__ = [
    "HINT",
    "LEASED",
    "LOST_WHY",
    "Held",
    "HeldUp",
    "Lease",
    "Lender",
    "Member",
    "Refusal",
    "Tally",
    "Want",
    "reserved",
    "zero",
]

#: The node a lender is asked for (``Node``: the tree sits above the leases).
_N_contra = TypeVar("_N_contra", contravariant=True)


class HeldUp(Exception):
    """A charge must wait: the headroom it needs is held by a lease (or, on a host,
    the lease ran out and more was asked for). Retry after ``Ledger.changed``.
    Caught only by the supervisor (``Supervisor.try_charge`` and ``try_open`` make it
    a value, ``charge_waiting`` and ``open_waiting`` a wait): no layer above sees it."""


class Tally(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a remote subtree used so far: its top node's totals (requests in flight
    are counted, as everywhere), its own usage, and what requests in flight hold."""

    usage: Usage = Usage()
    own: Usage = Usage()
    steps: int = 0
    own_steps: int = 0
    agents: int = 0
    reserved_input: int = 0
    reserved_output: int = 0
    reserved_cost: float = 0.0
    #: The executions of the subtree that may send a model request next (its top's
    #: ``leaves``): how many parts of the tree's headroom its lease stands for.
    leaves: int = 1

    def used(self, field: str) -> float:
        """What the subtree used of leased field ``field``."""
        usage = self.usage
        if field in _SUMS:
            total: float = sum(getattr(usage, part) for part in _SUMS[field])
            return total
        value: float = getattr(usage if field in _IN_USAGE else self, field)
        return value

    def reserved(self, field: str) -> float:
        """What the subtree's requests in flight hold of leased field ``field``."""
        return reserved(field, self.reserved_input, self.reserved_output, self.reserved_cost)


class Want(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The least headroom an operation waiting on a host needs, field by field
    (0: this field is not what it waits for): one field for each of ``LEASED``."""

    tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    requests: int = 0
    tool_calls: int = 0
    steps: int = 0
    agents: int = 0
    #: What it is, in words ("a model request of 2,212 input + 256 output").
    detail: str = ""
    #: For a model request: the output it would like (its ``max_tokens``), beyond the
    #: minimum its token fields count: a lease grows by whole requests, not minima.
    wanted_output: int = 0
    #: For a model request cut deep by what its lease had left: the output its fair
    #: part of the budget here leaves it (granted when free, never waited for).
    fair_output: int = 0

    def merge(self, other: Want) -> Want:
        """The larger of two wants, field by field."""
        fields = {name: max(getattr(self, name), getattr(other, name)) for name in LEASED}
        wanted = max(self.wanted_output, other.wanted_output)
        fair = max(self.fair_output, other.fair_output)
        return Want(
            **fields,
            detail=other.detail or self.detail,
            wanted_output=wanted,
            fair_output=fair,
        )

    def whole(self, name: str) -> float:
        """What a whole operation of this want takes of field ``name``: its need, or
        for a model request's token and cost fields, with all the output it wants."""
        need: float = getattr(self, name)
        more = self.wanted_output - self.output_tokens
        if more <= 0 or not need:
            return need
        if name in ("tokens", "output_tokens"):
            return need + more
        if name == "cost":  # (a bound: the minimum's cost, scaled)
            return need * self.wanted_output / max(self.output_tokens, 1)
        return need

    def fair(self, name: str) -> float:
        """What an operation of this want takes of field ``name`` with its fair output
        (``fair_output``; its need when it has none)."""
        need: float = getattr(self, name)
        more = self.fair_output - self.output_tokens
        if more <= 0 or not need or name not in ("tokens", "output_tokens", "cost"):
            return need
        if name == "cost":
            return need * self.fair_output / max(self.output_tokens, 1)
        return need + more

    @staticmethod
    def of(name: str, amount: float) -> Want:
        """A want of ``amount`` of field ``name`` alone."""
        return Want(**{name: amount})  # type: ignore[arg-type]


class Refusal(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A ``BudgetExceeded`` as it crosses between hosts."""

    limit: str
    allowed: float
    node_id: str
    node_name: str
    need: float | None = None
    left: float | None = None
    need_detail: str = ""
    why: str = ""

    @classmethod
    def of(cls, error: BudgetExceeded) -> Refusal:
        return cls(
            limit=error.limit,
            allowed=error.allowed,
            node_id=error.node_id,
            node_name=error.node_name,
            need=error.need,
            left=error.left,
            need_detail=error.need_detail,
            why=error.why,
        )

    def error(self) -> BudgetExceeded:
        return BudgetExceeded(
            self.limit,
            self.allowed,
            self.node_id,
            self.node_name,
            need=self.need,
            left=self.left,
            need_detail=self.need_detail,
            why=self.why,
        )


class Lender(Protocol[_N_contra]):
    """Where a host's subtree asks for more headroom when its lease runs out (a
    ``Lender[Node]`` on the subtree's top node there)."""

    #: What each leased field had free for each part of the lease (each execution
    #: there that may ask next) when it last grew (``Ledger.extend``): a request cut
    #: by what is left of the lease asks for more only once a part is worth less
    #: than half of that, spent or shared by more subtrees (before, its cut is its
    #: fair share of the budget)...
    fresh: dict[str, float]
    #: ... or once the tree above said that a part of its budget is worth more than
    #: ``HINT`` times what the lease has left for each of its own parts
    #: (``Ledger.hint``: siblings ended and gave back), field by field.
    hint: dict[str, float]

    @property
    def asking(self) -> bool:
        """Whether an ask waits for its answer (then nothing more is admitted)."""

    def want(self, node: _N_contra, want: Want) -> None:
        """Ask (without waiting) for at least ``want`` more; the answer comes later
        as ``Ledger.extend`` or ``Ledger.refuse``."""


class Held:
    """The headroom leases hold on one node: the sum over the leases below it, one
    attribute for each of ``LEASED`` (those read by name are typed here)."""

    __slots__ = (*LEASED, "holding", "leases", "lost", "parts")
    tokens: int
    input_tokens: int
    output_tokens: int
    requests: int
    tool_calls: int
    steps: int
    agents: int
    cost: float

    def __init__(self) -> None:
        for name in LEASED:
            setattr(self, name, zero(name))
        #: Leases below this node that may still give something back (not ended, not
        #: lost), and those of them holding a grant (not asking for more right now).
        self.leases = 0
        self.holding = 0
        #: The parts the leases below stand for beyond the one their node counts in
        #: ``Node.leaves``: a subtree of ten executions elsewhere is ten parts here;
        #: one that ended there, its node here still open, none (``Member.ending``).
        self.parts = 0
        #: Of what is held, what leases of lost hosts hold: it never comes back.
        self.lost: Held | None = None

    def alive(self, name: str) -> float:
        """What leases that may still give something back hold of field ``name``."""
        lost = self.lost
        held: float = getattr(self, name)
        return held - getattr(lost, name) if lost is not None else held


class Member:
    """One remote subtree of a ``Lease``: what its host last reported of it."""

    __slots__ = ("ending", "leaves", "live", "nodes", "tally")

    def __init__(self) -> None:
        self.tally = Tally()
        #: The parts of the headroom it stands for (its ``Tally.leaves``; none once
        #: it ended on its host, though its node here closes only once its answer is
        #: taken: ``ending`` till then, its node's leaf counted out in ``Held.parts``).
        self.leaves = 1
        #: The last snapshot of the subtree's nodes below its top, from its host.
        self.nodes: tuple[NodeSnapshot, ...] = ()
        self.live = True
        self.ending = False


class Lease:
    """The headroom one node here leases to one host: a **pool** its subtrees
    there (the node's children placed on that host while one of them runs) draw
    from together, so that they ask the driver as one. A node of each of them
    points to it (``Node.lease``); what the lease holds sits on the chain of the
    node they hang from (its *anchor*)."""

    __slots__ = (
        "base",
        "close",
        "count",
        "depth",
        "fields",
        "granted",
        "hinted",
        "hold",
        "holding",
        "host",
        "idle",
        "key",
        "level",
        "live",
        "lost",
        "members",
        "reclaim",
        "reclaiming",
        "ref",
        "reserved",
        "tainted",
        "tell",
        "used",
        "weight",
    )

    def __init__(self, fields: tuple[str, ...], depth: int | None) -> None:
        #: The host its subtrees run on (its name, for snapshots and reasons).
        self.host = ""
        #: What groups subtrees into this pool (their host's link; None: a pool of
        #: one), and the pool's number there (set by the layer that runs it).
        self.key: object = None
        self.ref = 0
        #: Its subtrees, live and ended, by their nodes here.
        self.members: dict[object, Member] = {}
        #: How many of them are live (not ended).
        self.count = 0
        #: The limited fields of the anchor's chain: the only ones leased.
        self.fields = fields
        #: How much deeper a subtree may grow below its top node (None: no limit).
        self.depth = depth
        #: The remote limits: what was granted in all, field by field.
        self.granted: dict[str, float] = {name: zero(name) for name in fields}
        #: What this lease holds on the chain now (granted, not reported used).
        self.hold: dict[str, float] = {name: zero(name) for name in fields}
        #: What its subtrees used (reported) and what their requests in flight hold,
        #: in all, field by field.
        self.used: dict[str, float] = {name: zero(name) for name in fields}
        self.reserved: dict[str, float] = {name: zero(name) for name in fields}
        #: The parts of the headroom it stands for: its live subtrees' ``leaves``
        #: (each counted in ``Held.parts`` beyond the one its node is here).
        self.weight = 0
        #: What a part of the budget above was worth, field by field, when the lease
        #: last grew or was told (``Ledger.hint``), and how to tell its host (set
        #: by the layer that runs the subtree there; None: nobody to tell).
        self.hinted: dict[str, float] = {}
        self.tell: Callable[[dict[str, float]], None] | None = None
        #: How to tell its host that the lease ended while idle (its anchor closed).
        self.close: Callable[[], None] | None = None
        #: How to ask its host to give back what it holds beyond a fair share: at
        #: most this much free headroom kept, field by field (``Ledger._reclaim``;
        #: None: nobody to ask), and the fields it was asked for since it was last
        #: granted, True until its host answers with its new limits
        #: (``Ledger.kept``) or asks.
        self.reclaim: Callable[[dict[str, float]], None] | None = None
        self.reclaiming: dict[str, bool] = {}
        #: Counted in ``Held.leases`` (it may give back) and ``Held.holding`` (it holds a
        #: grant and is not asking) on the chain.
        self.live = False
        self.holding = False
        self.lost = False
        #: No subtree of it runs now: it gave back all it held and waits for its
        #: anchor's next subtree on that host; then it is granted again, from what
        #: is free and with no round trip, what it was granted while it was live
        #: (``level``, field by field: what its subtrees used, and what it held).
        self.idle = False
        self.level: dict[str, float] = {}
        #: What its subtrees had used when it last became live (what it was granted
        #: beyond that is the ``level`` it goes idle with).
        self.base: dict[str, float] = {}
        #: A subtree of it was lost alone (its host did not answer a stop): what
        #: the lease holds when it ends stays held, as a lost host's.
        self.tainted = False

    def limits(self) -> Budget:
        """The pool's limits on its host: its lease, as a ``Budget`` (no depth: each
        subtree carries it, ``Ledger.own_limits``)."""
        fields: dict[str, float] = {}
        for name, value in self.granted.items():
            fields[name] = value if name in _FRACTIONAL else int(value)
        return Budget(**fields)  # type: ignore[arg-type]


LOST_WHY = "no room left: what is held is leased to a host that was lost"

#: How much more a part of the budget above must be worth before a lease's host is
#: told (``Ledger.hint``: then a part's worth grows geometrically from one message to
#: the next), and before a request there cut by what is left of its lease asks for
#: more than that (worth this many times what the lease has left for each part).
HINT = 1.5


def reserved(name: str, input: int, output: int, cost: float) -> float:
    """What requests in flight holding ``input``, ``output`` tokens and ``cost`` (on a
    node, or in a tally) hold of field ``name``."""
    if name == "tokens":
        return input + output
    if name == "input_tokens":
        return input
    if name == "output_tokens":
        return output
    if name == "cost":
        return cost
    return 0


def zero(name: str) -> float:
    """Nothing, in the field's kind (a float for cost, an int for every count)."""
    return 0.0 if name in _FRACTIONAL else 0


#: Fields that are sums of others (tokens), with their parts.
_SUMS = {field.name: field.parts for field in FIELDS if field.parts}
#: Leased fields ``Usage`` carries (the others a ``Tally`` carries beside it).
_IN_USAGE = frozenset(field.name for field in FIELDS if field.usage)
#: Fields whose values are not whole numbers.
_FRACTIONAL = frozenset(field.name for field in FIELDS if not field.whole)
