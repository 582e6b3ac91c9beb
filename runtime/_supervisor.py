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
``Node``\ s (``_tree``; the snapshots it hands out in ``_snapshots``), the admission
of model requests (``_admission``, an ``Admission`` that owns the requests waiting
for headroom, a line per node, first come first served, and the arithmetic and the
checks of reported usage), and the ledger of the leases of subtrees on other hosts
(``_ledger``, a ``Ledger``). Neither part knows the supervisor: each is handed what
it needs (the root, the caps, the prices, how to serve and to stop). The supervisor
hands the admission's methods on as its own (``reserve``, ``reserve_nowait``,
``settle``, ``release``, ``need``, ``would_refuse``, ``stop_over``), bound, so a
request pays no frame more for the part. What it keeps itself: the tree, the
counters' charges and the stops.

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

from ._admission import Admission, OutputSharing
from ._budget import CHARGED, Budget, Caps, Price, derived
from ._exceptions import BudgetExceeded
from ._lease import LOST_WHY, HeldUp, Want
from ._ledger import Ledger
from ._rates import TOOL_LANE, RateLimit, Rates
from ._snapshots import EndStatus, NodeSnapshot, TreeSnapshot
from ._tree import Cancellable, Node, stopped
from ._waiter import clock

__all__ = ["DEFAULT_MAX_TOKENS", "MIN_OUTPUT_TOKENS", "Supervisor"]

#: How many finished nodes a snapshot still shows.
FINISHED_KEPT = 10_000
#: The output tokens reserved for a request that asks for no cap of its own.
DEFAULT_MAX_TOKENS = 4_096
#: The least output a request is sent with: a budget whose settled usage leaves less
#: (plus the input estimate) is spent; one whose free headroom is smaller waits.
MIN_OUTPUT_TOKENS = 256


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
        output_sharing: OutputSharing = "fair",
        rate_limits: dict[str, RateLimit] | None = None,
        count_refused: bool = False,
        tool_limits: dict[str, int] | None = None,
    ) -> None:
        if caps is not None and not isinstance(caps, Caps):
            raise TypeError(f"caps must be a fractor.Caps or None, got {type(caps).__qualname__}")
        self.budget = budget
        #: Bounds on any tree, budget or not (None: none).
        self.caps = caps
        self._ids = itertools.count(1)
        #: Makes node (execution) ids unique across runtimes sharing one store: 64
        #: random bits, so that even a million runtimes writing to one store are
        #: unlikely to meet (a stored record with the same id would be replaced).
        self.token = secrets.token_hex(8)
        self._origin = 0.0
        self.root = Node("root", "runtime", None, budget, math.inf, None, 0.0)
        self.nodes: dict[str, Node] = {"root": self.root}
        self._finished: deque[Node] = deque(maxlen=FINISHED_KEPT)
        #: The running backend's clock (set by ``start``).
        self.now: Callable[[], float] = anyio.current_time
        #: The leases of subtrees that run on other hosts.
        if output_sharing not in ("fair", "whole"):
            raise ValueError(f'output_sharing must be "fair" or "whole", got {output_sharing!r}')
        self.ledger = ledger = Ledger(
            self.root,
            caps,
            serve=self.serve_chain,
            stop=self.stop_subtree,
            whole=output_sharing == "whole",
        )
        #: The admission of model requests, and the requests waiting for headroom.
        self.admission = admission = Admission(
            dict(prices or {}),
            default_max_tokens=default_max_tokens,
            min_output_tokens=min_output_tokens,
            whole=output_sharing == "whole",
            stop=self.stop_subtree,
            serve_asks=ledger.serve,
            leases_changed=ledger.changed,
            now=anyio.current_time,
        )
        # The supervisor's own methods for model requests are the admission's, bound
        # here: a request pays no frame more for the part (see ``Admission``).
        self.need = admission.need
        self.would_refuse = admission.would_refuse
        self.reserve_nowait = admission.reserve_nowait
        self.reserve = admission.reserve
        self.settle = admission.settle
        self.release = admission.release
        self.stop_over = admission.stop_over
        #: The rate limits of the runtime's models: one lane a model.
        lanes = dict(rate_limits or {})
        for tool, cap in (tool_limits or {}).items():
            if not isinstance(tool, str) or not tool:
                raise ValueError(f"a tool limit's tool name must be a non-empty string: {tool!r}")
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ValueError(f"tool_limits[{tool!r}] must be a whole number >= 1, got {cap!r}")
            lanes[TOOL_LANE + tool] = RateLimit(concurrent=cap)
        self.rates = Rates(lanes, lambda: self.now(), count_refused=count_refused)

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
        self.admission.closed(node)
        ledger = self.ledger
        if ledger.idle and node in ledger.idle:  # its idle leases on hosts end with it
            ledger.closed(node)
        if node.limited and self.ledger.telling:  # a budget's parts are worth more now
            self.ledger.hint()

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

    def try_step(self, node: Node) -> bool:
        """``try_charge(node, steps=1)``: an execution's step, charged before its model
        request. On a chain with no budget (under the default cap, if one is set)
        the counters are added here, with no counts to build and read back.

        A fast path that pays (with ``try_tool_call``): W2 per step at S = 50 is
        about 10 % slower through ``try_charge`` (17.5 against 15.6 us a step, medians
        of 15 interleaved runs); a property test checks both give what ``try_charge``
        gives (``test_try_step_and_try_tool_call_give_what_try_charge_gives``)."""
        if node.limited or node.stop_status is not None:
            return self.try_charge(node, steps=1)
        caps = self.caps
        if caps is not None and caps.steps is not None and node.own_steps >= caps.steps:
            return self.try_charge(node, steps=1)  # (refused there, saying why)
        current: Node | None = node
        while current is not None:
            current.steps += 1
            current = current.parent
        node.own_steps += 1
        return True

    def try_tool_call(self, node: Node) -> bool:
        """``try_charge(node, tool_calls=1)``: one tool call, charged before it runs
        (on a chain with no budget, added here, as ``try_step`` does)."""
        if node.limited or node.stop_status is not None:
            return self.try_charge(node, tool_calls=1)
        current: Node | None = node
        while current is not None:
            current.tool_calls += 1
            current = current.parent
        node.own_tool_calls += 1
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
            await self.admission.wait_for_leases(node)

    async def open_waiting(self, parent: Node, *, name: str, limits: Budget | None) -> Node:
        """``open``, waiting while headroom is held by leases (see ``_ledger``)."""
        while True:
            node = self.try_open(parent, name=name, limits=limits)
            if node is not None:
                return node
            await self.admission.wait_for_leases(parent)

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

    def serve_chain(self, node: Node) -> None:
        """Serve the requests (and leases' asks) waiting on ``node``'s chain: its
        headroom changed (the ledger calls it)."""
        self.admission.serve_chain(node)

    # -- observing --------------------------------------------------------------------

    @property
    def prices(self) -> dict[str, Price]:
        """The price of each model, by name."""
        return self.admission.prices

    @property
    def default_max_tokens(self) -> int:
        """The output cap first reserved for a request that names none, when a limit
        applies (a reply cut there is asked again with more: ``Reservation.again``)."""
        return self.admission.default_max_tokens

    @property
    def output_sharing(self) -> OutputSharing:
        """How requests in flight share an output-capping limit's headroom."""
        return "whole" if self.admission.whole else "fair"

    @property
    def min_output_tokens(self) -> int:
        """The least output a request is sent with (capped by its own max_tokens)."""
        return self.admission.min_output_tokens

    @property
    def waiting(self) -> int:
        """Requests and charges waiting for budget now."""
        return self.admission.waiting

    @property
    def waits(self) -> int:
        """Requests and charges that waited for budget so far."""
        return self.admission.waits

    @property
    def wait_seconds(self) -> float:
        """Seconds spent waiting for budget so far, all waits added up."""
        return self.admission.wait_seconds

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
        if lease is not None:
            member = lease.members.get(node)
            if member is not None and member.nodes:
                nodes.extend(member.nodes)

    def _snapshot(self, node: Node, now: float) -> NodeSnapshot:
        end = node.ended if node.ended is not None else now
        lease = node.lease
        return NodeSnapshot(
            id=node.id,
            parent_id=node.parent.id if node.parent is not None else None,
            depth=node.depth,
            name=node.name,
            actor_id=node.actor_id,
            status=node.shown_status(),
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
