"""The supervisor: one tree of executions, their usage, and their hard limits.

Every execution of every agent is a ``Node``. The runtime's own budget sits on the
root; an agent's budget (or the one passed with a task) sits on that execution's
node and covers it and all of its descendants. Usage is charged to the node and to
every ancestor at once, so a node's totals always include its subtree.

Limits are hard, even under heavy concurrency:

- counters (requests, tool calls, steps, agents, depth) are checked on every node of
  the chain and then charged, with no ``await`` in between: nothing can overshoot;
- before a model request, input tokens are checked with the model's estimate and
  output tokens are **reserved**: ``max_tokens`` is capped to the smallest headroom
  (output tokens, tokens, cost) of every node of the chain, and the reservation
  holds that headroom until the real usage settles it;
- time: a node's deadline is the earlier of its own and its parent's.

When a charge is refused, the node whose limit it is (the charging node or an
ancestor) is stopped with its whole subtree: each execution's cancel scope is
cancelled and each one answers ``budget_exceeded`` naming that limit and node. A
refused spawn (depth, agents) stops nothing: the caller gets the error as a value.
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections import deque
from collections.abc import Iterator
from typing import Literal

import anyio
import msgspec

from ._budget import Budget, Price, Usage
from ._exceptions import BudgetExceeded

__all__ = [
    "EndStatus",
    "Node",
    "NodeSnapshot",
    "NodeStatus",
    "Reservation",
    "Supervisor",
    "TreeSnapshot",
]

EndStatus = Literal["completed", "budget_exceeded", "timed_out", "cancelled", "failed"]
NodeStatus = Literal["running"] | EndStatus

#: How many finished nodes a snapshot still shows.
FINISHED_KEPT = 10_000
#: The output tokens reserved for a request that asks for no cap of its own.
DEFAULT_MAX_TOKENS = 4_096


class NodeSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One node of the tree, as it was when the snapshot was taken."""

    id: str
    parent_id: str | None
    depth: int
    name: str
    actor_id: str
    status: NodeStatus
    stop_reason: str
    usage: Usage
    own_usage: Usage
    steps: int
    agents: int
    limits: Budget | None
    started: float
    seconds: float


class TreeSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The whole tree: live nodes and recently finished ones, parents before children."""

    nodes: tuple[NodeSnapshot, ...]

    def node(self, node_id: str) -> NodeSnapshot:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(f"no node {node_id!r} in this snapshot")

    def children(self, node_id: str) -> tuple[NodeSnapshot, ...]:
        return tuple(node for node in self.nodes if node.parent_id == node_id)


class Reservation:
    """Headroom held for one model request until its real usage is known.

    ``limited_by`` names the node (and ``limit`` the field) whose headroom made
    ``max_tokens`` smaller than the request asked for, if any: a reply cut at that cap
    ran out of budget, it did not end.
    """

    __slots__ = ("cost", "input", "limit", "limited_by", "max_tokens", "output", "price")

    def __init__(
        self,
        input: int,
        output: int,
        cost: float,
        max_tokens: int | None,
        price: Price | None,
        limited_by: Node | None = None,
        limit: str = "",
    ) -> None:
        self.input = input
        self.output = output
        self.cost = cost
        self.max_tokens = max_tokens
        self.price = price
        self.limited_by = limited_by
        self.limit = limit


class Node:
    """One execution in the tree. Mutated only by the ``Supervisor``."""

    __slots__ = (
        "actor_id",
        "agents",
        "cached_tokens",
        "children",
        "cost",
        "deadline",
        "deadline_owner",
        "depth",
        "ended",
        "id",
        "input_tokens",
        "limits",
        "name",
        "output_tokens",
        "own_cached",
        "own_cost",
        "own_input",
        "own_output",
        "own_requests",
        "own_tool_calls",
        "parent",
        "requests",
        "reserved_cost",
        "reserved_input",
        "reserved_output",
        "scope",
        "started",
        "status",
        "steps",
        "stop_error",
        "stop_reason",
        "stop_status",
        "tool_calls",
    )

    def __init__(
        self,
        id: str,
        name: str,
        parent: Node | None,
        limits: Budget | None,
        deadline: float,
        deadline_owner: Node | None,
        started: float,
    ) -> None:
        self.id = id
        self.name = name
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.limits = limits
        self.deadline = deadline
        self.deadline_owner = deadline_owner
        self.started = started
        self.ended: float | None = None
        self.actor_id = ""
        self.children: set[Node] = set()
        self.scope: anyio.CancelScope | None = None
        self.status: NodeStatus = "running"
        #: Set when the supervisor stops this node (limit, cancellation): how it ends.
        self.stop_status: EndStatus | None = None
        self.stop_reason = ""
        #: The refusal that stopped it, when a limit did.
        self.stop_error: BudgetExceeded | None = None
        # Totals: this node and its whole subtree.
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        self.tool_calls = 0
        self.steps = 0
        self.agents = 0
        self.cost = 0.0
        self.reserved_input = 0
        self.reserved_output = 0
        self.reserved_cost = 0.0
        # What this node itself consumed, without its descendants.
        self.own_input = 0
        self.own_output = 0
        self.own_cached = 0
        self.own_requests = 0
        self.own_tool_calls = 0
        self.own_cost = 0.0

    def chain(self) -> Iterator[Node]:
        """This node, then each ancestor up to the root."""
        node: Node | None = self
        while node is not None:
            yield node
            node = node.parent

    def usage(self) -> Usage:
        """Totals of this node and its subtree."""
        return Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_tokens=self.cached_tokens,
            requests=self.requests,
            tool_calls=self.tool_calls,
            cost=self.cost,
        )

    def own_usage(self) -> Usage:
        """What this node itself consumed, without its descendants."""
        return Usage(
            input_tokens=self.own_input,
            output_tokens=self.own_output,
            cached_tokens=self.own_cached,
            requests=self.own_requests,
            tool_calls=self.own_tool_calls,
            cost=self.own_cost,
        )

    def __repr__(self) -> str:
        return f"<Node {self.id!r} depth={self.depth} {self.status}>"


class Supervisor:
    """Tracks the tree and enforces every ``Budget`` across it. Never awaits."""

    def __init__(
        self,
        budget: Budget | None,
        prices: dict[str, Price] | None = None,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        self.budget = budget
        #: The output cap reserved for a request that names none, when a limit applies:
        #: reserving a whole budget's headroom for one request would starve its siblings.
        self.default_max_tokens = default_max_tokens
        self.prices = dict(prices or {})
        self._ids = itertools.count(1)
        #: Makes node (execution) ids unique across runtimes sharing one store.
        self.token = secrets.token_hex(3)
        self._origin = 0.0
        self.root = Node("root", "runtime", None, budget, math.inf, None, 0.0)
        self.nodes: dict[str, Node] = {"root": self.root}
        self._finished: deque[Node] = deque(maxlen=FINISHED_KEPT)

    def start(self) -> None:
        """Start the clock: the runtime's ``seconds`` budget counts from here."""
        self._origin = now = anyio.current_time()
        self.root.started = now
        seconds = self.budget.seconds if self.budget is not None else None
        if seconds is not None:
            self.root.deadline = now + seconds
            self.root.deadline_owner = self.root

    # -- the tree -------------------------------------------------------------------

    def open(self, parent: Node, *, name: str, limits: Budget | None) -> Node:
        """Open a child node of ``parent``; checks depth and agents on the whole chain.

        Raises ``BudgetExceeded`` when the spawn is refused; that stops nothing.
        """
        depth = parent.depth + 1
        for node in parent.chain():
            budget = node.limits
            if budget is None:
                continue
            if budget.depth is not None and depth - node.depth > budget.depth:
                raise BudgetExceeded("depth", budget.depth, node.id, node.name)
            if budget.agents is not None and node.agents + 1 > budget.agents:
                raise BudgetExceeded("agents", budget.agents, node.id, node.name)
        for node in parent.chain():
            node.agents += 1
        now = anyio.current_time()
        deadline, owner = parent.deadline, parent.deadline_owner
        seconds = limits.seconds if limits is not None else None
        node_id = f"{name}#{next(self._ids)}.{self.token}"
        child = Node(node_id, name, parent, limits, deadline, owner, now)
        if seconds is not None and now + seconds < deadline:
            child.deadline, child.deadline_owner = now + seconds, child
        if parent.stop_status is not None:
            child.stop_status, child.stop_reason = parent.stop_status, parent.stop_reason
            child.stop_error = parent.stop_error
        parent.children.add(child)
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
        node.ended = anyio.current_time()
        node.scope = None
        if node.parent is not None:
            node.parent.children.discard(node)
        self.nodes.pop(node.id, None)
        self._finished.append(node)

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
        to_cancel: list[Node] = []
        stack = [(node, True)]
        while stack:
            current, topmost = stack.pop()
            if current.stop_status is None:
                current.stop_status, current.stop_reason = status, reason
                current.stop_error = error
            if cancel and topmost and current.scope is not None:
                to_cancel.append(current)
            below_top = topmost and current.scope is None
            stack.extend((child, below_top) for child in current.children)
        for current in to_cancel:
            if current.scope is not None:
                current.scope.cancel()

    def why_stopped(self, node: Node) -> tuple[EndStatus, str]:
        """How a node that was interrupted ends: a supervisor stop, its deadline, or a
        plain cancellation from outside the tree."""
        if node.stop_status is not None:
            return node.stop_status, node.stop_reason
        if anyio.current_time() >= node.deadline:
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

    def _refuse(self, node: Node, limit: str, allowed: float) -> BudgetExceeded:
        error = BudgetExceeded(limit, allowed, node.id, node.name)
        self.stop_subtree(node, "budget_exceeded", str(error), error)
        return error

    @staticmethod
    def _stopped(node: Node) -> BudgetExceeded:
        """The refusal for new work on a node that is already stopped."""
        cause = node.stop_error
        if cause is not None:
            return BudgetExceeded(cause.limit, cause.allowed, cause.node_id, cause.node_name)
        return BudgetExceeded("no new work", 0, node.id, node.name)

    def charge(self, node: Node, *, steps: int = 0, tool_calls: int = 0) -> None:
        """Check-and-increment counters on the whole chain, atomically."""
        if node.stop_status is not None:
            raise self._stopped(node)
        current: Node | None = node
        while current is not None:
            budget = current.limits
            if budget is not None:
                if steps and budget.steps is not None and current.steps + steps > budget.steps:
                    raise self._refuse(current, "steps", budget.steps)
                if (
                    tool_calls
                    and budget.tool_calls is not None
                    and current.tool_calls + tool_calls > budget.tool_calls
                ):
                    raise self._refuse(current, "tool_calls", budget.tool_calls)
            current = current.parent
        current = node
        while current is not None:
            current.steps += steps
            current.tool_calls += tool_calls
            current = current.parent
        node.own_tool_calls += tool_calls

    def reserve(
        self,
        node: Node,
        *,
        input_estimate: int,
        max_tokens: int | None,
        model: str = "",
    ) -> Reservation:
        """Count one request and hold headroom for it, or refuse it.

        Returns the reservation; its ``max_tokens`` is what the request may ask for.
        """
        if node.stop_status is not None:
            raise self._stopped(node)
        price = self.prices.get(model) if self.prices else None
        wanted = max_tokens if max_tokens is not None else self.default_max_tokens
        cap = max_tokens
        limited_by: Node | None = None
        limit = ""
        current: Node | None = node
        while current is not None:
            budget = current.limits
            if budget is not None:
                lowered, field = self._check_request(current, budget, input_estimate, price, model)
                if lowered is not None and (cap is None or lowered < cap):
                    cap = lowered
                    if lowered < wanted:
                        limited_by, limit = current, field
                    elif max_tokens is None:
                        cap = wanted  # a limit applies: reserve the default, not it all
            current = current.parent
        output = cap or 0
        cost = price.cost(input_estimate, output) if price is not None else 0.0
        current = node
        while current is not None:
            current.requests += 1
            current.reserved_input += input_estimate
            current.reserved_output += output
            current.reserved_cost += cost
            current = current.parent
        node.own_requests += 1
        return Reservation(input_estimate, output, cost, cap, price, limited_by, limit)

    def cut_short(self, node: Node, reservation: Reservation) -> BudgetExceeded | None:
        """A reply that stopped at ``max_tokens`` ("length"): if a budget set that cap,
        the budget's owner has run out, and its subtree is stopped like any refusal."""
        owner = reservation.limited_by
        if owner is None or owner.limits is None:
            return None
        allowed: float = getattr(owner.limits, reservation.limit)
        return self._refuse(owner, reservation.limit, allowed)

    def _check_request(
        self,
        node: Node,
        budget: Budget,
        input_estimate: int,
        price: Price | None,
        model: str,
    ) -> tuple[int | None, str]:
        """Refuse a request over ``node``'s limits, or return the smallest output
        headroom they leave (None when no output limit applies) and its field."""
        if budget.requests is not None and node.requests + 1 > budget.requests:
            raise self._refuse(node, "requests", budget.requests)
        used_input = node.input_tokens + node.reserved_input + input_estimate
        if budget.input_tokens is not None and used_input > budget.input_tokens:
            raise self._refuse(node, "input_tokens", budget.input_tokens)
        cap: int | None = None
        field = ""
        if budget.output_tokens is not None:
            headroom = budget.output_tokens - node.output_tokens - node.reserved_output
            if headroom < 1:
                raise self._refuse(node, "output_tokens", budget.output_tokens)
            cap, field = headroom, "output_tokens"
        if budget.tokens is not None:
            headroom = budget.tokens - used_input - node.output_tokens - node.reserved_output
            if headroom < 1:
                raise self._refuse(node, "tokens", budget.tokens)
            if cap is None or headroom < cap:
                cap, field = headroom, "tokens"
        if budget.cost is not None:
            if price is None:
                raise ValueError(
                    f"Budget.cost is set (budget of {node.name} {node.id!r}) but no price is "
                    f"known for model {model!r}: pass Runtime(prices={{{model!r}: Price(...)}})"
                )
            left = budget.cost - node.cost - node.reserved_cost - price.cost(input_estimate, 0)
            per_token = price.output_per_million / 1_000_000
            if left < 0 or (per_token > 0 and left < per_token):
                raise self._refuse(node, "cost", budget.cost)
            if per_token > 0:
                headroom = math.floor(left / per_token)
                if cap is None or headroom < cap:
                    cap, field = headroom, "cost"
        return cap, field

    def settle(self, node: Node, reservation: Reservation, usage: Usage | None) -> Usage:
        """Release ``reservation`` and charge the real ``usage`` (None: nothing was used).

        Returns the usage as charged, with its cost. If the real usage went past a
        limit (a model's estimate fell short), that node's subtree is stopped.
        """
        input_tokens = output_tokens = cached_tokens = extra_requests = 0
        cost = 0.0
        if usage is not None:
            input_tokens = usage.input_tokens
            output_tokens = usage.output_tokens
            cached_tokens = usage.cached_tokens
            # A model adapter may send several requests for one (ReAct corrections).
            extra_requests = max(usage.requests - 1, 0)
            price = reservation.price
            cost = (
                price.cost(input_tokens, output_tokens, cached_tokens)
                if price is not None
                else usage.cost
            )
        over: tuple[Node, str, float] | None = None
        current: Node | None = node
        while current is not None:
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
                over = _over_limit(current, current.limits) or over
            current = current.parent
        node.own_input += input_tokens
        node.own_output += output_tokens
        node.own_cached += cached_tokens
        node.own_cost += cost
        node.own_requests += extra_requests
        if over is not None:
            self._refuse(*over)
        if usage is None:
            return Usage()
        return Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_tokens=cached_tokens,
            requests=1 + extra_requests,
            cost=cost,
        )

    # -- observing --------------------------------------------------------------------

    def snapshot(self) -> TreeSnapshot:
        """The tree as it is now: live nodes, then recently finished ones."""
        now = anyio.current_time()
        order = _parents_first
        nodes = [self._snapshot(node, now) for node in sorted(self.nodes.values(), key=order)]
        finished = sorted(self._finished, key=order)
        nodes.extend(self._snapshot(node, now) for node in finished)
        return TreeSnapshot(nodes=tuple(nodes))

    def _snapshot(self, node: Node, now: float) -> NodeSnapshot:
        end = node.ended if node.ended is not None else now
        return NodeSnapshot(
            id=node.id,
            parent_id=node.parent.id if node.parent is not None else None,
            depth=node.depth,
            name=node.name,
            actor_id=node.actor_id,
            status=node.status,
            stop_reason=node.stop_reason,
            usage=node.usage(),
            own_usage=node.own_usage(),
            steps=node.steps,
            agents=node.agents,
            limits=node.limits,
            started=node.started - self._origin,
            seconds=end - node.started,
        )


def _parents_first(node: Node) -> tuple[float, int]:
    """A parent starts before its children (and is shallower when started together)."""
    return node.started, node.depth


def _over_limit(node: Node, budget: Budget) -> tuple[Node, str, float] | None:
    """The first request, token or cost limit that real usage went past, if any."""
    if budget.requests is not None and node.requests > budget.requests:
        return node, "requests", budget.requests
    if budget.input_tokens is not None and node.input_tokens > budget.input_tokens:
        return node, "input_tokens", budget.input_tokens
    if budget.output_tokens is not None and node.output_tokens > budget.output_tokens:
        return node, "output_tokens", budget.output_tokens
    if budget.tokens is not None and node.input_tokens + node.output_tokens > budget.tokens:
        return node, "tokens", budget.tokens
    if budget.cost is not None and node.cost > budget.cost + 1e-12:
        return node, "cost", budget.cost
    return None
