"""Tools for ``test_bench``: ``fractor bench --tool tests.actors.cli.bench_tools:NAME``."""

from __future__ import annotations

import itertools
import time

import anyio

from fractor.actors import tool

#: Not a function: ``--tool`` must refuse it.
NOT_CALLABLE = 3

_calls = itertools.count(1)


async def slow_echo(x: int) -> int:
    """Answer ``x`` after 5 ms."""
    await anyio.sleep(0.005)
    return x


def sync_echo(x: int) -> int:
    """Answer ``x`` after 2 ms, blocking (so it runs in a worker thread)."""
    time.sleep(0.002)
    return x


async def picky(x: int) -> int:
    """Answer ``x``; raise on a negative one."""
    await anyio.lowlevel.checkpoint()
    if x < 0:
        raise ValueError(f"x must be >= 0, got {x}")
    return x


async def every_fourth_fails(x: int) -> int:
    """Raise on every fourth call (reset ``_calls`` before counting)."""
    await anyio.lowlevel.checkpoint()
    if next(_calls) % 4 == 0:
        raise RuntimeError("every fourth call fails")
    return x


@tool(name="echo_tool", timeout=5)
async def echo_tool(x: int, label: str = "") -> str:
    """Already a ``Tool``: answer ``label`` and ``x``."""
    await anyio.lowlevel.checkpoint()
    return f"{label}{x}"
