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
``render_tree`` (``_draw.py``) and ``LatestLines`` and ``ProgressLines``
(``_lines.py``), can be used on their own. Rich is imported when a view is made
(``_draw.py``), not with this module: ``fractor.actors`` re-exports ``watch``, and
``import fractor`` loads no rich.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from fractor.runtime import Event, Runtime, Subscription

from ._lines import LatestLines, ProgressLines

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

__all__ = ["LatestLines", "LiveView", "ProgressLines", "watch"]


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
        from ._draw import PipeConsole  # rich, once a view is made

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
        from ._draw import render_tree

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
                from rich.live import Live

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
        events = self._events
        if events is not None:  # the last frame reads every event emitted before it
            while (event := events.receive_nowait()) is not None:
                self.latest.feed(event)
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
