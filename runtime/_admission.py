"""Admission of model requests: what one request needs, and what a budget has room for.

The admission (``Admission``, a part of the supervisor) asks three questions of
every node of a request's chain that has a budget, in this order:

1. **Is it spent?** The node's *settled* usage (what requests that finished really
   used) leaves no room for this request's minimum: its input estimate plus a
   minimum output (``Admission.min_output_tokens``, capped by the request's own
   ``max_tokens``), or that much cost. Only then is a request refused, and the
   node stopped: headroom that other requests merely hold never refuses anyone.
2. **Must it wait?** The headroom that in-flight requests do not hold is too small
   for the minimum, or earlier requests already wait on that node (first come,
   first served). The request waits until a reservation settles.
3. **How much may it reserve?** Its output cap: the request's own ``max_tokens`` (or
   the default) but no more than a fair share of the free headroom: one part for
   each running execution under that budget that may send the next request (one
   with no running children: a parent waits for its subagents) and holds none of
   it yet; all of it for an execution alone under its budget; never less than the
   minimum.
   Children started together thus share what is left instead of the first one
   taking it all and the others waiting for it. A reply cut by that sharing, or
   at the default of a request that names no cap (sent uncapped without a
   budget), is asked again with room for twice as much (``Reservation.again``):
   the default is where a reservation starts, never a bound on the reply.

``Admission`` holds the requests waiting for headroom (a line per node, first come
first served) and does the waiting (``reserve``), the charging (``settle``) and the
admit loop over a request's chain (``admit``); it stops a subtree through the
``stop`` it is handed and knows nothing of the supervisor, which hands its methods
on as its own. The functions are synchronous arithmetic on the nodes (and the
record of one waiting request, ``Wait``): ``hold`` counts a request and holds its
headroom on the chain, ``want_of`` says what a request waiting on a leased subtree
asks the tree above for, and ``overshoot`` words a limit that settled usage went
past. ``impossible`` says what cannot be true in a model's reported usage,
``over_limit`` which limit settled usage went past (an estimate fell short), and
``requests_room`` how many requests a model reports beyond those admitted (a retry
loop of its own) the chain has room for: counters never pass a limit.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import anyio

from ._budget import Budget, Price, Usage
from ._exceptions import BudgetExceeded, InvalidUsage
from ._lease import HINT, LOST_WHY, Lender, Want
from ._tree import Node, stopped
from ._waiter import Waiter, new_waiter, park, wake

if TYPE_CHECKING:
    from ._snapshots import EndStatus

__all__ = [
    "MAX_TOKENS_PER_REQUEST",
    "Admission",
    "Need",
    "OutputSharing",
    "Reservation",
    "Wait",
    "ahead",
    "chain_refusal",
    "field_free",
    "free_output",
    "hold",
    "impossible",
    "no_price",
    "over_limit",
    "overshoot",
    "part_back",
    "refusal",
    "requests_room",
    "settled_output",
    "want_of",
    "why_waiting",
]

#: Relative slack for comparing costs (floating point sums).
_COST_EPSILON = 1e-9

#: How requests in flight under one output-capping limit share its headroom: a fair
#: share each (``"fair"``), or all a request wants, waiting for requests in flight
#: when it is not free (``"whole"``).
OutputSharing = Literal["fair", "whole"]


class Need:
    """What one request needs at least: its input estimate and a minimum output."""

    __slots__ = ("asked", "fair", "input", "least", "model", "output", "price", "wanted")

    def __init__(
        self, input: int, output: int, wanted: int, price: Price | None, model: str = ""
    ) -> None:
        #: Whether it asked the tree above a leased subtree for room for all it wants
        #: (once: what the answer leaves room for is then its fair share).
        self.asked = False
        #: On a leased subtree, once a cut by what its lease has left was deep: the
        #: output its fair part of the budget above leaves it, asked for (a second
        #: ask at most), and then taken from the lease when there (0: not asked).
        self.fair = 0
        self.input = input
        #: The model's name (its price is looked up by it).
        self.model = model
        #: The minimum output: below this the request is not worth sending.
        self.output = output
        #: The ordinary minimum, when ``output`` asks for more (a request asked again
        #: after a cut wants room for more, but is refused only below this).
        self.least = output
        #: The output the request would like: its max_tokens, or the default.
        self.wanted = wanted
        self.price = price

    def cost(self, output: int) -> float:
        price = self.price
        return price.cost(self.input, output) if price is not None else 0.0

    def detail(self) -> str:
        return f"{self.input:,} input + {self.output:,} output"


class Reservation:
    """Headroom held for one model request until its real usage is known.

    ``max_tokens`` is what the request may ask for (None: no output limit applies and
    the request named none). ``limited_by`` names the node (and ``limit`` the field)
    whose headroom made it smaller than ``wanted``: a reply cut at that cap was cut
    by the budget's sharing, not by the request's own cap (``again`` says what a
    reply cut short is asked again with). ``requests`` is how many
    requests the call has counted: 1, and one more for each request a model built on
    another had admitted during the call (``Supervisor.charge(requests=1)``).
    """

    __slots__ = (
        "cost",
        "input",
        "limit",
        "limited_by",
        "max_tokens",
        "output",
        "price",
        "requests",
        "wanted",
    )

    def __init__(
        self,
        input: int,
        output: int,
        cost: float,
        max_tokens: int | None,
        price: Price | None,
        limited_by: Node | None = None,
        limit: str = "",
        wanted: int = 0,
    ) -> None:
        self.input = input
        self.output = output
        self.cost = cost
        self.max_tokens = max_tokens
        self.price = price
        self.limited_by = limited_by
        self.limit = limit
        self.wanted = wanted
        self.requests = 1

    def __repr__(self) -> str:
        return (
            f"<Reservation input={self.input} output={self.output} cost={self.cost:g} "
            f"max_tokens={self.max_tokens}>"
        )

    def again(self, output_tokens: int, own: bool) -> int | None:
        """The output to ask again with for a reply cut short (``finish_reason=
        "length"``) after ``output_tokens``, or None when the cut was not the budget's.

        ``own``: whether the request named a ``max_tokens`` of its own. A cut is the
        budget's when its sharing set the cap (``limited_by``): room for twice as much,
        up to what the request wants. It is the budget's too when the request named no
        cap and the reply ran into the output reserved for it (the admission's
        ``default_max_tokens``, or what it was asked again with after such a cut):
        without a budget it is sent uncapped, so it is asked again with room for twice
        as much, with no bound of its own (what settled usage leaves, and the fair
        share, bound it as any request's). A reply that stopped short of that cap was
        cut by the model itself (a provider's own output limit), as it is without a
        budget: it is not asked again.
        """
        cap = self.max_tokens
        if cap is None:
            return None
        if self.limited_by is not None:
            return 2 * self.output if not own else min(self.wanted, 2 * self.output)
        if not own and output_tokens >= cap:
            return 2 * cap
        return None


def requests_room(node: Node, extra: int) -> tuple[int, tuple[Node, int, int] | None]:
    """How many of ``extra`` requests that a model reports beyond those admitted
    ``node``'s chain has room for, and the highest node whose ``requests`` limit they
    would pass (with that limit and how many it had no room for), if any."""
    room = extra
    over: tuple[Node, int, int] | None = None
    current: Node | None = node
    while current is not None:
        budget = current.limits
        if budget is not None and budget.requests is not None:
            held = current.held
            left = budget.requests - current.requests - (held.requests if held else 0)
            if extra > left:
                over = (current, budget.requests, extra - max(left, 0))
                room = min(room, max(left, 0))
        current = current.parent
    return room, over


def chain_refusal(node: Node, need: Need, requests: int = 1) -> BudgetExceeded | None:
    """The first refusal on ``node``'s chain of budgets (not a leased subtree's,
    which asks for more headroom instead) of ``requests`` requests that need
    ``need`` together, or None."""
    current: Node | None = node
    while current is not None:
        budget = current.limits
        if budget is not None and current.lender is None:
            error = refusal(current, budget, need, requests)  # cost only with a price
            if error is not None:
                return error
        current = current.parent
    return None


def refusal(node: Node, budget: Budget, need: Need, requests: int = 1) -> BudgetExceeded | None:
    """The refusal of a request that ``node``'s settled usage has no room for, if so.

    Counters first (a request in flight counts: it will happen), then input tokens,
    output tokens, tokens and cost, each against settled usage only.
    """
    if budget.requests is not None and node.requests + requests > budget.requests:
        return BudgetExceeded("requests", budget.requests, node.id, node.name)
    if budget.input_tokens is not None:
        left = budget.input_tokens - node.input_tokens
        if need.input > left:
            return _refused(node, "input_tokens", budget.input_tokens, need.input, left, "")
    if budget.output_tokens is not None:
        left = budget.output_tokens - node.output_tokens
        if need.output > left:
            detail = f"{need.output:,} output"
            return _refused(node, "output_tokens", budget.output_tokens, need.output, left, detail)
    if budget.tokens is not None:
        left = budget.tokens - node.input_tokens - node.output_tokens
        total = need.input + need.output
        if total > left:
            return _refused(node, "tokens", budget.tokens, total, left, need.detail())
    if budget.cost is not None and need.price is not None:
        left_cost = budget.cost - node.cost
        if _cost_room(left_cost, budget.cost, need) < need.output:
            needed = need.cost(need.output)
            return _refused(node, "cost", budget.cost, needed, left_cost, need.detail())
    return None


def settled_output(node: Node, budget: Budget, need: Need) -> float:
    """The output tokens ``node``'s settled usage leaves for the request after its
    input (what ``refusal`` checks, as a number: ``math.inf`` with no output limit)."""
    room = math.inf
    if budget.output_tokens is not None:
        room = budget.output_tokens - node.output_tokens
    if budget.tokens is not None:
        room = min(room, budget.tokens - node.input_tokens - node.output_tokens - need.input)
    if budget.cost is not None and need.price is not None:
        room = min(room, _cost_room(budget.cost - node.cost, budget.cost, need))
    return room


def part_back(node: Node) -> None:
    """The node here of a remote subtree that ended on its host (its lease's member
    ``ending``: it stood for no part, its leaf counted out in ``Held.parts`` on its
    parent's chain) closes, or is placed again: its leaf counts as it did before
    (``Node.leaves``, which its close takes it out of, or its new lease's member)."""
    lease = node.lease
    member = lease.members.get(node) if lease is not None else None
    if member is None or not member.ending:
        return
    member.ending = False
    parent = node.parent
    assert parent is not None
    for current in parent.chain():
        held = current.held
        assert held is not None  # (the member's lease made it)
        held.parts += 1


def _lease_short(node: Node, lender: Lender[Node], name: str, parts: int) -> bool:
    """Whether a request on a host's leased subtree, cut by what its lease (on
    ``node``) has left of field ``name`` for each of its ``parts``, should ask the
    tree above for more: a part of the lease is worth less than half what it was
    when the lease last grew (it was spent, or more subtrees share it now), or a
    part of the budget above is worth ``HINT`` times as much."""
    per_part = field_free(node, name) / parts
    return 2 * per_part < lender.fresh.get(name, math.inf) or (
        lender.hint.get(name, 0) > HINT * per_part
    )


#: A request on a leased subtree cut below this share of its fair part of the budget
#: above (``fair_output``) asks for that part (once).
DEEP = 0.75


def fair_output(lender: Lender[Node], name: str, need: Need) -> float:
    """The output that a part of the budget above (what it last said a part is worth
    of field ``name``, ``Lender.hint``) leaves ``need`` after its input (0: not
    known)."""
    worth = lender.hint.get(name)
    if worth is None or worth == math.inf:
        return 0
    if name == "tokens":
        return worth - need.input
    if name == "cost":
        if need.price is None:
            return 0
        per_token = need.price.output_per_million / 1_000_000
        left = worth - need.cost(0)
        return left / per_token if per_token > 0 else 0
    return worth


def field_free(node: Node, name: str) -> float:
    """What ``node``'s budget has free of output-capping field ``name`` (tokens,
    output tokens or cost), in the field's own units: neither used, nor reserved by
    requests in flight, nor held by leases below."""
    budget = node.limits
    assert budget is not None
    limit: float = getattr(budget, name)
    held = node.held
    taken: float
    if name == "cost":
        taken = node.cost + node.reserved_cost + (held.cost if held else 0.0)
    elif name == "output_tokens":
        taken = node.output_tokens + node.reserved_output + (held.output_tokens if held else 0)
    else:
        taken = node.input_tokens + node.output_tokens + node.reserved_input
        taken += node.reserved_output + (held.tokens if held else 0)
    return limit - taken


def _cost_room(left: float, allowed: float, need: Need) -> float:
    """The output tokens that ``left`` of a cost budget of ``allowed`` pays for after
    the request's input (negative: not even the input), with the same slack for sums
    of floats in every check: what refuses and what waits never disagree."""
    assert need.price is not None
    left += _COST_EPSILON * allowed - need.cost(0)
    per_token = need.price.output_per_million / 1_000_000
    if per_token > 0:
        return math.floor(left / per_token)
    return math.inf if left >= 0 else -1


def _refused(
    node: Node, limit: str, allowed: float, need: float, left: float, detail: str
) -> BudgetExceeded:
    return BudgetExceeded(
        limit, allowed, node.id, node.name, need=need, left=left, need_detail=detail
    )


def free_output(node: Node, budget: Budget, need: Need) -> tuple[float, str]:
    """The output tokens ``node``'s budget can hold for one more request right now,
    after what in-flight requests hold, and the field that bounds it.

    ``math.inf`` when no output limit applies; below ``need.output`` (possibly
    negative) when the request must wait. Input tokens held by others count too: an
    input limit that cannot take the estimate now gives ``-1``.
    """
    room = math.inf
    field = ""
    held = node.held  # what leases of remote subtrees below hold
    held_input = held_output = held_tokens = 0
    held_cost = 0.0
    if held is not None:
        if budget.requests is not None and node.requests + held.requests + 1 > budget.requests:
            return -1, "requests"
        held_input, held_output = held.input_tokens, held.output_tokens
        held_tokens, held_cost = held.tokens, held.cost
    if budget.input_tokens is not None and (
        node.input_tokens + node.reserved_input + held_input + need.input > budget.input_tokens
    ):
        return -1, "input_tokens"
    if budget.output_tokens is not None:
        room = budget.output_tokens - node.output_tokens - node.reserved_output - held_output
        field = "output_tokens"
    if budget.tokens is not None:
        free = (
            budget.tokens
            - node.input_tokens
            - node.output_tokens
            - node.reserved_input
            - node.reserved_output
            - held_tokens
            - need.input
        )
        if free < room:
            room, field = free, "tokens"
    if budget.cost is not None and need.price is not None:
        cost_room = _cost_room(
            budget.cost - node.cost - node.reserved_cost - held_cost, budget.cost, need
        )
        if cost_room < room:
            room, field = cost_room, "cost"
    return room, field


class Wait:
    """One model request waiting for headroom, queued on the node that holds it up."""

    __slots__ = (
        "done",
        "error",
        "max_tokens",
        "need",
        "node",
        "queue",
        "reservation",
        "seq",
        "waiter",
    )

    def __init__(
        self, node: Node, need: Need, max_tokens: int | None, seq: int, waiter: Waiter
    ) -> None:
        self.node = node
        self.need = need
        self.max_tokens = max_tokens
        self.seq = seq
        self.waiter = waiter
        #: The node whose queue holds it now.
        self.queue: Node = node
        self.reservation: Reservation | None = None
        self.error: BudgetExceeded | None = None
        self.done = False


#: More tokens than this in one request's reported usage cannot be true.
MAX_TOKENS_PER_REQUEST = 100_000_000


def over_limit(node: Node, budget: Budget) -> tuple[Node, str, float, float] | None:
    """The first request, token or cost limit that real usage went past, if any, with
    what was used."""
    if budget.requests is not None and node.requests > budget.requests:
        return node, "requests", budget.requests, node.requests
    if budget.input_tokens is not None and node.input_tokens > budget.input_tokens:
        return node, "input_tokens", budget.input_tokens, node.input_tokens
    if budget.output_tokens is not None and node.output_tokens > budget.output_tokens:
        return node, "output_tokens", budget.output_tokens, node.output_tokens
    tokens = node.input_tokens + node.output_tokens
    if budget.tokens is not None and tokens > budget.tokens:
        return node, "tokens", budget.tokens, tokens
    if budget.cost is not None and node.cost > budget.cost * (1 + 1e-9):
        return node, "cost", budget.cost, node.cost
    return None


def ahead(queue: deque[Wait], seq: float) -> bool:
    """Whether a live request waits in ``queue`` ahead of place ``seq``."""
    while queue and queue[0].done:
        queue.popleft()
    return bool(queue) and queue[0].seq < seq


def why_waiting(at: Node, need: Need) -> str:
    """Why a request waits on ``at``, in words for the tree view."""
    budget = at.limits
    if budget is None:
        return f"waiting for budget: behind earlier requests for the budget of {at.name}"
    held = at.reserved_input + at.reserved_output
    room, field = free_output(at, budget, need)
    if room >= need.output:
        return f"waiting for budget: behind earlier requests for the {at.name} budget"
    return (
        f"waiting for budget: {field} of {at.name} ({held:,} tokens held by requests "
        f"in flight, {need.input + need.output:,} needed)"
    )


def impossible(usage: Usage, reservation: Reservation) -> str:
    """What cannot be true in a model's reported usage ("" when it can be)."""
    cap = reservation.max_tokens
    output = usage.output_tokens
    if (
        0 <= usage.input_tokens <= MAX_TOKENS_PER_REQUEST
        and 0 <= output <= (MAX_TOKENS_PER_REQUEST if cap is None else cap)
        and 0 <= usage.cached_tokens <= MAX_TOKENS_PER_REQUEST
        and 0 <= usage.requests <= MAX_TOKENS_PER_REQUEST
        and 0.0 <= usage.cost < math.inf  # NaN fails this too
    ):
        return ""  # the usual case, in one test
    for name in ("input_tokens", "output_tokens", "cached_tokens", "requests"):
        value = getattr(usage, name)
        if value < 0:
            return f"{name}={value} is negative"
        if value > MAX_TOKENS_PER_REQUEST:
            return f"{name}={value:,} for one request"
    if not math.isfinite(usage.cost) or usage.cost < 0:
        return f"cost={usage.cost!r} is not a finite number >= 0"
    if cap is not None and usage.output_tokens > cap:
        return f"{usage.output_tokens:,} output tokens for a request capped at {cap:,}"
    return ""


def hold(
    node: Node,
    input_tokens: int,
    price: Price | None,
    wanted: int,
    cap: int | None,
    output: int,
    limited_by: Node | None = None,
    limit: str = "",
) -> Reservation:
    """Count the request and hold its headroom on the whole chain."""
    cost = price.cost(input_tokens, output) if price is not None else 0.0
    current: Node | None = node
    while current is not None:
        current.requests += 1
        current.in_flight += 1
        current.reserved_input += input_tokens
        current.reserved_output += output
        current.reserved_cost += cost
        current = current.parent
    node.own_requests += 1
    return Reservation(input_tokens, output, cost, cap, price, limited_by, limit, wanted)


def want_of(need: Need) -> Want:
    """What a request waiting on a leased subtree's limits needs, field by field."""
    return Want(
        tokens=need.input + need.output,
        input_tokens=need.input,
        output_tokens=need.output,
        cost=need.cost(need.output),
        requests=1,
        detail=need.detail(),
        wanted_output=need.wanted,
        fair_output=need.fair,
    )


def overshoot(over: tuple[Node, str, float, float]) -> BudgetExceeded:
    """The refusal for a limit that usage went past (``over_limit``: a request, here
    or on a host, used more than its estimate)."""
    owner, field, allowed, used = over
    amount = f"{used:,}" if isinstance(used, int) else f"{used:.6g}"
    return BudgetExceeded(
        field,
        allowed,
        owner.id,
        owner.name,
        why=f"{amount} used: a request used more than its estimate",
    )


def no_price(node: Node, model: str) -> ValueError:
    """A cost budget applies but the model has no price."""
    return ValueError(
        f"Budget.cost is set (budget of {node.name} {node.id!r}) but no price is known "
        f"for model {model!r}: pass Runtime(prices={{{model!r}: Price(...)}})"
    )


#: The place in line of a request that does not wait yet: behind every waiting one.
_NEW = math.inf


class Admission:
    """The admission of one tree's model requests: ``reserve`` (or ``reserve_nowait``)
    counts a request and holds headroom for it on its chain, waiting first come first
    served while requests in flight (or leases of subtrees elsewhere) hold what it
    needs; ``settle`` charges what it really used and serves whoever waits;
    ``release`` gives back one never sent.

    A part of the supervisor that knows nothing of it (the supervisor hands its
    methods on as its own): it owns the lines of requests waiting for headroom (one
    per node someone waits on) and is handed the prices, the output sizes, how to
    stop a subtree (``stop``), how to serve the asks of leases waiting for headroom
    (``serve_asks``, the ledger's) and to wait until some lease's holds change
    (``leases_changed``), and the clock to time waits with (``now``).
    """

    def __init__(
        self,
        prices: dict[str, Price],
        *,
        default_max_tokens: int,
        min_output_tokens: int,
        whole: bool = False,
        stop: Callable[[Node, EndStatus, str, BudgetExceeded], None],
        serve_asks: Callable[[], None],
        leases_changed: Callable[[], Awaitable[None]],
        now: Callable[[], float],
    ) -> None:
        for name, value in (
            ("default_max_tokens", default_max_tokens),
            ("min_output_tokens", min_output_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        #: The price of each model, by name.
        self.prices = prices
        #: The output cap reserved for a request that names none, when a limit applies:
        #: reserving a whole budget's headroom for one request would starve its siblings.
        #: A reply cut there is asked again with room for twice as much (and so on):
        #: a budget that fits never caps a reply below what it gets without one.
        self.default_max_tokens = default_max_tokens
        #: The least output a request is sent with (capped by its own max_tokens).
        self.min_output_tokens = min_output_tokens
        #: Whether a request reserves all it wants, waiting for requests in flight
        #: when that is not free, instead of a fair share (``OutputSharing``).
        self.whole = whole
        #: Stop a node's subtree: ``stop(node, status, reason, error)`` (every stop
        #: made here goes through it).
        self.stop = stop
        self._serve_asks = serve_asks
        self._leases_changed = leases_changed
        self.now = now
        #: The requests waiting for each node's headroom, first come first served
        #: (only nodes someone waits on: empty when nobody waits).
        self._queues: dict[Node, deque[Wait]] = {}
        self._seq = itertools.count()
        #: Requests (and charges: ``wait_for_leases``) waiting for headroom now; waits
        #: so far; seconds spent waiting.
        self.waiting = 0
        self.waits = 0
        self.wait_seconds = 0.0

    def would_refuse(
        self,
        node: Node,
        *,
        input_estimate: int,
        max_tokens: int | None,
        model: str = "",
        requests: int = 1,
    ) -> BudgetExceeded | None:
        """The refusal ``requests`` requests (input estimates summed) would meet now,
        or None; stops nothing: for optional work (an agent's summarization)."""
        if node.stop_status is not None or not node.limited:
            return stopped(node) if node.stop_status is not None else None
        need = self.need(input_estimate=input_estimate, max_tokens=max_tokens, model=model)
        need.output *= requests
        return chain_refusal(node, need, requests)

    def need(
        self,
        *,
        input_estimate: int,
        max_tokens: int | None,
        model: str = "",
        at_least: int | None = None,
    ) -> Need:
        """What one request needs at least: its input estimate and a minimum output
        (``at_least``, or ``min_output_tokens``; never more than it wants). A request
        that names no ``max_tokens`` wants ``default_max_tokens``, or ``at_least`` when
        that is more: a reply cut at the default is asked again with room for more
        (``Reservation.again``)."""
        if max_tokens is not None:
            wanted = max_tokens
        elif at_least is not None and at_least > self.default_max_tokens:
            wanted = at_least
        else:
            wanted = self.default_max_tokens
        minimum = self.min_output_tokens if at_least is None else at_least
        price = self.prices.get(model) if self.prices else None
        need = Need(max(input_estimate, 0), min(minimum, wanted), wanted, price, model)
        if at_least is not None:  # asked again: refused only below the usual minimum
            need.least = min(self.min_output_tokens, need.output)
        return need

    def reserve_nowait(
        self,
        node: Node,
        *,
        input_estimate: int,
        max_tokens: int | None,
        model: str = "",
        at_least: int | None = None,
    ) -> Reservation:
        """Count one request and hold headroom for it, without waiting.

        Returns the reservation (its ``max_tokens`` is what the request may ask for).
        Raises ``BudgetExceeded`` (and stops that limit's node) when settled usage
        leaves no room for the request's minimum, and ``anyio.WouldBlock`` when it
        would have to wait for headroom that requests in flight hold.
        """
        if not node.limited and node.stop_status is None:
            # No budget on the chain, no one waits: count it and hold what it asks.
            price = self.prices.get(model) if self.prices else None
            return hold(node, input_estimate, price, 0, max_tokens, max_tokens or 0)
        _, got = self._first_try(node, input_estimate, max_tokens, model, at_least)
        if type(got) is Reservation:
            return got
        raise anyio.WouldBlock

    async def reserve(
        self,
        node: Node,
        *,
        input_estimate: int,
        max_tokens: int | None,
        model: str = "",
        at_least: int | None = None,
        on_wait: Callable[[str], object] | None = None,
    ) -> Reservation:
        """``reserve_nowait``, waiting for headroom when requests in flight hold it.

        Waiters are served first come, first served per budget, each time a
        reservation settles; a wait ends at once with a stop, a deadline or a
        cancellation of the waiting execution (anything that cancels its task).
        ``on_wait`` is called with why, in words, when the request starts to wait.
        """
        need, got = self._first_try(node, input_estimate, max_tokens, model, at_least)
        if type(got) is Reservation:
            return got
        assert isinstance(got, Node)
        wait = Wait(node, need, max_tokens, next(self._seq), new_waiter())
        self._enqueue(wait, got)
        self.waiting += 1
        self.waits += 1
        if on_wait is not None:
            on_wait(node.waiting)
        began = self.now()
        try:
            await park(wait.waiter)
        except BaseException:
            if wait.reservation is not None:  # admitted, then cancelled: never sent
                self.release(node, wait.reservation)
            elif not wait.done:
                self._end(wait)
                self._leave(wait)
            raise
        finally:
            node.waiting = ""
            self.wait_seconds += self.now() - began
        if wait.error is not None:
            raise wait.error
        assert wait.reservation is not None
        return wait.reservation

    def _first_try(
        self,
        node: Node,
        input_estimate: int,
        max_tokens: int | None,
        model: str,
        at_least: int | None,
    ) -> tuple[Need, Reservation | Node]:
        """A new request's need, and its reservation or the node it must wait for."""
        need = self.need(
            input_estimate=input_estimate, max_tokens=max_tokens, model=model, at_least=at_least
        )
        return need, self.admit(node, need, max_tokens, _NEW)

    def admit(
        self, node: Node, need: Need, max_tokens: int | None, seq: float
    ) -> Reservation | Node:
        """Reserve for one request, or return the node it must wait for.

        Raises ``BudgetExceeded`` when a node's settled usage has no room for it
        (that node is stopped with its subtree). ``seq`` is the request's place in
        line: it waits behind requests already waiting with a smaller one.
        """
        if node.stop_status is not None:
            raise stopped(node)
        if not node.limited:  # no budget on the chain: nothing to check, no one waits
            return hold(node, need.input, need.price, need.wanted, max_tokens, max_tokens or 0)
        current: Node | None = node
        while current is not None:  # spent? (settled usage only)
            budget = current.limits
            if budget is not None:
                if budget.cost is not None and need.price is None:
                    raise no_price(current, need.model)
                error = refusal(current, budget, need)
                if error is not None and need.output > need.least:
                    # Asked again for more room than settled usage leaves: it gets what
                    # is left, refused only when its ordinary minimum does not fit.
                    fits = settled_output(current, budget, need)
                    need.output = int(max(need.least, min(need.output, fits)))
                    error = refusal(current, budget, need)
                if error is not None:
                    if current.lender is not None:  # a leased subtree: ask for more
                        if not current.in_flight:
                            # (its answer is a share of the budget above as it is
                            # now: no second ask for this request)
                            need.asked = True
                            current.lender.want(current, want_of(need))
                        return current
                    self.stop(current, "budget_exceeded", str(error), error)
                    raise error
            current = current.parent
        share = math.inf
        per = 1
        limited_by: Node | None = None
        limit = ""
        queues = self._queues
        current = node
        while current is not None:  # held up? and how much may it take?
            if queues:
                queue = queues.get(current)
                if queue and ahead(queue, seq):
                    return current
            budget = current.limits
            if budget is not None:
                if current.lender is not None and current.lender.asking:
                    # Its lease asked the tree above: until the answer it spends
                    # nothing beyond what it holds now, not even what requests in
                    # flight give back when they settle for less (``Ledger.freeze``).
                    return current
                room, field = free_output(current, budget, need)
                if room < need.output:
                    held = current.held
                    if current.lender is not None and not current.in_flight:
                        need.asked = True
                        current.lender.want(current, want_of(need))
                        return current
                    if not current.in_flight and not (held is not None and held.alive(field) > 0):
                        # Nothing held could come back: spent.
                        allowed = getattr(budget, field)
                        lost = held is not None and held.lost and getattr(held.lost, field)
                        why = LOST_WHY if lost else "no room left"
                        error = BudgetExceeded(field, allowed, current.id, current.name, why=why)
                        self.stop(current, "budget_exceeded", str(error), error)
                        raise error
                    return current
                if room != math.inf and self.whole:
                    # All it wants, or wait while requests in flight (or leases that
                    # may give back) hold what it lacks; alone, what there is.
                    held = current.held
                    if room < need.wanted:
                        if current.in_flight:
                            return current
                        if current.lender is not None and not need.asked:
                            need.asked = True  # a lease: ask the budget above for it
                            current.lender.want(current, want_of(need))
                            return current
                        if held is not None and held.alive(field) > 0:
                            return current
                    whole = min(need.wanted, int(room))
                    if whole < share:
                        share, limited_by, limit, per = whole, current, field, 1
                elif room != math.inf:
                    # A fair share: one part for each execution under the budget
                    # that may ask next and holds none of it yet (all of it, alone).
                    held = current.held
                    parts = max(
                        current.leaves - current.in_flight - (held.holding if held else 0), 1
                    )
                    mine = max(need.output, room // parts)
                    if need.fair and current.lender is not None:
                        mine = max(mine, min(need.fair, int(room)))  # asked, granted
                    if mine < share:
                        share, limited_by, limit, per = mine, current, field, parts
            current = current.parent
        if share == math.inf:  # no output limit on the chain
            return hold(node, need.input, need.price, need.wanted, max_tokens, max_tokens or 0)
        cap = int(min(need.wanted, share))
        if cap >= need.wanted:
            limited_by, limit = None, ""
        elif limited_by is not None and limited_by.lender is not None and not need.fair:
            lender = limited_by.lender
            fair = min(fair_output(lender, limit, need), need.wanted)
            short = not need.asked and _lease_short(limited_by, lender, limit, per)
            if cap < DEEP * fair or short:
                # Cut deeper than its fair part of the budget above would cut it (the
                # lease's other parts took more, or it was granted while the budget
                # was spread over more parts), or by what is left of a lease spent
                # past half, or worth less than a part of the real budget now
                # (siblings gave back, ``HINT``): ask the tree above for that part
                # (a second ask at most, for a request that asked for its minimum).
                need.asked = True
                need.fair = max(int(fair), 1)
                lender.want(limited_by, want_of(need))
                return limited_by
        return hold(node, need.input, need.price, need.wanted, cap, cap, limited_by, limit)

    def _enqueue(self, wait: Wait, at: Node) -> None:
        """Queue ``wait`` on ``at`` in its place in line, and say why it waits."""
        queue = self._queues.get(at)
        if queue is None:
            queue = self._queues[at] = deque()
        if not queue or queue[-1].seq < wait.seq:
            queue.append(wait)
        else:  # moved here from another queue: keep the line's order
            index = next(i for i, other in enumerate(queue) if other.seq > wait.seq)
            queue.insert(index, wait)
        wait.queue = at
        wait.node.waiting = why_waiting(at, wait.need)

    def _end(self, wait: Wait) -> None:
        """``wait`` is over (served, refused or given up): once."""
        wait.done = True
        self.waiting -= 1

    def _leave(self, wait: Wait) -> None:
        """``wait`` gave up (cancelled): let the requests behind it try."""
        queue = self._queues.get(wait.queue)
        if queue and queue[0] is wait:
            self._serve(wait.queue)

    def _serve(self, at: Node) -> None:
        """Admit the requests waiting on ``at``, in order, while they fit."""
        queue = self._queues.get(at)
        while queue:
            wait = queue[0]
            if wait.done:
                queue.popleft()
                continue
            node = wait.node
            try:
                got = self.admit(node, wait.need, wait.max_tokens, wait.seq)
            except BudgetExceeded as exc:
                queue.popleft()
                wait.error = exc
                self._end(wait)
                wake(wait.waiter)
                continue
            if got is at:
                return  # still held up here: so is everyone behind it
            queue.popleft()
            if type(got) is Reservation:
                wait.reservation = got
                self._end(wait)
                node.waiting = ""
                wake(wait.waiter)
            else:
                assert isinstance(got, Node)
                self._enqueue(wait, got)  # held up further up the chain now
        if queue is not None and not queue:
            self._queues.pop(at, None)

    def release(self, node: Node, reservation: Reservation) -> None:
        """Give back a reservation whose request was never sent: nothing is charged,
        and the request is not counted."""
        current: Node | None = node
        while current is not None:
            current.requests -= reservation.requests
            current.in_flight -= 1
            current.reserved_input -= reservation.input
            current.reserved_output -= reservation.output
            current.reserved_cost -= reservation.cost
            current = current.parent
        node.own_requests -= reservation.requests
        self.serve_chain(node)

    def serve_chain(self, node: Node) -> None:
        """Serve the requests (and leases' asks) waiting on ``node``'s chain: its
        headroom changed."""
        queues = self._queues
        if queues:
            current: Node | None = node
            while current is not None:
                if current in queues:  # (an emptied queue is dropped there)
                    self._serve(current)
                current = current.parent
        self._serve_asks()

    def settle(
        self,
        node: Node,
        reservation: Reservation,
        usage: Usage | None,
        *,
        model: str = "",
        estimate: Callable[[], int] | None = None,
    ) -> Usage:
        """Release ``reservation`` and charge the real ``usage``.

        ``None`` means the model reported nothing (the request failed or was cut):
        its input estimate is charged, since the provider may have read it all (one
        reserved without: ``estimate()``, made only now).
        Usage that cannot be true is charged as the whole reservation and raises
        ``InvalidUsage`` after the charge: never a refund. Requests it reports
        beyond those the call had admitted (a model with a retry loop of its own)
        are counters: charged as far as every ``requests`` limit of the chain has
        room, and the node whose limit they would pass is stopped, saying so. Returns the usage as
        charged, with its cost. If the real usage went past a limit (a model's
        estimate fell short), that node's subtree is stopped. Requests waiting for
        headroom on the chain are served.
        """
        problem = impossible(usage, reservation) if usage is not None else ""
        price = reservation.price
        admitted = reservation.requests
        extra_requests = cached_tokens = 0
        refused: tuple[Node, int, int] | None = None
        if usage is None or problem:
            input_tokens = reservation.input or (estimate() if estimate is not None else 0)
            output_tokens = reservation.output if problem else 0
            cost = price.cost(input_tokens, output_tokens) if price is not None else 0.0
        else:
            input_tokens = usage.input_tokens
            output_tokens = usage.output_tokens
            cached_tokens = usage.cached_tokens
            # A model may send several requests for one and say so: those beyond
            # the ones admitted are counters, checked and charged here at once.
            extra_requests = usage.requests - admitted
            if extra_requests > 0 and node.limited:
                extra_requests, refused = requests_room(node, extra_requests)
            extra_requests = max(extra_requests, 0)
            cost = (
                price.cost(input_tokens, output_tokens, cached_tokens)
                if price is not None
                else usage.cost
            )
        over: tuple[Node, str, float, float] | None = None
        current: Node | None = node
        while current is not None:
            current.in_flight -= 1
            current.reserved_input -= reservation.input
            current.reserved_output -= reservation.output
            current.reserved_cost -= reservation.cost
            current.input_tokens += input_tokens
            current.output_tokens += output_tokens
            current.cached_tokens += cached_tokens
            current.cost += cost
            current.requests += extra_requests
            if current.limits is not None:
                # The highest node over its limit: stopping it stops everything below.
                over = over_limit(current, current.limits) or over
            current = current.parent
        node.own_input_tokens += input_tokens
        node.own_output_tokens += output_tokens
        node.own_cached_tokens += cached_tokens
        node.own_cost += cost
        node.own_requests += extra_requests
        if refused is not None:
            owner, allowed, more = refused
            assert usage is not None
            error = BudgetExceeded(
                "requests",
                allowed,
                owner.id,
                owner.name,
                why=f"the model reported {usage.requests:,} requests for one call, "
                f"{more:,} more than the budget had room for",
            )
            self.stop(owner, "budget_exceeded", str(error), error)
        if over is not None:
            self.stop_over(over)
        if self._queues:
            self.serve_chain(node)
        else:  # (the asks' serve returns at once when none waits)
            self._serve_asks()
        charged = Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_tokens=cached_tokens,
            requests=admitted + extra_requests,
            cost=cost,
        )
        if problem:
            raise InvalidUsage(model, problem, charged)
        return charged

    def stop_over(self, over: tuple[Node, str, float, float]) -> None:
        """Usage went past a limit (a request, here or on a host, used more than its
        estimate): stop that limit's node with its subtree."""
        error = overshoot(over)
        self.stop(over[0], "budget_exceeded", str(error), error)

    def closed(self, node: Node) -> None:
        """``node`` finished: drop its line if no live request is left in it (and,
        the node of a remote subtree that ended, its leaf is counted out of the
        budgets' parts by its close now, not by its lease: ``part_back``)."""
        if node.lease is not None:
            part_back(node)
        queues = self._queues
        if queues:
            queue = queues.get(node)
            if queue is not None and all(wait.done for wait in queue):
                del queues[node]

    async def wait_for_leases(self, node: Node) -> None:
        """Wait (counted as a wait for budget) until some lease's holds change: only
        headroom leased to subtrees on other hosts stands in the way of ``node``'s
        charge or spawn."""
        node.waiting = "waiting for budget: headroom leased to subtrees on other hosts"
        self.waiting += 1
        self.waits += 1
        began = self.now()
        try:
            await self._leases_changed()
        finally:
            node.waiting = ""
            self.waiting -= 1
            self.wait_seconds += self.now() - began
