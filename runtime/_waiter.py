"""Parking one task until another wakes it: the kernel's cheapest wait.

A mailbox parks its actor while it is empty, a full mailbox parks its senders, an
ask parks its caller until the reply. Each park needs one waiter that one other
task wakes at most once. On asyncio a waiter is a bare future of the running loop
(144 bytes, against about 1 KiB for an ``anyio.Event``, whose ``asyncio.Event``
keeps a deque); elsewhere (trio) it is an ``anyio.Event``. Awaiting either is
cancellable by anyio's cancel scopes like any other await: on asyncio the scope
cancels the task, which cancels the future it waits on.

10,000 idle agents each keep one waiter, and every ask makes one: this is why the
kernel does not use anyio's memory object streams for mailboxes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeAlias

import anyio

__all__ = ["Waiter", "clock", "new_waiter", "park", "wake"]

Waiter: TypeAlias = "asyncio.Future[None] | anyio.Event"


def new_waiter() -> Waiter:
    """A waiter for the calling task, to be awaited with ``park`` once."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop in this thread: trio
        task = None
    if task is None:
        return anyio.Event()
    return task.get_loop().create_future()


def wake(waiter: Waiter) -> None:
    """Wake the task parked on ``waiter``; nothing happens if it already left."""
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            waiter.set_result(None)
    else:
        waiter.set()


def park(waiter: Waiter) -> Awaitable[None]:
    """What to await until ``waiter`` is woken (or the task is cancelled).

    Not a coroutine: it hands back the future (or the event's wait) itself, so a
    parked task keeps one frame less.
    """
    if isinstance(waiter, asyncio.Future):
        return waiter
    return waiter.wait()


def clock() -> Callable[[], float]:
    """The running backend's clock (what ``anyio.current_time`` reads) as a plain
    function, looked up once: the loop's own ``time`` on asyncio (each
    ``anyio.current_time()`` first finds out which backend runs), trio's own
    ``current_time`` on trio (half the cost of anyio's, which asks the same)."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:  # no asyncio loop in this thread: trio, imported as it runs
        trio = sys.modules.get("trio")
        now: Callable[[], float] = anyio.current_time if trio is None else trio.current_time
        return now
