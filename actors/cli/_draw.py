"""The live tree drawn with rich: ``render_tree`` (a ``TreeSnapshot`` as a rich ``Tree``),
the icons of the statuses, and ``PipeConsole``. Imported when a view is made (``_live``),
never with the package: ``import fractor`` loads no rich.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from fractor.runtime import NodeSnapshot, NodeStatus, TreeSnapshot

from ._lines import WAITING, LatestLines

__all__ = ["STATUS_STYLE", "PipeConsole", "own_steps", "render_tree", "tree_order"]

#: Icon and style of each status in the live tree and the usage table.
STATUS_STYLE: dict[str, tuple[str, str]] = {
    "idle": ("◌", "dim"),  # the root alone: the runtime, nothing running under it
    "running": ("●", "bold cyan"),
    "completed": ("✔", "green"),
    "budget_exceeded": ("⊘", "bold dark_orange"),
    "timed_out": ("◷", "bold yellow"),
    "cancelled": ("○", "dim"),
    "failed": ("✘", "bold red"),
}
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
#: How many characters of a stop reason the tree shows under a node.
_REASON_SHOWN = 100


# -- the tree ---------------------------------------------------------------------------


def _children(snapshot: TreeSnapshot) -> dict[str | None, list[NodeSnapshot]]:
    children: dict[str | None, list[NodeSnapshot]] = {}
    for node in snapshot.nodes:
        children.setdefault(node.parent_id, []).append(node)
    for nodes in children.values():
        nodes.sort(key=lambda node: node.started)
    return children


def tree_order(snapshot: TreeSnapshot) -> Iterator[NodeSnapshot]:
    """Every node of ``snapshot``, parents before children, siblings in start order."""
    children = _children(snapshot)
    stack = list(reversed(children.get(None, [])))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children.get(node.id, [])))


def own_steps(snapshot: TreeSnapshot) -> dict[str, int]:
    """The steps each node took itself (a node's ``steps`` count its whole subtree)."""
    below: dict[str, int] = {}
    for node in snapshot.nodes:
        if node.parent_id is not None:
            below[node.parent_id] = below.get(node.parent_id, 0) + node.steps
    return {node.id: max(node.steps - below.get(node.id, 0), 0) for node in snapshot.nodes}


def _status(status: NodeStatus, frame: int = 0) -> Text:
    icon, style = STATUS_STYLE.get(status, ("?", ""))
    if status == "running":
        icon = _SPINNER[frame % len(_SPINNER)]
    return Text(f"{icon} {status}", style=style)


def _tokens(node: NodeSnapshot) -> Text:
    used = node.usage.total_tokens
    limit = node.limits.tokens if node.limits is not None else None
    if limit is None:
        return Text(f"{used:,} tokens")
    share = used / limit if limit else 1.0
    style = "green" if share < 0.7 else "yellow" if share < 0.9 else "red"
    filled = min(round(share * 8), 8)
    return Text.assemble(
        (f"{used:,}/{limit:,} tokens ", ""), ("▰" * filled + "▱" * (8 - filled), style)
    )


def _seconds(node: NodeSnapshot) -> str:
    limit = node.limits.seconds if node.limits is not None else None
    return f"{node.seconds:.1f} s" if limit is None else f"{node.seconds:.1f}/{limit:g} s"


def _label(
    node: NodeSnapshot, steps: int, frame: int, line: str = "", media: tuple[str, ...] = ()
) -> Text:
    tools = node.own_usage.tool_calls
    parts: list[Text | str] = [
        f"{steps} step{'' if steps == 1 else 's'}",
        _tokens(node),
        f"{tools} tool call{'' if tools == 1 else 's'}",
        _seconds(node),
    ]
    status = _status(node.status, frame)
    if node.waiting and node.status == "running":
        what = "a rate limit" if node.waiting.startswith("rate limit") else "budget"
        status = Text(f"{WAITING} waiting for {what}", style="bold yellow")
    label = Text.assemble((node.name, "bold"), "  ", status, "  ")
    if node.host:  # a subtree placed on another host (Runtime(hosts=...))
        label = Text.assemble((node.name, "bold"), (f" @{node.host}", "cyan"), "  ", status, "  ")
    label.append_text(
        Text(" · ", style="dim").join(Text(p) if isinstance(p, str) else p for p in parts)
    )
    reason = node.stop_reason if node.status not in ("running", "completed") else node.waiting
    if reason:
        if len(reason) > _REASON_SHOWN:
            reason = reason[: _REASON_SHOWN - 1] + "…"
        label.append(f"\n{reason}", style="dim")
    for part in media:  # its images and documents, one line each
        label.append(f"\n{part}", style="cyan")
    if line and node.status == "running":
        label.append(f"\n“{line}”", style="italic dim")
    return label


def _shown(nodes: list[NodeSnapshot], limit: int) -> tuple[list[NodeSnapshot], list[NodeSnapshot]]:
    """At most ``limit`` of ``nodes`` (the unfinished and the unusual first), in order."""
    if len(nodes) <= limit:
        return nodes, []
    ranked = sorted(nodes, key=lambda node: node.status == "completed")
    keep = {id(node) for node in ranked[: max(limit - 1, 1)]}
    return [n for n in nodes if id(n) in keep], [n for n in nodes if id(n) not in keep]


def render_tree(
    snapshot: TreeSnapshot,
    *,
    title: str = "fractor",
    max_children: int = 12,
    frame: int = 0,
    lines: LatestLines | None = None,
) -> Tree:
    """The tree of ``snapshot`` as a rich ``Tree``: one line per execution.

    Each node shows its agent's name, status, own steps and tool calls, its tokens
    (its subtree's, against its token limit if it has one) and its time; a node that
    stopped for any reason but an answer shows why; a time limit shows next to the
    time. Of more than ``max_children`` children, ``max_children - 1`` are drawn (the
    unfinished or stopped ones first, then in start order) and one more line counts
    the others by status. ``frame`` turns the spinner of running nodes. With
    ``lines``, a running agent shows the latest line its model streamed, and every
    agent the images and documents it was given, its tools returned and it answered
    with, one line each (``LatestLines.parts``).
    """
    children = _children(snapshot)
    steps = own_steps(snapshot)
    roots = children.get(None, [])
    root = roots[0] if roots else None
    if root is None:
        return Tree(Text(title, style="bold"))
    running = sum(node.status == "running" for node in snapshot.nodes if node is not root)
    header = Text.assemble(
        (title, "bold magenta"), "  ", f"{running} running", (" · ", "dim"), _tokens(root)
    )
    if root.usage.cost:
        header.append(f" · cost {root.usage.cost:.4f}", style="dim")
    header.append(f" · {_seconds(root)}", style="dim")
    tree = Tree(header, guide_style="dim")

    def add(branch: Tree, parent: NodeSnapshot) -> None:
        shown, hidden = _shown(children.get(parent.id, []), max_children)
        for node in shown:
            line = ""
            media: tuple[str, ...] = ()
            if lines is not None:
                line, media = lines.line(node.id), lines.parts(node.id)
            add(branch.add(_label(node, steps[node.id], frame, line, media)), node)
        if hidden:
            counts: dict[str, int] = {}
            for node in hidden:
                counts[node.status] = counts.get(node.status, 0) + 1
            listed = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
            branch.add(Text(f"… {len(hidden)} more: {listed}", style="dim"))

    add(tree, root)
    return tree


# -- the console ------------------------------------------------------------------------


class PipeConsole(Console):
    """A rich ``Console`` that raises ``BrokenPipeError`` when its reader goes away.

    Rich's own reaction (``SystemExit`` from inside whatever task was writing) is
    reported badly by an event loop; a plain error reaches the caller, and a command
    line can stop quietly on it (``fractor demo | head``).
    """

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")
