"""Admission of model requests: what one request needs, and what a budget has room for.

The supervisor asks three questions of every node of a request's chain that has a
budget, in this order:

1. **Is it spent?** The node's *settled* usage (what requests that finished really
   used) leaves no room for this request's minimum: its input estimate plus a
   minimum output (``Supervisor.min_output_tokens``, capped by the request's own
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
   taking it all and the others waiting for it.

Everything here is synchronous arithmetic on the nodes (and the record of one
waiting request, ``Wait``); the supervisor does the waiting and the stopping
(``Supervisor.reserve``, ``settle``). ``hold`` counts a request and holds its
headroom on the chain, ``want_of`` says what a request waiting on a leased subtree
asks the tree above for, and ``overshoot`` words a limit that settled usage went
past. ``impossible`` says what cannot be true in a model's reported usage,
``over_limit`` which limit settled usage went past (an estimate fell short), and
``requests_room`` how many requests a model reports beyond those admitted (a retry
loop of its own) the chain has room for: counters never pass a limit.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from ._budget import Budget, Price, Usage
from ._exceptions import BudgetExceeded
from ._lease import Want
from ._waiter import Waiter

if TYPE_CHECKING:
    from ._tree import Node

__all__ = [
    "MAX_TOKENS_PER_REQUEST",
    "Need",
    "Reservation",
    "Wait",
    "ahead",
    "chain_refusal",
    "free_output",
    "hold",
    "impossible",
    "no_price",
    "over_limit",
    "overshoot",
    "refusal",
    "requests_room",
    "want_of",
    "why_waiting",
]

#: Relative slack for comparing costs (floating point sums).
_COST_EPSILON = 1e-9


class Need:
    """What one request needs at least: its input estimate and a minimum output."""

    __slots__ = ("input", "model", "output", "price", "wanted")

    def __init__(
        self, input: int, output: int, wanted: int, price: Price | None, model: str = ""
    ) -> None:
        self.input = input
        #: The model's name (its price is looked up by it).
        self.model = model
        #: The minimum output: below this the request is not worth sending.
        self.output = output
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
    by the budget's sharing, not by the request's own cap. ``requests`` is how many
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
