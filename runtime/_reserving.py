"""Model requests under the supervisor: what one needs, its reservation, its waits.

The half of ``Supervisor`` that admits model requests (``_admission`` has the
arithmetic): ``reserve`` (or ``reserve_nowait``) counts a request and holds headroom
for it on its chain, waiting first come first served while requests in flight (or
leases of subtrees elsewhere) hold what it needs; ``settle`` charges what it really
used and serves whoever waits; ``release`` gives back one never sent. A mixin of
``Supervisor``: the tree, the stops and the ledger are the supervisor's own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import anyio

from ._admission import (
    Need,
    Reservation,
    Wait,
    ahead,
    free_output,
    impossible,
    over_limit,
    refusal,
    requests_room,
    why_waiting,
)
from ._budget import Price, Usage
from ._exceptions import BudgetExceeded, InvalidUsage
from ._lease import LOST_WHY, Want
from ._tree import Node
from ._waiter import new_waiter, park, wake

if TYPE_CHECKING:
    from ._ledger import Ledger
    from ._tree import EndStatus

__all__ = ["Reserving"]

#: The place in line of a request that does not wait yet: behind every waiting one.
_NEW = math.inf


class _Tree(Protocol):
    """What of the supervisor the requests' half uses (``Supervisor`` has it all)."""

    prices: dict[str, Price]
    default_max_tokens: int
    min_output_tokens: int
    waiting: int
    waits: int
    wait_seconds: float
    ledger: Ledger
    now: Callable[[], float]

    @property
    def _seq(self) -> Iterator[int]: ...

    def stop_subtree(
        self,
        node: Node,
        status: EndStatus,
        reason: str,
        error: BudgetExceeded | None = None,
        *,
        cancel: bool = True,
    ) -> None: ...

    @staticmethod
    def stopped(node: Node) -> BudgetExceeded: ...

    # The requests' half itself, as its methods call each other.
    def need(
        self,
        *,
        input_estimate: int,
        max_tokens: int | None,
        model: str = "",
        at_least: int | None = None,
    ) -> Need: ...

    def _first_try(
        self,
        node: Node,
        input_estimate: int,
        max_tokens: int | None,
        model: str,
        at_least: int | None,
    ) -> tuple[Need, Reservation | Node]: ...

    def _admit(
        self, node: Node, need: Need, max_tokens: int | None, seq: float
    ) -> Reservation | Node: ...

    def _enqueue(self, wait: Wait, at: Node) -> None: ...

    def _end(self, wait: Wait) -> None: ...

    def _leave(self, wait: Wait) -> None: ...

    def _serve(self, at: Node) -> None: ...

    def release(self, node: Node, reservation: Reservation) -> None: ...

    def serve_chain(self, node: Node) -> None: ...

    def stop_over(self, over: tuple[Node, str, float, float]) -> None: ...


class Reserving:
    """The model requests' half of ``Supervisor`` (see the module's docstring)."""

    def need(
        self: _Tree,
        *,
        input_estimate: int,
        max_tokens: int | None,
        model: str = "",
        at_least: int | None = None,
    ) -> Need:
        """What one request needs at least: its input estimate and a minimum output
        (``at_least``, or ``min_output_tokens``; never more than it wants)."""
        wanted = max_tokens if max_tokens is not None else self.default_max_tokens
        minimum = self.min_output_tokens if at_least is None else at_least
        price = self.prices.get(model) if self.prices else None
        return Need(max(input_estimate, 0), min(minimum, wanted), wanted, price, model)

    def reserve_nowait(
        self: _Tree,
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
            return _hold(node, input_estimate, price, 0, max_tokens, max_tokens or 0)
        _, got = self._first_try(node, input_estimate, max_tokens, model, at_least)
        if type(got) is Reservation:
            return got
        raise anyio.WouldBlock

    async def reserve(
        self: _Tree,
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
        self: _Tree,
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
        return need, self._admit(node, need, max_tokens, _NEW)

    def _admit(
        self: _Tree, node: Node, need: Need, max_tokens: int | None, seq: float
    ) -> Reservation | Node:
        """Reserve for one request, or return the node it must wait for.

        Raises ``BudgetExceeded`` when a node's settled usage has no room for it
        (that node is stopped with its subtree). ``seq`` is the request's place in
        line: it waits behind requests already waiting with a smaller one.
        """
        if node.stop_status is not None:
            raise self.stopped(node)
        if not node.limited:  # no budget on the chain: nothing to check, no one waits
            return _hold(node, need.input, need.price, need.wanted, max_tokens, max_tokens or 0)
        current: Node | None = node
        while current is not None:  # spent? (settled usage only)
            budget = current.limits
            if budget is not None:
                if budget.cost is not None and need.price is None:
                    raise _no_price(current, need.model)
                error = refusal(current, budget, need)
                if error is not None:
                    if current.lender is not None:  # a leased subtree: ask for more
                        if not current.in_flight:
                            current.lender.want(current, _want(need))
                        return current
                    self.stop_subtree(current, "budget_exceeded", str(error), error)
                    raise error
            current = current.parent
        share = math.inf
        limited_by: Node | None = None
        limit = ""
        current = node
        while current is not None:  # held up? and how much may it take?
            queue = current.waiters
            if queue and ahead(queue, seq):
                return current
            budget = current.limits
            if budget is not None:
                room, field = free_output(current, budget, need)
                if room < need.output:
                    held = current.held
                    if current.lender is not None and not current.in_flight:
                        current.lender.want(current, _want(need))
                        return current
                    if not current.in_flight and not (held is not None and held.alive(field) > 0):
                        # Nothing held could come back: spent.
                        allowed = getattr(budget, field)
                        lost = held is not None and held.lost and getattr(held.lost, field)
                        why = LOST_WHY if lost else "no room left"
                        error = BudgetExceeded(field, allowed, current.id, current.name, why=why)
                        self.stop_subtree(current, "budget_exceeded", str(error), error)
                        raise error
                    return current
                if room != math.inf:
                    # A fair share: one part for each execution under the budget
                    # that may ask next and holds none of it yet (all of it, alone).
                    held = current.held
                    parts = max(
                        current.leaves - current.in_flight - (held.holding if held else 0), 1
                    )
                    mine = max(need.output, room // parts)
                    if mine < share:
                        share, limited_by, limit = mine, current, field
            current = current.parent
        if share == math.inf:  # no output limit on the chain
            return _hold(node, need.input, need.price, need.wanted, max_tokens, max_tokens or 0)
        cap = int(min(need.wanted, share))
        if cap >= need.wanted:
            limited_by, limit = None, ""
        return _hold(node, need.input, need.price, need.wanted, cap, cap, limited_by, limit)

    def _enqueue(self: _Tree, wait: Wait, at: Node) -> None:
        """Queue ``wait`` on ``at`` in its place in line, and say why it waits."""
        queue = at.waiters
        if queue is None:
            queue = at.waiters = deque()
        if not queue or queue[-1].seq < wait.seq:
            queue.append(wait)
        else:  # moved here from another queue: keep the line's order
            index = next(i for i, other in enumerate(queue) if other.seq > wait.seq)
            queue.insert(index, wait)
        wait.queue = at
        wait.node.waiting = why_waiting(at, wait.need)

    def _end(self: _Tree, wait: Wait) -> None:
        """``wait`` is over (served, refused or given up): once."""
        wait.done = True
        self.waiting -= 1

    def _leave(self: _Tree, wait: Wait) -> None:
        """``wait`` gave up (cancelled): let the requests behind it try."""
        queue = wait.queue.waiters
        if queue and queue[0] is wait:
            self._serve(wait.queue)

    def _serve(self: _Tree, at: Node) -> None:
        """Admit the requests waiting on ``at``, in order, while they fit."""
        queue = at.waiters
        while queue:
            wait = queue[0]
            if wait.done:
                queue.popleft()
                continue
            node = wait.node
            try:
                got = self._admit(node, wait.need, wait.max_tokens, wait.seq)
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
            at.waiters = None

    def release(self: _Tree, node: Node, reservation: Reservation) -> None:
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

    def serve_chain(self: _Tree, node: Node) -> None:
        """Serve the requests (and leases' asks) waiting on ``node``'s chain: its
        headroom changed."""
        current: Node | None = node
        while current is not None:
            if current.waiters:
                self._serve(current)
            current = current.parent
        if self.ledger.asks_waiting:
            self.ledger.serve()

    def settle(
        self: _Tree,
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
        served = False
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
            served = served or current.waiters is not None
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
            self.stop_subtree(owner, "budget_exceeded", str(error), error)
        if over is not None:
            self.stop_over(over)
        if served or self.ledger.asks_waiting:
            self.serve_chain(node)
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

    def stop_over(self: _Tree, over: tuple[Node, str, float, float]) -> None:
        """Usage went past a limit (a request, here or on a host, used more than its
        estimate): stop that limit's node with its subtree."""
        owner, field, allowed, used = over
        error = BudgetExceeded(
            field,
            allowed,
            owner.id,
            owner.name,
            why=f"{_amount(used)} used: a request used more than its estimate",
        )
        self.stop_subtree(owner, "budget_exceeded", str(error), error)


def _want(need: Need) -> Want:
    """What a request waiting on a leased subtree's limits needs, field by field."""
    return Want(
        tokens=need.input + need.output,
        input_tokens=need.input,
        output_tokens=need.output,
        cost=need.cost(need.output),
        requests=1,
        detail=need.detail(),
    )


def _amount(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.6g}"


def _no_price(node: Node, model: str) -> ValueError:
    return ValueError(
        f"Budget.cost is set (budget of {node.name} {node.id!r}) but no price is known "
        f"for model {model!r}: pass Runtime(prices={{{model!r}: Price(...)}})"
    )


def _hold(
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
