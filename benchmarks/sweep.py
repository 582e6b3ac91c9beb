"""The tool sweep (``fractor bench --sweep``) against a tool whose knee is known.

A tool behind a semaphore of 8, each call holding it 100 ms, serves at most 80 calls
a second: throughput grows up to 8 calls in flight and is flat past it, while the
calls wait longer. The sweep measures levels 2 to 32 through the tool call path and
must find its knee at 8; its throughput there is set beside a raw anyio loop that
keeps 8 calls of the same function in flight (no tool, no sweep). This was a test
until the suite stopped asserting wall-clock figures: a loaded machine stalls a
level and moves the knee, which a benchmark reports and a test should not guess.
"""

from __future__ import annotations

import time

import anyio

from fractor.actors.ui import sweep

from ._harness import Row, judged, summarize

WIDTH = 8
HOLD = 0.1


async def run(*, quick: bool = False) -> list[Row]:
    calls = 32 if quick else 64
    levels = [2, 4, 8, 16, 32]
    gate = anyio.Semaphore(WIDTH)

    async def pooled(x: int) -> int:
        """Answer ``x`` after 100 ms, at most 8 at once."""
        async with gate:
            await anyio.sleep(HOLD)
        return x

    async def raw() -> float:
        """Calls per second of ``pooled`` with 8 in flight, in a plain task group."""
        left = calls

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await pooled(1)

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(WIDTH):
                tg.start_soon(worker)
        return calls / (time.perf_counter() - began)

    ours: list[float] = []
    baseline: list[float] = []
    knees: list[int | None] = []
    for _ in range(1 if quick else 3):
        report = await sweep(pooled, levels, calls=calls, arguments='{"x": 1}')
        knees.append(report.knee)
        ours.append(next(level.throughput for level in report.levels if level.concurrency == WIDTH))
        baseline.append(await raw())
    row = summarize(
        f"tool sweep, semaphore {WIDTH} (knee {'/'.join(map(str, knees))})",
        "ops/s",
        ours,
        baseline,
        better="higher",
    )
    found = max(set(knees), key=knees.count)
    return [judged(row, f"knee at {WIDTH}, >= 0.9 x raw", found == WIDTH and row.ratio >= 0.9)]
