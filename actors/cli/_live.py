"""A live view of a runtime's tree: a rich tree on a terminal, progress lines elsewhere.

::

    async with Runtime() as rt, watch(rt):
        lead = await rt.spawn(agent)
        result = await lead.ask("...")

On a terminal, ``watch`` redraws a tree of every execution of ``rt.tree()`` about ten
times a second: agent name, status, steps, tokens (against the node's token limit
when it has one), tool calls and elapsed time, and under each running agent the
latest line of the text its model is streaming (``LatestLines``, read from the
events). The last frame stays on screen when the block ends. Without a terminal (a
pipe, CI, ``TERM=dumb``) it prints one line per execution start and end, spawn,
budget stop, deadline, retry and restart instead, read from the event stream
(``rt.events()``); ``steps=True`` adds a line per model step. Leaving the block
stops the view, after the lines of every event emitted before that have been printed.

Everything here only reads: snapshots (``rt.tree()``) and events. The pure parts,
``render_tree`` here and ``LatestLines`` and ``ProgressLines`` (``_lines.py``), can
be used on their own.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from types import TracebackType

import anyio
from anyio.abc import TaskGroup
from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text
from rich.tree import Tree

from fractor.runtime import Event, NodeSnapshot, NodeStatus, Runtime, Subscription, TreeSnapshot

from ._lines import LatestLines, ProgressLines

__all__ = [
    "STATUS_STYLE",
    "LatestLines",
    "LiveView",
    "PipeConsole",
    "ProgressLines",
    "own_steps",
    "render_tree",
    "tree_order",
    "watch",
]

#: Icon and style of each status in the live tree and the usage table.
STATUS_STYLE: dict[str, tuple[str, str]] = {
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


def _label(node: NodeSnapshot, steps: int, frame: int, line: str = "") -> Text:
    tools = node.own_usage.tool_calls
    parts: list[Text | str] = [
        f"{steps} step{'' if steps == 1 else 's'}",
        _tokens(node),
        f"{tools} tool call{'' if tools == 1 else 's'}",
        _seconds(node),
    ]
    status = _status(node.status, frame)
    if node.waiting and node.status == "running":
        status = Text("⧗ waiting for budget", style="bold yellow")
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
    ``lines``, a running agent shows the latest line its model streamed.
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
            line = lines.line(node.id) if lines is not None else ""
            add(branch.add(_label(node, steps[node.id], frame, line)), node)
        if hidden:
            counts: dict[str, int] = {}
            for node in hidden:
                counts[node.status] = counts.get(node.status, 0) + 1
            listed = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
            branch.add(Text(f"… {len(hidden)} more: {listed}", style="dim"))

    add(tree, root)
    return tree


# -- plain progress lines -----------------------------------------------------------------


# -- the view -------------------------------------------------------------------------------


class PipeConsole(Console):
    """A rich ``Console`` that raises ``BrokenPipeError`` when its reader goes away.

    Rich's own reaction (``SystemExit`` from inside whatever task was writing) is
    reported badly by an event loop; a plain error reaches the caller, and a command
    line can stop quietly on it (``fractor demo | head``).
    """

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")


class LiveView:
    """The view ``watch`` returns: an async context manager (see the module docstring)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        console: Console | None = None,
        refresh: float = 0.1,
        plain: bool | None = None,
        steps: bool = False,
        title: str = "fractor",
        max_children: int = 12,
    ) -> None:
        if not (isinstance(refresh, int | float) and math.isfinite(refresh) and refresh > 0):
            raise ValueError(f"refresh must be a number of seconds > 0, got {refresh!r}")
        if not isinstance(max_children, int) or max_children < 1:
            raise ValueError(f"max_children must be a whole number >= 1, got {max_children!r}")
        self.rt = rt
        self.console = PipeConsole() if console is None else console
        self.refresh = refresh
        #: Plain progress lines instead of the live tree (default: when not a terminal).
        self.plain = (
            not self.console.is_terminal or self.console.is_dumb_terminal
            if plain is None
            else plain
        )
        self.title = title
        self.max_children = max_children
        self.lines = ProgressLines(steps=steps)
        #: What each running agent streams, under it in the live tree.
        self.latest = LatestLines()
        self._stack = AsyncExitStack()
        self._task_group: TaskGroup | None = None
        self._live: Live | None = None
        self._events: Subscription | None = None
        self._frame = 0

    def render(self) -> RenderableType:
        """The current frame of the live tree."""
        self._frame += 1
        return render_tree(
            self.rt.tree(),
            title=self.title,
            max_children=self.max_children,
            frame=self._frame,
            lines=self.latest,
        )

    async def __aenter__(self) -> LiveView:
        async with AsyncExitStack() as stack:
            # Unwound in reverse: the loop task stops first, then the view is finished
            # (the last frame drawn, or every event still buffered printed).
            loop: Callable[[], Awaitable[None]]
            if self.plain:
                events = await stack.enter_async_context(self.rt.events())
                stack.callback(self._drain, events)
                self._events = events
                loop = self._print_events
            else:
                self._events = await stack.enter_async_context(self.rt.events())
                live = Live(
                    self.render(), console=self.console, auto_refresh=False, transient=False
                )
                live.start(refresh=True)
                stack.callback(self._stop_live, live)
                self._live = live
                loop = self._animate
            self._task_group = await stack.enter_async_context(anyio.create_task_group())
            self._task_group.start_soon(loop)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()
        try:
            return await self._stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            leaves = list(_leaves(group))
            # The body's own exception, alone: let it through as it was raised.
            if exc is not None and all(leaf is exc for leaf in leaves):
                return False
            # One error of the view (its output went away, say): raised as itself too.
            if len(leaves) == 1:
                raise leaves[0] from None
            raise
        finally:
            self._task_group = None
            self._events = None

    def _stop_live(self, live: Live) -> None:
        live.update(self.render(), refresh=False)
        live.stop()
        self._live = None

    async def _animate(self) -> None:
        live = self._live
        events = self._events
        assert live is not None
        assert events is not None
        latest = self.latest
        while True:
            await anyio.sleep(self.refresh)
            while (event := events.receive_nowait()) is not None:
                latest.feed(event)
            live.update(self.render(), refresh=True)

    async def _print_events(self) -> None:
        events = self._events
        assert events is not None
        async for event in events:
            self._print(event)

    def _drain(self, events: Subscription) -> None:
        while (event := events.receive_nowait()) is not None:
            self._print(event)

    def _print(self, event: Event) -> None:
        line = self.lines.line(event)
        if line is not None:
            self.console.out(line, highlight=False)


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


def watch(
    rt: Runtime,
    *,
    console: Console | None = None,
    refresh: float = 0.1,
    plain: bool | None = None,
    steps: bool = False,
    title: str = "fractor",
    max_children: int = 12,
) -> LiveView:
    """Watch ``rt`` while the block runs: ``async with watch(rt): ...``.

    ``console`` is where to draw (default: a ``PipeConsole`` on stdout); ``refresh``
    the seconds between frames of the live tree; ``plain`` forces progress lines
    (True) or the live tree (False) instead of choosing by whether the console is a
    terminal; ``steps`` adds a progress line per model step; ``title`` heads the
    tree, and ``max_children`` bounds the children drawn under one node.
    """
    return LiveView(
        rt,
        console=console,
        refresh=refresh,
        plain=plain,
        steps=steps,
        title=title,
        max_children=max_children,
    )
