"""Tools for ``test_bench_cli``: ``fractor bench --tool tests.actors.cli.sweep_tools:NAME``."""

from __future__ import annotations

import anyio


async def nap(x: int = 0) -> int:
    """Answer ``x`` after 5 ms."""
    await anyio.sleep(0.005)
    return x
