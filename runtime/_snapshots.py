"""What the supervisor hands out about its tree: snapshots of nodes, and how they end.

A ``NodeSnapshot`` is one node as it was when the snapshot was taken; a
``TreeSnapshot`` is the whole tree. They are plain frozen values (a host sends its
subtree's to the tree above, which shows them with its own), so they sit below the
tree itself (``_tree``) and the leases (``_lease``) that carry them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ._budget import Budget, Usage

__all__ = ["EndStatus", "NodeSnapshot", "NodeStatus", "TreeSnapshot"]

EndStatus = Literal["completed", "budget_exceeded", "timed_out", "cancelled", "failed"]
#: ``idle`` is the root's alone (the runtime, with no execution running under it).
NodeStatus = Literal["idle", "running"] | EndStatus


class NodeSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One node of the tree, as it was when the snapshot was taken."""

    id: str
    parent_id: str | None
    depth: int
    name: str
    #: The id of the actor running it (an event's and a result's ``agent_id``); ""
    #: for the root.
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
    #: Why its model request waits for budget ("" when it does not wait).
    waiting: str = ""
    #: The host it runs on, for a node of a subtree placed on another host ("": here).
    host: str = ""


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
