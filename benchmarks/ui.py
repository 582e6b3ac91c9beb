"""W6 with the web view open: the page's cost on a run of 1,000 agents.

A lead fans out to 1,000 children (the scripted model; each child one tool call and
an answer, as in W3 and the Scale workload). The same run is timed with
``serve_ui(rt)`` open and a client reading ``/api/tree`` at the page's rate (a
thread of its own, as a browser would be another process), and without any view,
alternating, several rounds; the median wall of each side. Target: the run with the
page open takes at most 1.1 x the wall of the run without it. Reported beside it:
the events per second the view absorbed (the run's events / its wall with the page)
and how many views were published meanwhile.

Twice: with tools that answer at once (the run lasts less than one view's interval:
what the page costs is its listener of the events, ~15 a child), and with tools
taking ``LATENCY`` seconds (the tree of 1,000 running agents lives across several
views, each built, encoded and read at the page's rate). A full collection is made
before each timed run, on both sides: with 1,000 agents alive one costs more than
the page does, and where it lands is luck. A third run pauses the collector on both
sides (reported): the work the page adds, apart from collections (mostly the events
built for its listener: what any observer of the runtime pays).
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import anyio
import msgspec

from fractor.actors import Agent, ModelResponse, Tool, ToolCall, tool
from fractor.runtime import Runtime

from ._common import _USAGE, CycleModel, fanout_turns
from ._harness import Row, judged, single, summarize

__all__ = ["W6_TARGET", "Measured", "run", "w6"]

#: The wall with the page open, at most this times the wall without it.
W6_TARGET = 1.1
#: How often the client reads the view: the page's own rate (page.html polls every
#: 300 ms, one request at a time).
POLL = 0.3
#: The seconds a child's tool call takes in the second run (a tree alive across
#: several views of the page, each of 1,000 running agents).
LATENCY = 1.0


async def _work(x: int) -> int:
    await anyio.lowlevel.checkpoint()
    return x


work = tool(_work, name="work")


def waiting(latency: float) -> Tool[Any, Any]:
    """The children's tool when it takes ``latency`` seconds (as real tools and models
    do: the tree is then alive across several views of the page)."""

    async def _wait(x: int) -> int:
        await anyio.sleep(latency)
        return x

    return tool(_wait, name="work")


def lead(children: int, latency: float = 0.0) -> Agent:
    """A lead delegating to ``children`` children at once, each one call (of a tool
    taking ``latency`` seconds) and an answer."""
    call = waiting(latency) if latency else work
    child = Agent("child", CycleModel(fanout_turns("work", 1)), tools=[call])
    calls = tuple(
        ToolCall(id=f"call_0_{i}", name="child", arguments=f'{{"task": "part {i}"}}')
        for i in range(children)
    )
    turns = [
        ModelResponse(tool_calls=calls, usage=_USAGE, finish_reason="tool_calls"),
        ModelResponse(text="merged", usage=_USAGE),
    ]
    return Agent("lead", CycleModel(turns), subagents=[child], tool_concurrency=children)


class _Version(msgspec.Struct):
    version: int


_version = msgspec.json.Decoder(_Version).decode


class Poller:
    """A client in a thread of its own reading ``/api/tree`` every ``POLL`` seconds,
    one request at a time, as the page does."""

    def __init__(self, url: str, token: str, interval: float = POLL) -> None:
        self.url = f"{url}/api/tree?token={token}"
        self.interval = interval
        self.reads = 0
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="w6-poller", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with urllib.request.urlopen(self.url, timeout=30) as response:
                body = response.read()
            _version(body)
            self.reads += 1
            self.bytes += len(body)
            self._stop.wait(self.interval)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """One timed run: its wall, and with the page, the views published and read."""

    wall: float
    #: CPU seconds of the whole process meanwhile (every thread: the server's, the client's).
    cpu: float
    views: int = 0
    reads: int = 0
    view_bytes: int = 0


@contextmanager
def _collector(paused: bool) -> Iterator[None]:
    """A full collection first; with ``paused``, none during the block (then as before)."""
    gc.collect()
    if not paused:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def once(
    children: int,
    *,
    page: bool,
    interval: float | None = None,
    latency: float = 0.0,
    paused: bool = False,
) -> Measured:
    """One run of the lead with ``children``, with the page open (and read) or not
    (with ``paused``, the garbage collector paused while it runs)."""
    from fractor.actors.ui import serve_ui

    agent = lead(children, latency)
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        # A full collection now on either side, not one billed to the run it lands in
        # (one costs tens of ms with 1,000 agents alive: more than the page does).
        if not page:
            with _collector(paused):
                began, cpu = time.perf_counter(), time.process_time()
                result = await ref.ask("go")
                wall, cpu = time.perf_counter() - began, time.process_time() - cpu
            assert result.status == "completed", result
            return Measured(wall=wall, cpu=cpu)
        options = {} if interval is None else {"interval": interval}
        async with serve_ui(rt, announce=lambda url: None, **options) as ui:  # type: ignore[arg-type]
            base = ui.url.split("/?")[0]
            first = _version(ui.view()).version
            with _collector(paused), Poller(base, ui.token, interval or POLL) as poller:
                began, cpu = time.perf_counter(), time.process_time()
                result = await ref.ask("go")
                wall, cpu = time.perf_counter() - began, time.process_time() - cpu
            assert result.status == "completed", result
            views = _version(ui.view()).version - first
            return Measured(
                wall=wall, cpu=cpu, views=views, reads=poller.reads, view_bytes=len(ui.view())
            )


async def events_of(children: int, latency: float = 0.0) -> int:
    """How many events one run emits (counted in a run of its own, untimed)."""
    agent = lead(children, latency)
    async with Runtime() as rt, rt.events(buffer=100 * children + 1_000) as events:
        ref = await rt.spawn(agent)
        await ref.ask("go")
        count = 0
        while events.receive_nowait() is not None:
            count += 1
        assert events.missed == 0
        return count


async def w6(
    children: int,
    rounds: int,
    interval: float | None = None,
    latency: float = 0.0,
    paused: bool = False,
) -> list[Row]:
    """The rows: the wall with and without the page (judged), the CPU time of the
    process with and without it, the events per second the view absorbed, the views
    published during a run. ``latency``: the seconds each child's tool call takes;
    ``paused``: the collector paused during the timed runs (the wall is then
    reported, not judged: it shows the work the page adds, apart from where
    collections land)."""
    page = partial(once, children, page=True, interval=interval, latency=latency, paused=paused)
    bare_run = partial(once, children, page=False, latency=latency, paused=paused)
    await bare_run()
    await page()
    without: list[Measured] = []
    opened: list[Measured] = []
    for index in range(rounds):  # alternating, each first in turn
        if index % 2:
            opened.append(await page())
            without.append(await bare_run())
        else:
            without.append(await bare_run())
            opened.append(await page())
    walls = [m.wall for m in opened]
    bare = [m.wall for m in without]
    tools = f", tools of {latency:g} s," if latency else ""
    tools += ", collector paused," if paused else ""
    row = summarize(
        f"W6 K={children:,}{tools} with the page open (wall)", "s", walls, bare, better="lower"
    )
    cpu = summarize(
        f"  W6{tools} CPU of the process, page open vs not ({rounds} rounds)",
        "s",
        [m.cpu for m in opened],
        [m.cpu for m in without],
        better="lower",
    )
    events = await events_of(children, latency)
    rate = events / statistics.median(walls)
    bare_rate = events / statistics.median(bare)
    views = statistics.median(m.views for m in opened)
    reads = statistics.median(m.reads for m in opened)
    size = statistics.median(m.view_bytes for m in opened)
    return [
        judged(row, "reported", True)
        if paused
        else judged(row, f"<= {W6_TARGET:g} x without", row.ratio >= 1 / W6_TARGET),
        judged(cpu, "reported", True),
        single(
            f"  W6 events/s the view absorbed ({events:,} events a run)",
            "ops/s",
            rate,
            bare_rate,
            ratio=rate / bare_rate,
            target="reported",
            holds=True,
        ),
        single(
            f"  W6 views published, read: {reads:g} a run of {size / 1024:,.0f} KiB",
            "count",
            views,
            0,
            ratio=1.0,
            target="reported",
            holds=True,
        ),
    ]


async def run(*, quick: bool = False) -> list[Row]:
    rounds = 3 if quick else 11
    return [
        *await w6(1_000, rounds),
        *(await w6(1_000, rounds, paused=True))[:2],
        *await w6(1_000, rounds, latency=LATENCY),
    ]
