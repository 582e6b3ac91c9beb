r"""The supervisor: one tree of executions, their usage, and their hard limits.

Every execution of every agent is a ``Node``. The runtime's own budget sits on the
root; an agent's budget (or the one passed with a task) sits on that execution's
node and covers it and all of its descendants. Usage is charged to the node and to
every ancestor at once, so a node's totals always include its subtree.

Every limit is **hard** (zero overshoot) and **honest** (no premature stop):

- Counters (requests, tool calls, steps, agents, depth) are checked on every node
  of the chain and then charged, with no ``await`` in between: nothing overshoots.
- Tokens and cost are **reserved** before each model request and **settled** with
  the real usage after it (``reserve`` / ``settle``); ``max_tokens`` is capped so
  the reservation fits every node of the chain. Input tokens are checked with the
  model's estimate and charged exactly afterwards.
- A request is refused, and the node whose limit it is stopped with its subtree,
  only when that node's *settled* usage leaves no room for the request's minimum
  (its input estimate plus ``min_output_tokens``, capped by its own ``max_tokens``).
  The refusal says what the request needed and what was left.
- Headroom that other in-flight requests hold makes a request **wait** for it, first
  come first served per budget, woken when a reservation settles; never stop.
  Reservations take a fair share of the free headroom (one part for each running
  execution under that budget that may ask next and holds none of it yet: all of
  it when alone; never less than the minimum), so concurrent children run
  concurrently. A wait shows in the node's snapshot (``waiting``) and in
  ``statistics()``; a stop, a deadline or a cancellation ends it at once.
- Every request is charged: a failed or interrupted one at least its input
  estimate; usage that cannot be true is refused (``InvalidUsage``), never refunded.
- Time: a node's deadline is the earlier of its own and its parent's.

When a charge is refused, the node whose limit it is (the charging node or an
ancestor) is stopped with its whole subtree: each execution's cancel scope is
cancelled and each one answers ``budget_exceeded`` naming that limit and node. A
refused spawn (depth, agents) stops nothing: the caller gets the error as a value.
The supervisor is one object holding its parts and calling them: the tree of
``Node``\ s (``_tree``; the snapshots it hands out in ``_snapshots``), the arithmetic
of admission and the checks of reported usage (``_admission``), and the ledger of
the leases of subtrees on other hosts (``_ledger``, a ``Ledger`` that knows nothing
of the supervisor: it is handed the root, the caps, and how to serve and to stop).
What it keeps itself: the counters' charges, the stops, and the requests waiting for
headroom (a line per node, first come first served).

The modules go one way, each knowing only those below it: ``_budget``,
``_snapshots``, ``_lease``, ``_tree``, ``_admission``, ``_ledger``, ``_supervisor``.
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections import deque
from collections.abc import Callable

import anyio

from ._admission import (
    Need,
    Reservation,
    Wait,
    ahead,
    chain_refusal,
    free_output,
    hold,
    impossible,
    no_price,
    over_limit,
    overshoot,
    refusal,
    requests_room,
    want_of,
    why_waiting,
)
from ._budget import CHARGED, Budget, Caps, Price, Usage, derived
from ._exceptions import BudgetExceeded, InvalidUsage
from ._lease import LOST_WHY, HeldUp, Want
from ._ledger import Ledger
from ._snapshots import EndStatus, NodeSnapshot, TreeSnapshot
from ._tree import Cancellable, Node, stopped
from ._waiter import clock, new_waiter, park, wake

__all__ = ["DEFAULT_MAX_TOKENS", "MIN_OUTPUT_TOKENS", "Supervisor"]

#: How many finished nodes a snapshot still shows.
FINISHED_KEPT = 10_000
#: The output tokens reserved for a request that asks for no cap of its own.
DEFAULT_MAX_TOKENS = 4_096
#: The least output a request is sent with: a budget whose settled usage leaves less
#: (plus the input estimate) is spent; one whose free headroom is smaller waits.
MIN_OUTPUT_TOKENS = 256
#: The place in line of a request that does not wait yet: behind every waiting one.
_NEW = math.inf


class Supervisor:
    """Tracks the tree and enforces every ``Budget`` across it.

    Synchronous, except ``reserve``, which may wait for headroom; everything that
    checks and charges does so without an ``await`` in between.
    """

    def __init__(
        self,
        budget: Budget | None,
        prices: dict[str, Price] | None = None,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        min_output_tokens: int = MIN_OUTPUT_TOKENS,
        caps: Caps | None = None,
    ) -> None:
        for name, value in (
            ("default_max_tokens", default_max_tokens),
            ("min_output_tokens", min_output_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if caps is not None and not isinstance(caps, Caps):
            raise TypeError(f"caps must be a fractor.Caps or None, got {type(caps).__qualname__}")
        self.budget = budget
        #: Bounds on any tree, budget or not (None: none).
        self.caps = caps
        #: The output cap reserved for a request that names none, when a limit applies:
        #: reserving a whole budget's headroom for one request would starve its siblings.
        self.default_max_tokens = default_max_tokens
        #: The least output a request is sent with (capped by its own max_tokens).
        self.min_output_tokens = min_output_tokens
        self.prices = dict(prices or {})
        self._ids = itertools.count(1)
        #: Makes node (execution) ids unique across runtimes sharing one store: 64
        #: random bits, so that even a million runtimes writing to one store are
        #: unlikely to meet (a stored record with the same id would be replaced).
        self.token = secrets.token_hex(8)
        self._origin = 0.0
        self.root = Node("root", "runtime", None, budget, math.inf, None, 0.0)
        self.nodes: dict[str, Node] = {"root": self.root}
        self._finished: deque[Node] = deque(maxlen=FINISHED_KEPT)
        self._seq = itertools.count()
        #: The running backend's clock (set by ``start``).
        self.now: Callable[[], float] = anyio.current_time
        #: Requests waiting for budget now; waits so far; seconds spent waiting.
        self.waiting = 0
        self.waits = 0
        self.wait_seconds = 0.0
        #: The requests waiting for each node's headroom, first come first served
        #: (only nodes someone waits on: empty when nobody waits).
        self._queues: dict[Node, deque[Wait]] = {}
        #: The leases of subtrees that run on other hosts.
        self.ledger = Ledger(self.root, caps, serve=self.serve_chain, stop=self.stop_subtree)

    def start(self) -> None:
        """Start the clock: the runtime's ``seconds`` budget counts from here."""
        self.now = now_of = clock()
        self._origin = now = now_of()
        self.root.started = now
        seconds = self.budget.seconds if self.budget is not None else None
        if seconds is not None:
            self.root.deadline = now + seconds
            self.root.deadline_owner = self.root

    # -- the tree -------------------------------------------------------------------

    def open(self, parent: Node, *, name: str, limits: Budget | None, node_id: str = "") -> Node:
        """Open a child node of ``parent``; checks depth and agents on the whole chain.

        Raises ``BudgetExceeded`` when the spawn is refused; that stops nothing, and
        ``HeldUp`` when only headroom leased to a subtree elsewhere stands in the way
        (``open_waiting`` waits for it). ``node_id`` gives the node an id made
        elsewhere (the node of a subtree run for another host's tree).
        """
        depth = parent.depth + 1
        blocked = False
        for node in parent.chain():
            budget = node.limits
            if budget is None:
                continue
            if budget.depth is not None and depth - node.depth > budget.depth:
                raise BudgetExceeded("depth", budget.depth, node.id, node.name)
            if budget.agents is not None:
                if node.agents + 1 > budget.agents:
                    if node.lender is not None:  # a leased subtree: ask for more
                        node.lender.want(node, Want(agents=1))
                        raise HeldUp
                    raise BudgetExceeded("agents", budget.agents, node.id, node.name)
                held = node.held
                if held is not None and node.agents + held.agents + 1 > budget.agents:
                    blocked = self._held_up(node, "agents", budget.agents, stop=False)
        caps = self.caps
        if caps is not None and parent is not self.root:
            if caps.depth is not None and depth > caps.depth:
                raise _over_cap("depth", caps.depth, parent)
            top = parent
            while top.parent is not self.root and top.parent is not None:
                top = top.parent
            if caps.agents is not None:
                if top.agents + 1 > caps.agents:
                    raise _over_cap("agents", caps.agents, top)
                held = top.held
                if held is not None and top.agents + held.agents + 1 > caps.agents:
                    if not held.alive("agents"):
                        raise _over_cap("agents", caps.agents, top)
                    blocked = True
        if blocked:
            raise HeldUp
        for node in parent.chain():
            node.agents += 1
        now = self.now()
        deadline, owner = parent.deadline, parent.deadline_owner
        seconds = limits.seconds if limits is not None else None
        node_id = node_id or f"{name}#{next(self._ids)}.{self.token}"
        child = Node(node_id, name, parent, limits, deadline, owner, now)
        if seconds is not None and now + seconds < deadline:
            child.deadline, child.deadline_owner = now + seconds, child
        if parent.stop_status is not None:
            child.stop_status, child.stop_reason = parent.stop_status, parent.stop_reason
            child.stop_error = parent.stop_error
        if parent is not self.root and not parent.children:
            for node in parent.chain():
                node.leaves -= 1  # it waits for its children now
        parent.children.add(child)
        for node in child.chain():
            node.leaves += 1
        self.nodes[child.id] = child
        return child

    def get(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise KeyError(f"no running node {node_id!r} in the supervisor's tree") from None

    def close(self, node: Node, status: EndStatus, reason: str = "") -> None:
        """Mark ``node`` finished (first close wins) and drop it from the live tree."""
        if node.status != "running" or node is self.root:
            return
        node.status = status
        node.stop_reason = reason or node.stop_reason
        node.ended = self.now()
        node.scope = None
        current: Node | None = node
        if not node.children:
            while current is not None:  # a plain loop: closes are many (a whole tree)
                current.leaves -= 1
                current = current.parent
        parent = node.parent
        if parent is not None:
            parent.children.discard(node)
            if parent is not self.root and parent.status == "running" and not parent.children:
                for current in parent.chain():
                    current.leaves += 1  # its step goes on: it may send the next request
        self.nodes.pop(node.id, None)
        self._finished.append(node)
        queues = self._queues
        if queues:  # a line left with no live request in it: drop it with the node
            queue = queues.get(node)
            if queue is not None and all(wait.done for wait in queue):
                del queues[node]

    def stop_subtree(
        self,
        node: Node,
        status: EndStatus,
        reason: str,
        error: BudgetExceeded | None = None,
        *,
        cancel: bool = True,
    ) -> None:
        """Stop ``node`` and everything under it: each answers with ``status``.

        Every node of the subtree is marked at once (and takes no new work from now
        on); only the topmost running executions are cancelled here. A child agent
        runs in a task group of the step that called it, inside its parent's
        execution, so that one cancellation reaches the whole subtree in a single
        delivery. (On anyio's asyncio backend every ``cancel()`` also formats the
        calling task's repr: one call per node would cost milliseconds on a large
        tree.) With ``cancel=False`` nothing is cancelled, only marked: for a
        subtree whose tasks are being cancelled anyway.
        """
        stack = [node]
        while stack:  # mark every node still running: a closed node's end is final
            current = stack.pop()
            if current.stop_status is None and current.status == "running":
                current.stop_status, current.stop_reason = status, reason
                current.stop_error = error
            if current.children:
                stack.extend(current.children)
        if not cancel:
            return
        to_cancel: list[Cancellable] = []
        stack = [node]
        while stack:  # find the topmost executions: no need to look below them
            current = stack.pop()
            if current.scope is not None:
                to_cancel.append(current.scope)
            elif current.children:
                stack.extend(current.children)
        for scope in to_cancel:
            scope.cancel()

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
            return self.stopped(node) if node.stop_status is not None else None
        need = self.need(input_estimate=input_estimate, max_tokens=max_tokens, model=model)
        need.output *= requests
        return chain_refusal(node, need, requests)

    def why_stopped(self, node: Node) -> tuple[EndStatus, str]:
        """How a node that was interrupted ends: a supervisor stop, its deadline, or a
        plain cancellation from outside the tree."""
        if node.stop_status is not None:
            return node.stop_status, node.stop_reason
        if self.now() >= node.deadline:
            owner = node.deadline_owner or node
            seconds = owner.limits.seconds if owner.limits is not None else None
            shown = f"{seconds:g} s " if seconds is not None else ""
            return "timed_out", f"deadline of {shown}passed (budget of {owner.name} {owner.id!r})"
        return "cancelled", "cancelled"

    def abandon(self, node: Node, parent: Node, *, cancel: bool = True) -> None:
        """``parent`` stopped waiting for ``node`` (it was interrupted): stop the child's
        subtree with the parent's reason and close it, answered or not. With
        ``cancel=False`` the subtree is only marked (its tasks are being cancelled)."""
        if node.status != "running":
            return
        status, reason = self.why_stopped(parent)
        if node.stop_status is None or cancel:  # marked already: so is its subtree
            self.stop_subtree(node, status, reason, cancel=cancel)
        self.close(node, status, reason)

    def cancel(self, node_id: str) -> None:
        """Cancel a running node and its subtree; each answers ``cancelled``."""
        node = self.get(node_id)
        self.stop_subtree(node, "cancelled", f"cancelled ({node.name} {node.id!r})")

    # -- charges ----------------------------------------------------------------------

    def _refuse(self, node: Node, limit: str, allowed: float, why: str = "") -> BudgetExceeded:
        error = BudgetExceeded(limit, allowed, node.id, node.name, why=why)
        self.stop_subtree(node, "budget_exceeded", str(error), error)
        return error

    def _spent(self, node: Node, limit: str, allowed: float, want: Want) -> None:
        """A counter of ``node`` has no room left: refuse (and stop it), or, on a
        host's leased subtree, ask for more and wait."""
        if node.lender is not None:
            node.lender.want(node, want)
            raise HeldUp
        raise self._refuse(node, limit, allowed)

    def _held_up(self, node: Node, limit: str, allowed: float, *, stop: bool = True) -> bool:
        """Headroom of ``node`` that leases hold stands in the way: wait for it while a
        lease may give some back; refuse when every lease holding it is lost."""
        held = node.held
        if held is not None and held.alive(limit) > 0:
            return True
        if not stop:
            raise BudgetExceeded(limit, allowed, node.id, node.name, why=LOST_WHY)
        raise self._refuse(node, limit, allowed, LOST_WHY)

    # The lease signal ``HeldUp`` is handled here and nowhere else: ``try_charge`` and
    # ``try_open`` turn it into a value (nothing charged, nothing opened: wait for the
    # ledger, ``Ledger.changed`` or ``Ledger.notify``), ``charge_waiting`` and
    # ``open_waiting`` into a wait. The layers above never see it.

    def try_charge(self, node: Node, **counts: int) -> bool:
        """``charge``, or False (nothing charged) when only headroom leased to subtrees
        elsewhere stands in the way: ``charge_waiting`` waits for it. Raises
        ``BudgetExceeded`` when refused."""
        try:
            self.charge(node, **counts)
        except HeldUp:
            return False
        return True

    def try_open(self, parent: Node, *, name: str, limits: Budget | None) -> Node | None:
        """``open``, or None (nothing opened) when only headroom leased to subtrees
        elsewhere stands in the way: ``open_waiting`` waits for it. Raises
        ``BudgetExceeded`` when refused."""
        try:
            return self.open(parent, name=name, limits=limits)
        except HeldUp:
            return None

    async def charge_waiting(self, node: Node, **counts: int) -> None:
        """``charge``, waiting while headroom is held by leases (see ``_ledger``)."""
        while not self.try_charge(node, **counts):
            await self._wait_for_leases(node)

    async def open_waiting(self, parent: Node, *, name: str, limits: Budget | None) -> Node:
        """``open``, waiting while headroom is held by leases (see ``_ledger``)."""
        while True:
            node = self.try_open(parent, name=name, limits=limits)
            if node is not None:
                return node
            await self._wait_for_leases(parent)

    async def _wait_for_leases(self, node: Node) -> None:
        node.waiting = "waiting for budget: headroom leased to subtrees on other hosts"
        self.waiting += 1
        self.waits += 1
        began = self.now()
        try:
            await self.ledger.changed()
        finally:
            node.waiting = ""
            self.waiting -= 1
            self.wait_seconds += self.now() - began

    #: The refusal for new work on a node that is already stopped.
    stopped = staticmethod(stopped)

    def charge(self, node: Node, **counts: int) -> None:
        """Check-and-increment counters on the whole chain, atomically.

        ``counts``: how much of each counter to charge, by its ``Budget`` field name
        (``steps=1``, ``tool_calls=1``: the fields ``FIELDS`` says are charged here).
        ``requests``: requests a model built on another sends during one call, after
        the one its reservation counted (each admitted before it is sent; see
        ``Reservation.requests``): counted here, their tokens in the reservation.
        """
        if node.stop_status is not None:
            raise self.stopped(node)
        if "steps" in counts:
            self._cap_steps(node, counts["steps"])
        if node.limited:  # every check first, then every charge: atomic
            blocked = False
            for name, amount in counts.items():
                if name not in CHARGED:
                    raise _not_charged(name)
                if not amount:
                    continue
                current: Node | None = node
                while current is not None:
                    budget = current.limits
                    if budget is not None:
                        limit: int | None = getattr(budget, name)
                        if limit is not None:
                            used = getattr(current, name) + amount
                            if used > limit:
                                self._spent(current, name, limit, Want.of(name, amount))
                            held = current.held
                            if held is not None and used + getattr(held, name) > limit:
                                blocked = self._held_up(current, name, limit)
                    current = current.parent
            if blocked:
                raise HeldUp
        for name, amount in counts.items():
            add = _ADD.get(name)
            if add is None:
                raise _not_charged(name)
            add(node, amount)

    def _cap_steps(self, node: Node, steps: int) -> None:
        """The runtime's default cap on the steps of one execution."""
        caps = self.caps
        if caps is not None and caps.steps is not None and node.own_steps + steps > caps.steps:
            error = _over_cap("steps", caps.steps, node)
            self.stop_subtree(node, "budget_exceeded", str(error), error)
            raise error

    # -- model requests: reserve, wait, settle ------------------------------------------
    #
    # ``reserve`` (or ``reserve_nowait``) counts a request and holds headroom for it on
    # its chain, waiting first come first served while requests in flight (or leases
    # of subtrees elsewhere) hold what it needs; ``settle`` charges what it really
    # used and serves whoever waits; ``release`` gives back one never sent. The
    # arithmetic is ``_admission``'s.

    def need(
        self,
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
        return need, self._admit(node, need, max_tokens, _NEW)

    def _admit(
        self, node: Node, need: Need, max_tokens: int | None, seq: float
    ) -> Reservation | Node:
        """Reserve for one request, or return the node it must wait for.

        Raises ``BudgetExceeded`` when a node's settled usage has no room for it
        (that node is stopped with its subtree). ``seq`` is the request's place in
        line: it waits behind requests already waiting with a smaller one.
        """
        if node.stop_status is not None:
            raise self.stopped(node)
        if not node.limited:  # no budget on the chain: nothing to check, no one waits
            return hold(node, need.input, need.price, need.wanted, max_tokens, max_tokens or 0)
        current: Node | None = node
        while current is not None:  # spent? (settled usage only)
            budget = current.limits
            if budget is not None:
                if budget.cost is not None and need.price is None:
                    raise no_price(current, need.model)
                error = refusal(current, budget, need)
                if error is not None:
                    if current.lender is not None:  # a leased subtree: ask for more
                        if not current.in_flight:
                            current.lender.want(current, want_of(need))
                        return current
                    self.stop_subtree(current, "budget_exceeded", str(error), error)
                    raise error
            current = current.parent
        share = math.inf
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
                room, field = free_output(current, budget, need)
                if room < need.output:
                    held = current.held
                    if current.lender is not None and not current.in_flight:
                        current.lender.want(current, want_of(need))
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
            return hold(node, need.input, need.price, need.wanted, max_tokens, max_tokens or 0)
        cap = int(min(need.wanted, share))
        if cap >= need.wanted:
            limited_by, limit = None, ""
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
        if self.ledger.asks_waiting:
            self.ledger.serve()

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
            self.stop_subtree(owner, "budget_exceeded", str(error), error)
        if over is not None:
            self.stop_over(over)
        if self._queues or self.ledger.asks_waiting:
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

    def stop_over(self, over: tuple[Node, str, float, float]) -> None:
        """Usage went past a limit (a request, here or on a host, used more than its
        estimate): stop that limit's node with its subtree."""
        error = overshoot(over)
        self.stop_subtree(over[0], "budget_exceeded", str(error), error)

    # -- observing --------------------------------------------------------------------

    def snapshot(self) -> TreeSnapshot:
        """The tree as it is now: live nodes, then recently finished ones."""
        now = self.now()
        order = _parents_first
        nodes: list[NodeSnapshot] = []
        for node in sorted(self.nodes.values(), key=order):
            self.snapshot_nodes(nodes, node, now)
        for node in sorted(self._finished, key=order):
            self.snapshot_nodes(nodes, node, now)
        return TreeSnapshot(nodes=tuple(nodes))

    def subtree(self, top: Node) -> list[NodeSnapshot]:
        """The nodes below ``top`` (live and recently finished), parents first."""
        if not top.agents:
            return []  # it opened none
        now = self.now()
        below: list[Node] = []
        for node in [*self.nodes.values(), *self._finished]:
            current = node.parent
            while current is not None and current is not top:
                current = current.parent
            if current is top:
                below.append(node)
        below.sort(key=_parents_first)
        return [self._snapshot(node, now) for node in below]

    def snapshot_nodes(self, nodes: list[NodeSnapshot], node: Node, now: float) -> None:
        """Append ``node``'s snapshot, then, for the top of a subtree that runs on
        another host, the last snapshot that host sent of its nodes."""
        nodes.append(self._snapshot(node, now))
        lease = node.lease
        if lease is not None and lease.nodes:
            nodes.extend(lease.nodes)

    def _snapshot(self, node: Node, now: float) -> NodeSnapshot:
        end = node.ended if node.ended is not None else now
        lease = node.lease
        return NodeSnapshot(
            id=node.id,
            parent_id=node.parent.id if node.parent is not None else None,
            depth=node.depth,
            name=node.name,
            actor_id=node.actor_id,
            status=node.status,
            stop_reason=node.stop_reason,
            waiting=node.waiting,
            usage=node.usage(),
            own_usage=node.own_usage(),
            steps=node.steps,
            agents=node.agents,
            limits=node.limits,
            started=node.started - self._origin,
            seconds=end - node.started,
            host=lease.host if lease is not None else "",
        )


def _parents_first(node: Node) -> tuple[float, int]:
    """A parent starts before its children (and is shallower when started together)."""
    return node.started, node.depth


def _over_cap(limit: str, allowed: int, node: Node) -> BudgetExceeded:
    """A default cap of the runtime refused: it says which and how to change it."""
    return BudgetExceeded(
        limit,
        allowed,
        node.id,
        node.name,
        why=f"the runtime's default cap on {_CAPPED[limit]}; raise it or remove it with "
        f"Runtime(caps=Caps({limit}=...))",
    )


def _not_charged(name: str) -> TypeError:
    return TypeError(f"charge() takes the counters {', '.join(sorted(CHARGED))}, not {name!r}")


def _adder(name: str) -> Callable[[Node, int], None]:
    """The charge of counter ``name`` to a node, its ancestors and its own count
    (written out, not by ``getattr`` and ``setattr``: a charge is made for every
    tool call and step)."""
    add: Callable[[Node, int], None] = derived(
        "def add(node, amount):\n"
        "    current = node\n"
        "    while current is not None:\n"
        f"        current.{name} += amount\n"
        "        current = current.parent\n"
        f"    node.own_{name} += amount\n"
    )
    return add


#: The charge of each counter ``charge`` takes.
_ADD = {name: _adder(name) for name in CHARGED}

_CAPPED = {
    "depth": "the depth of a tree",
    "agents": "the agents under one top-level execution",
    "steps": "the steps of one execution",
}
