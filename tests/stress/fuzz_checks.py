"""The checks of the fault-injection fuzz (``tests.stress.fuzz``): DESIGN.md section 5.

Every check returns the violations it found as strings, each prefixed with the number
of the invariant it breaks; none asserts, so one tree reports everything wrong with
it. The fuzz calls them on every request every model received, on tree snapshots
taken while the tree runs and after it, on every ``Result``, on the conversations of
the top-level agents between rounds of asks, and on every value that crossed an
actor boundary.

Every text an agent writes carries its marker ``<name>`` (see ``marker``), so a
child's text found where it does not belong shows.

Across hosts, what a host changes is said where it applies: the driver sees a
remote subtree's nodes as its host last sent them, while the subtree's top node
here is charged by every report, so the top's usage may be ahead of its children
(``lagging``); and the driver's ledger holds headroom leased to the hosts: on each
limited node, settled usage plus what leases hold stays within the limit
(``check_held``), and once every subtree has answered, all that leases still hold
is what hosts that were lost took with them (``check_leases_returned``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from fractor.actors import (
    AssistantMessage,
    DigestMessage,
    Message,
    ModelRequest,
    Result,
    SystemMessage,
    ToolResultMessage,
    UserMessage,
)
from fractor.runtime import (
    Budget,
    Caps,
    Event,
    Node,
    NodeSnapshot,
    TreeSnapshot,
    Usage,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)
from fractor.runtime.lowlevel import LEASED

__all__ = [
    "NOT_STARTED",
    "STATUSES",
    "check_events",
    "check_held",
    "check_leases_returned",
    "check_request",
    "check_result",
    "check_tree",
    "marker",
    "markers_in",
    "remote_tops",
    "round_trip",
]

STATUSES = frozenset({"completed", "budget_exceeded", "timed_out", "cancelled", "failed"})
USAGE_FIELDS = ("input_tokens", "output_tokens", "cached_tokens", "requests", "tool_calls")
#: How the summary section's one message begins (``Agent(memory=...)``).
SUMMARY_HEADING = "Summary of the conversation before the turns below ("
#: How the answer to an ask the supervisor refused to start begins.
NOT_STARTED = "[budget_exceeded] The task was not started"
#: Agent names are ``t<i>`` for top-level agents, ``<parent>s<i>`` for subagents.
_MARKER = re.compile(r"<(t\d+(?:s\d+)*)>")


def marker(name: str) -> str:
    """The marker every text written by the agent ``name`` carries."""
    return f"<{name}>"


def markers_in(message: Message) -> set[str]:
    """The names of the agents whose markers ``message`` holds."""
    text = message.content
    if isinstance(message, AssistantMessage) and message.tool_calls:
        text += " ".join(f" {c.name} {c.arguments}" for c in message.tool_calls)
    return set(_MARKER.findall(text))


# -- invariant 6 -----------------------------------------------------------------------


def round_trip(value: Any, kind: Any, what: str) -> list[str]:
    """6: ``value`` comes back equal through msgspec JSON and through MessagePack."""
    found = []
    for codec, encode, decode in (
        ("JSON", encode_json, decode_json),
        ("MessagePack", encode_msgpack, decode_msgpack),
    ):
        try:
            back = decode(encode(value), kind)
        except Exception as exc:
            found.append(f"6: {what} does not round-trip through {codec}: {_error(exc)}")
            continue
        if back != value:
            found.append(f"6: {what} comes back different through {codec}: {value!r:.300}")
    return found


def _error(exc: BaseException) -> str:
    return f"{exc!r:.300}"


# -- invariants 1, 2 and 3 in one inference context ------------------------------------------


def check_request(
    name: str,
    request: ModelRequest,
    *,
    system: str,
    allowed: frozenset[str],
    children: frozenset[str],
    fresh: bool,
    summary: bool = False,
) -> list[str]:
    """One step request the model of agent ``name`` received.

    2: the context is the system prompt, the summary section (only if the agent
    compacts: ``summary``), user/final pairs, the task, then the execution buffer,
    a digest of earlier attempts first in it at most (``fresh``: a subagent's actor
    starts with no pairs). 3: in the buffer each tool result follows its call, with
    its id, and no call lacks one; ids are unique. 1: the only markers are the
    agent's own and ``allowed``'s (its ancestors wrote its task), save a child's in
    the result of the call that delegated to that child (or in a digest of them).
    """
    where = f"a request of {name}"
    found: list[str] = []
    messages = request.messages
    start = 0
    if request.purpose != "step":
        found.append(f"2: {where} is for a {request.purpose!r}")
    if system:
        if not messages or messages[0] != SystemMessage(content=system):
            found.append(f"2: {where} does not open with its system prompt")
        start = 1
    if summary and len(messages) > start and isinstance(messages[start], SystemMessage):
        if not messages[start].content.startswith(SUMMARY_HEADING):
            found.append(f"2: {where} has a summary section of {messages[start]!r:.100}")
        start += 1
    users = [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]
    if not users:
        return [*found, f"2: {where} holds no task"]
    task = users[-1]
    history = messages[start:task]
    if len(history) % 2 or (fresh and history):
        found.append(f"2: {where} has {len(history)} messages of history before its task")
    for index, message in enumerate(history):
        kind = UserMessage if index % 2 == 0 else AssistantMessage
        if not isinstance(message, kind) or (
            isinstance(message, AssistantMessage) and message.tool_calls
        ):
            found.append(f"2: {where} has {type(message).__name__} at {start + index} of history")
            break
    digest = task + 1 < len(messages) and isinstance(messages[task + 1], DigestMessage)
    found.extend(_check_buffer(where, messages, task + 1 + digest))
    found.extend(_check_isolation(where, messages, allowed | {name}, children))
    return found


def _check_buffer(where: str, messages: Sequence[Message], start: int) -> list[str]:
    """3: call groups only, each call answered once, right after it."""
    found: list[str] = []
    ids: set[str] = set()
    index = start
    while index < len(messages):
        message = messages[index]
        if not isinstance(message, AssistantMessage) or not message.tool_calls:
            found.append(
                f"2: {where} has a digest at {index}, not first in its buffer"
                if isinstance(message, DigestMessage)
                else f"3: {where} has {type(message).__name__} unanswered at {index}"
            )
            index += 1
            continue
        calls = {c.id: c.name for c in message.tool_calls}
        if len(calls) != len(message.tool_calls) or "" in calls or not ids.isdisjoint(calls):
            found.append(f"3: {where} has a missing or repeated call id at {index}: {calls}")
        ids.update(calls)
        results = messages[index + 1 : index + 1 + len(message.tool_calls)]
        answered = {r.call_id: r.name for r in results if isinstance(r, ToolResultMessage)}
        if len(results) != len(calls) or answered != calls:
            found.append(f"3: {where}: the calls at {index} ({calls}) are answered by {answered}")
        index += 1 + len(message.tool_calls)
    return found


def _check_isolation(
    where: str, messages: Sequence[Message], allowed: frozenset[str], children: frozenset[str]
) -> list[str]:
    found: list[str] = []
    called: dict[str, str] = {}
    for index, message in enumerate(messages):
        foreign = markers_in(message) - allowed
        if isinstance(message, AssistantMessage):
            called.update((c.id, c.name) for c in message.tool_calls)
        elif (
            isinstance(message, ToolResultMessage)
            and message.name in children
            and called.get(message.call_id) == message.name
        ):
            foreign.discard(message.name)  # the delegated child's answer, where it belongs
        elif isinstance(message, DigestMessage):
            foreign -= children  # what earlier attempts' delegations answered
        if foreign:
            found.append(
                f"1: {where} holds text of {sorted(foreign)} in its "
                f"{type(message).__name__} at {index}: {message.content!r:.200}"
            )
    return found


# -- invariant 4 -------------------------------------------------------------------------


def remote_tops(tree: TreeSnapshot) -> list[NodeSnapshot]:
    """The tops of the subtrees placed on hosts: nodes on a host whose parent is here."""
    here = {node.id for node in tree.nodes if not node.host}
    return [node for node in tree.nodes if node.host and node.parent_id in here]


def check_tree(
    tree: TreeSnapshot,
    *,
    caps: Caps | None,
    seconds_slack: float,
    where: str,
    lagging: Collection[str] = (),
) -> list[str]:
    """4: every node's usage is its own plus its children's, and no node is over any
    limit of its ``Budget``: usage fields, steps, agents, depth below it, and
    seconds (its subtree ends within ``seconds_slack`` of its deadline). A node's
    depth is within the runtime's caps; a child starts no earlier than its parent.

    A node in ``lagging`` (the top of a subtree on another host, whose children are
    as their host last sent them) may be ahead of its children, never behind."""
    found: list[str] = []
    nodes = {node.id: node for node in tree.nodes}
    children: dict[str, list[str]] = {}
    for node in tree.nodes:
        if node.parent_id is not None:
            children.setdefault(node.parent_id, []).append(node.id)
    for node in tree.nodes:
        total = sum((nodes[c].usage for c in children.get(node.id, ())), node.own_usage)
        ahead = node.id in lagging
        found.extend(
            f"4: {where}: {node.id} has {field}={getattr(node.usage, field)}, "
            f"own + children = {getattr(total, field)}"
            for field in USAGE_FIELDS
            if getattr(node.usage, field) != getattr(total, field)
            and not (ahead and getattr(node.usage, field) > getattr(total, field))
        )
        if not (
            math.isclose(node.usage.cost, total.cost, rel_tol=1e-9, abs_tol=1e-12)
            or (ahead and node.usage.cost > total.cost)
        ):
            found.append(f"4: {where}: {node.id} cost {node.usage.cost} != {total.cost}")
        parent = nodes.get(node.parent_id) if node.parent_id is not None else None
        if parent is not None and node.started < parent.started:
            found.append(
                f"4: {where}: {node.id} (host {node.host!r}) started at {node.started:.6f}, "
                f"before its parent {parent.id} (host {parent.host!r}) at {parent.started:.6f}"
            )
        # The root is the runtime itself: idle while nothing runs under it.
        idle = node.status == "idle" and node.parent_id is None
        if node.status not in STATUSES and node.status != "running" and not idle:
            found.append(f"4: {where}: {node.id} has status {node.status!r}")
        if caps is not None and caps.depth is not None and node.depth > caps.depth:
            found.append(f"4: {where}: {node.id} at depth {node.depth}, cap {caps.depth}")
        limits = node.limits
        if limits is not None:
            used = {"steps": node.steps, "agents": node.agents}
            found.extend(over_limits(node.usage, limits, f"{where}: {node.id}", used))
            found.extend(_check_below(node.id, limits, nodes, children, seconds_slack, where))
    return found


def over_limits(
    usage: Usage, limits: Budget, where: str, counters: Mapping[str, int] | None = None
) -> list[str]:
    """4: which of ``limits`` ``usage`` (and ``counters``: steps, agents) is over."""
    used: dict[str, float] = {
        "tokens": usage.input_tokens + usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "requests": usage.requests,
        "tool_calls": usage.tool_calls,
        **(counters or {}),
    }
    found = [
        f"4: {where} used {value} {field}, over its limit of {getattr(limits, field)}"
        for field, value in used.items()
        if getattr(limits, field) is not None and value > getattr(limits, field)
    ]
    if limits.cost is not None and usage.cost > limits.cost * (1 + 1e-9):
        found.append(f"4: {where} cost {usage.cost}, over its limit of {limits.cost}")
    return found


def _check_below(
    node_id: str,
    limits: Budget,
    nodes: Mapping[str, Any],
    children: Mapping[str, list[str]],
    slack: float,
    where: str,
) -> list[str]:
    """The depth and seconds limits of ``node_id`` over its whole subtree."""
    if limits.depth is None and limits.seconds is None:
        return []
    found = []
    top = nodes[node_id]
    stack = list(children.get(node_id, ()))
    while stack:
        below = nodes[stack.pop()]
        stack.extend(children.get(below.id, ()))
        if limits.depth is not None and below.depth - top.depth > limits.depth:
            found.append(f"4: {where}: {below.id} is {below.depth - top.depth} below {node_id}")
        if limits.seconds is not None and below.status != "running":
            late = below.started + below.seconds - (top.started + limits.seconds)
            if late > slack:
                found.append(
                    f"4: {where}: {below.id} ended {late:.3f} s after the deadline of {node_id}"
                )
    if limits.seconds is not None and top.parent_id is not None and top.status != "running":
        late = top.seconds - limits.seconds
        if late > slack:
            found.append(f"4: {where}: {node_id} ran {late:.3f} s past its own deadline")
    return found


def check_events(
    tree: TreeSnapshot, events: Iterable[Event], *, moved: Collection[str] = ()
) -> list[str]:
    """4: each event of an execution in the tree says where that execution is: its
    depth, its parent, its host (a remote one's events come from its host). Not
    ``spawn`` (an actor spawned for a call names the calling execution) nor
    ``restart`` events (an agent's restart names no place); and, for the executions
    in ``moved`` (placed again after their host was lost), not the host."""
    found = []
    nodes = {node.id: node for node in tree.nodes}
    for event in events:
        node = nodes.get(event.execution_id)
        if node is None or event.kind in ("spawn", "restart"):
            continue
        # A top-level execution's parent is named "root" by some events, "" by others.
        parent = "" if node.parent_id in (None, "root") else node.parent_id
        said = "" if event.parent_id == "root" else event.parent_id
        host = event.detail.get("host", "")
        if (event.depth, said) != (node.depth, parent) or (
            host != node.host and node.id not in moved
        ):
            found.append(
                f"4: a {event.kind} event of {node.id} puts it at depth {event.depth} under "
                f"{event.parent_id!r} on {host!r}; its node is at depth {node.depth} under "
                f"{parent!r} on {node.host!r}"
            )
    return found


def _node_used(node: Node, name: str) -> float:
    if name == "tokens":
        return node.input_tokens + node.output_tokens
    value: float = getattr(node, name)
    return value


def check_held(nodes: Iterable[Node], where: str) -> list[str]:
    """4 with leases: on every limited node, settled usage plus what the leases of
    subtrees on other hosts hold of it (lost hosts' included) is within the limit:
    headroom granted to a host is spent as surely as headroom used here."""
    found = []
    for node in nodes:
        limits, held = node.limits, node.held
        if limits is None or held is None:
            continue
        for name in LEASED:
            limit = getattr(limits, name)
            if limit is None:
                continue
            used, holds = _node_used(node, name), getattr(held, name)
            slack = 1e-9 * limit if name == "cost" else 0
            if used + holds > limit + slack:
                found.append(
                    f"4: {where}: {node.id} used {used} {name} and leases hold {holds}, "
                    f"over its limit of {limit}"
                )
    return found


def check_leases_returned(root: Node, *, lost: bool) -> list[str]:
    """4 after every subtree answered: no lease is live, and all that leases still
    hold is what the leases of lost hosts took (nothing, unless a host was ``lost``)."""
    held = root.held
    if held is None:
        return []
    found = []
    if held.leases or held.holding:
        found.append(f"4: {held.leases} leases ({held.holding} holding) outlive their subtrees")
    gone = held.lost
    if gone is not None and not lost:
        found.append("4: leases count as lost, and no host was")
    for name in LEASED:
        left = getattr(held, name)
        taken = getattr(gone, name) if gone is not None else 0
        if not math.isclose(left, taken, rel_tol=1e-9, abs_tol=1e-12):
            found.append(f"4: leases still hold {left} {name}, lost hosts took {taken}")
    return found


# -- invariants 4 and 5 on one reply --------------------------------------------------------


def check_result(
    result: Result,
    tree: TreeSnapshot,
    *,
    expected: Budget | None,
    budgets: Iterable[Budget | None],
    where: str,
) -> list[str]:
    """One ``Result`` of a top-level ask: a known status and a text; the node it names
    ended as it says, carries the limits that were set (``expected``: the agent's
    budget merged with the ask's) and the Result's usage is that node's (the whole
    tree's) and within every one of ``budgets``."""
    found: list[str] = []
    if result.status not in STATUSES or not result.text:
        found.append(f"5: {where}: a Result with status {result.status!r}, text {result.text!r}")
    if not result.execution_id:
        if result.status != "budget_exceeded" or not result.text.startswith(NOT_STARTED):
            found.append(f"5: {where}: a Result of no execution: {result!r:.300}")
        if result.usage != Usage():
            found.append(f"4: {where}: a turn that never started used {result.usage}")
        return found
    try:
        node = tree.node(result.execution_id)
    except KeyError:
        return [*found, f"4: {where}: no node {result.execution_id} in the tree"]
    if (node.status, node.stop_reason) != (result.status, result.stop_reason):
        found.append(
            f"5: {where}: the node ended {node.status} ({node.stop_reason!r:.120}), "
            f"the Result says {result.status} ({result.stop_reason!r:.120})"
        )
    if node.limits != expected:
        found.append(f"4: {where}: node limits {node.limits}, set {expected}")
    # Its usage is the whole tree's: remote subtrees' included, charged here by
    # their reports.
    found.extend(
        f"4: {where}: the Result's {field} is {getattr(result.usage, field)}, "
        f"its node's {getattr(node.usage, field)}"
        for field in USAGE_FIELDS
        if getattr(result.usage, field) != getattr(node.usage, field)
    )
    if not math.isclose(result.usage.cost, node.usage.cost, rel_tol=1e-9, abs_tol=1e-12):
        found.append(f"4: {where}: the Result's cost is {result.usage.cost}, its node's other")
    for budget in budgets:
        if budget is not None:
            found.extend(over_limits(result.usage, budget, where))
    return found
