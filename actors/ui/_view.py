"""What the page shows of a live tree, as plain values: pure functions, no server.

``tree_view`` turns one ``rt.tree()`` snapshot, what the supervisor holds reserved for
requests in flight, the latest streamed lines and the pending approvals into a
``TreeView``, the JSON the page reads (``/api/tree``). Each node carries its own bars,
one per limit of its budget (``Bar``: spent, reserved, left); the page draws under a
node the bars of every node above it that has a budget, since a budget is shared by
its whole subtree.

**Cheap to follow on a big tree.** A view of 1,000 nodes is published a few times a
second; the page updates in place rather than redrawing it. So each node carries
``rev``, a number that changes when anything the page shows of it changes (its
status, usage, bars, wait, line; its ``seconds`` once it ended, not while it runs:
that clock ticks at every view), and the view carries ``digest``, one number for all
of them and the approvals: the page does nothing when the digest is the one it
drew, and redraws only the nodes whose ``rev`` changed. Both are hashes, valid within
one process (the page reads them from one server). Fields at their default (an empty
wait, line, host, stop reason, no bars) are left out of the JSON (``omit_defaults``):
a reader decodes them to their defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec

from fractor.runtime import Budget, NodeSnapshot, TreeSnapshot, Usage

from .._tools._approval import ApprovalRequest

__all__ = ["ApprovalView", "Bar", "Held", "NodeView", "TreeView", "bars", "tree_view"]


class Held(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a node's subtree holds reserved now for model requests in flight."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    requests: int = 0


class Bar(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One limit of a node's budget: how much its subtree spent, holds reserved for
    requests in flight, and has left (never below zero)."""

    field: str
    limit: float
    spent: float
    reserved: float
    left: float


class NodeView(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """One node as the page shows it (``agent`` is the node's name); the fields at
    their default are left out of the JSON."""

    id: str
    parent_id: str | None
    depth: int
    agent: str
    actor_id: str
    status: str
    stop_reason: str = ""
    #: What its model request waits for ("" when it does not wait).
    waiting: str = ""
    host: str = ""
    steps: int = 0
    agents: int = 0
    seconds: float = 0.0
    usage: Usage = Usage()
    #: One per limit of its own budget (none when it has no budget of its own).
    bars: tuple[Bar, ...] = ()
    #: The latest line its model streamed ("" if none).
    line: str = ""
    #: Changes when what the page shows of the node changes (see the module).
    rev: int = 0


class ApprovalView(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A tool call waiting for a person's decision, as the page lists it."""

    id: str
    agent: str
    agent_id: str
    execution_id: str
    path: tuple[str, ...]
    tool: str
    #: The call's arguments, JSON text as the model sent them.
    arguments: str
    at: float


class TreeView(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """The whole page's data: the tree, parents before children, and the approvals."""

    #: Counts the views published so far (1 for the first).
    version: int
    nodes: tuple[NodeView, ...]
    approvals: tuple[ApprovalView, ...]
    #: The same for two views that show the same (every ``rev``, the approvals).
    digest: int = 0


def _tokens(node: NodeSnapshot) -> float:
    return node.usage.input_tokens + node.usage.output_tokens


#: For each field of ``Budget``: what a node's subtree spent of it, and what it holds
#: reserved of it; None for a limit that is not spent (depth: a node's place). A test
#: fails when ``Budget`` has a field this table does not name.
SPENT: Mapping[str, tuple[Callable[[NodeSnapshot], float], Callable[[Held], float]] | None] = {
    "depth": None,
    "tokens": (_tokens, lambda held: held.input_tokens + held.output_tokens),
    "input_tokens": (lambda node: node.usage.input_tokens, lambda held: held.input_tokens),
    "output_tokens": (lambda node: node.usage.output_tokens, lambda held: held.output_tokens),
    "requests": (lambda node: node.usage.requests, lambda held: held.requests),
    "tool_calls": (lambda node: node.usage.tool_calls, lambda held: 0),
    "steps": (lambda node: node.steps, lambda held: 0),
    "agents": (lambda node: node.agents, lambda held: 0),
    "seconds": (lambda node: node.seconds, lambda held: 0),
    "cost": (lambda node: node.usage.cost, lambda held: held.cost),
}

_NOTHING_HELD = Held()
#: Hashes are cut to 53 bits: JavaScript reads them as exact numbers.
_MASK = (1 << 53) - 1
_NO_BARS: tuple[Bar, ...] = ()


def bars(node: NodeSnapshot, held: Held | None = None) -> tuple[Bar, ...]:
    """A bar per limit of ``node``'s own budget, in ``Budget``'s field order."""
    limits: Budget | None = node.limits
    if limits is None:
        return ()
    held = _NOTHING_HELD if held is None else held
    found: list[Bar] = []
    for name in limits.__struct_fields__:
        limit = getattr(limits, name)
        measures = SPENT[name]
        if limit is None or measures is None:
            continue
        spent_of, reserved_of = measures
        spent, reserved = spent_of(node), reserved_of(held)
        left = max(0.0, limit - spent - reserved)
        found.append(Bar(field=name, limit=limit, spent=spent, reserved=reserved, left=left))
    return tuple(found)


def approval_view(request: ApprovalRequest) -> ApprovalView:
    return ApprovalView(
        id=request.id,
        agent=request.agent,
        agent_id=request.agent_id,
        execution_id=request.execution_id,
        path=request.path,
        tool=request.call.name,
        arguments=request.call.arguments,
        at=request.at,
    )


def tree_view(
    snapshot: TreeSnapshot,
    *,
    version: int = 1,
    held: Mapping[str, Held] | None = None,
    lines: Callable[[str], str] | None = None,
    approvals: Sequence[ApprovalRequest] = (),
) -> TreeView:
    """The page's data for ``snapshot``: ``held`` by node id (what each live node
    holds reserved), ``lines(node_id)`` the latest streamed line of a node.

    It runs on the runtime's loop a few times a second over the whole tree: one plain
    loop (a view of 1,000 nodes in about 1 ms; ``rt.tree()`` takes about as long)."""
    held = {} if held is None else held
    nodes: list[NodeView] = []
    ids: list[str] = []
    revs: list[int] = []
    for node in snapshot.nodes:
        shown = _NO_BARS if node.limits is None else bars(node, held.get(node.id))
        line = lines(node.id) if lines is not None else ""
        status = node.status
        # A running node's seconds (and the idle root's) tick at every view: left out
        # of what says it changed (the stop reason changes with the status, the host
        # never).
        ended = node.seconds if status != "running" and status != "idle" else -1.0
        rev = hash((status, node.waiting, node.steps, node.agents, ended, node.usage, shown, line))
        rev &= _MASK
        nodes.append(
            NodeView(
                id=node.id,
                parent_id=node.parent_id,
                depth=node.depth,
                agent=node.name,
                actor_id=node.actor_id,
                status=status,
                stop_reason=node.stop_reason,
                waiting=node.waiting,
                host=node.host,
                steps=node.steps,
                agents=node.agents,
                seconds=node.seconds,
                usage=node.usage,
                bars=shown,
                line=line,
                rev=rev,
            )
        )
        ids.append(node.id)
        revs.append(rev)
    shown_approvals = tuple(approval_view(request) for request in approvals)
    digest = hash((tuple(ids), tuple(revs), shown_approvals)) & _MASK
    return TreeView(
        version=version,
        nodes=tuple(nodes),
        approvals=shown_approvals,
        digest=digest,
    )
