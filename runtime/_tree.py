r"""The supervisor's tree: one ``Node`` per execution.

A node holds its execution's place in the tree (parent, children, depth), its limits
(a ``Budget``, a deadline), its usage (totals of its subtree and its own), what
requests in flight and leases of subtrees elsewhere hold of its headroom, and how it
ended. Only the ``Supervisor`` (and its ledger) mutates nodes; everyone else sees
``NodeSnapshot``\ s (``_snapshots``). The requests waiting for a node's headroom are
the supervisor's, not the node's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from ._budget import COUNTED, FIELDS, OWN, Budget, Usage, derived
from ._exceptions import BudgetExceeded
from ._lease import Held, Lease, Lender

# The snapshots are defined below the tree (a lease carries them); named here too,
# where the runtime looks them up.
from ._snapshots import EndStatus, NodeSnapshot, NodeStatus, TreeSnapshot

if TYPE_CHECKING:
    pass

__all__ = [
    "Cancellable",
    "EndStatus",
    "Node",
    "NodeSnapshot",
    "NodeStatus",
    "TreeSnapshot",
    "stopped",
]


class Cancellable(Protocol):
    """A cancel scope, or a reference to an actor whose task can be cancelled."""

    def cancel(self) -> None: ...


_FRACTIONAL = frozenset(field.name for field in FIELDS if not field.whole)
#: Set each count of a node (``COUNTED``, ``OWN``) to nothing, in its kind (a float
#: for cost); its usage (``Usage``'s fields), of its subtree and its own.
_zero = derived(
    "def zero(node):\n"
    + "".join(
        f"    node.{prefix}{name} = {0.0 if name in _FRACTIONAL else 0!r}\n"
        for prefix, names in (("", COUNTED), ("own_", OWN))
        for name in names
    )
)
_usage = derived(
    "def usage(node):\n    return Usage("
    + ", ".join(f"{name}=node.{name}" for name in Usage.__struct_fields__)
    + ")\n",
    Usage=Usage,
)
_own_usage = derived(
    "def own_usage(node):\n    return Usage("
    + ", ".join(f"{name}=node.own_{name}" for name in Usage.__struct_fields__)
    + ")\n",
    Usage=Usage,
)


class Node:
    """One execution in the tree.

    Its usage, limits and status are mutated only by the ``Supervisor``; the agents
    layer sets what it runs with: ``actor_id``, ``attempt``, ``scope``, and ``layer``
    (what it keeps with the subtree, which the kernel never reads).
    """

    __slots__ = (
        "actor_id",
        "attempt",
        "children",
        "deadline",
        "deadline_owner",
        "depth",
        "ended",
        "held",
        "id",
        "in_flight",
        "layer",
        "lease",
        "leaves",
        "lender",
        "limited",
        "limits",
        "name",
        "parent",
        "reserved_cost",
        "reserved_input",
        "reserved_output",
        "scope",
        "started",
        "status",
        "stop_error",
        "stop_reason",
        "stop_status",
        "waiting",
        # Its counts (see ``FIELDS``): of its subtree, and of itself alone.
        *COUNTED,
        *(f"own_{name}" for name in OWN),
    )
    # The counts read by name (every one of ``COUNTED`` and ``OWN`` is made and
    # zeroed from those tables, whether or not it is typed here).
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    requests: int
    tool_calls: int
    steps: int
    agents: int
    cost: float
    own_input_tokens: int
    own_output_tokens: int
    own_cached_tokens: int
    own_requests: int
    own_tool_calls: int
    own_steps: int
    own_cost: float

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
        #: Whether this node or an ancestor has a budget.
        self.limited: bool = limits is not None or (parent is not None and parent.limited)
        self.deadline = deadline
        self.deadline_owner = deadline_owner
        self.started = started
        self.ended: float | None = None
        self.actor_id = ""
        #: Which attempt of its task runs now (a restarted execution runs again on
        #: the same node): set by the agents layer, 1 for the first.
        self.attempt = 1
        self.children: set[Node] = set()
        #: What the supervisor cancels to stop this node's execution: its cancel
        #: scope, or the task of its actor (anything with ``cancel()``).
        self.scope: Cancellable | None = None
        self.status: NodeStatus = "running"
        #: Set when the supervisor stops this node (limit, cancellation): how it ends.
        self.stop_status: EndStatus | None = None
        self.stop_reason = ""
        #: The refusal that stopped it, when a limit did.
        self.stop_error: BudgetExceeded | None = None
        # Its counts: totals of this node and its whole subtree (``<name>``), and
        # what this node itself consumed, without its descendants (``own_<name>``).
        _zero(self)
        self.reserved_input = 0
        self.reserved_output = 0
        self.reserved_cost = 0.0
        #: Requests under this node holding a reservation now.
        self.in_flight = 0
        #: Running executions in this subtree with no running children (this one
        #: included): the ones that may send a model request next.
        self.leaves = 0
        #: Why this node's own request waits for budget ("" when it does not).
        self.waiting = ""
        #: What leases of remote subtrees below hold of this node's headroom.
        self.held: Held | None = None
        #: Set on the node of a subtree that runs on another host: its lease.
        self.lease: Lease | None = None
        #: Set on a host's top node of a leased subtree: where it asks for more.
        self.lender: Lender[Node] | None = None
        #: What the layer above keeps with this node's subtree (the agents layer: where
        #: its executions leave themselves, who watches its events): set on a node,
        #: handed to the nodes opened below it, never read here.
        self.layer: object = None if parent is None else parent.layer

    def shown_status(self) -> NodeStatus:
        """The status a snapshot shows: the node's own, but for the root. The root is
        the runtime itself, which never ends (the supervisor never closes it): it
        shows ``running`` while an execution runs under it, ``idle`` when none does."""
        if self.parent is not None:
            return self.status
        return "running" if self.children else "idle"

    def chain(self) -> Iterator[Node]:
        """This node, then each ancestor up to the root."""
        node: Node | None = self
        while node is not None:
            yield node
            node = node.parent

    def usage(self) -> Usage:
        """Totals of this node and its subtree."""
        usage: Usage = _usage(self)
        return usage

    def own_usage(self) -> Usage:
        """What this node itself consumed, without its descendants."""
        usage: Usage = _own_usage(self)
        return usage

    def __repr__(self) -> str:
        return f"<Node {self.id!r} depth={self.depth} {self.status}>"


def stopped(node: Node) -> BudgetExceeded:
    """The refusal for new work on a node that is already stopped."""
    cause = node.stop_error
    if cause is not None:
        return BudgetExceeded(cause.limit, cause.allowed, cause.node_id, cause.node_name)
    return BudgetExceeded("no new work", 0, node.id, node.name)
