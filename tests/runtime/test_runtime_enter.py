"""``Runtime.enter``: contexts shared by key, held by the runtime, exited when it closes,
after its actors stopped, in reverse order, on every path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import pytest

from fractor.runtime import Runtime, RuntimeClosed


def tracked(log: list[str], name: str) -> Callable[[], AbstractAsyncContextManager[str]]:
    @asynccontextmanager
    async def context() -> AsyncIterator[str]:
        log.append(f"enter {name}")
        try:
            yield name
        finally:
            log.append(f"exit {name}")

    return context


async def test_shared_by_key_and_exited_in_reverse_order() -> None:
    log: list[str] = []
    async with Runtime() as rt:
        results: list[str] = []

        async def enter_a() -> None:
            results.append(await rt.enter("a", tracked(log, "a")))

        async with anyio.create_task_group() as tg:  # concurrent first uses: entered once
            for _ in range(3):
                tg.start_soon(enter_a)
        assert results == ["a", "a", "a"]
        assert await rt.enter("b", tracked(log, "b")) == "b"
        assert log == ["enter a", "enter b"]
    assert log == ["enter a", "enter b", "exit b", "exit a"]


async def test_a_failure_to_enter_raises_and_is_not_kept() -> None:
    attempts = 0

    @asynccontextmanager
    async def flaky() -> AsyncIterator[int]:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("cannot start")
        yield attempts

    async with Runtime() as rt:
        with pytest.raises(OSError, match="cannot start"):
            await rt.enter("k", flaky)
        assert await rt.enter("k", flaky) == 2


@pytest.mark.parametrize("path", ["error", "cancelled"])
async def test_exited_on_every_path_even_when_exiting_is_cancelled(path: str) -> None:
    log: list[str] = []

    @asynccontextmanager
    async def slow_exit() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await anyio.sleep(0.01)  # would be cut short if the exit were not shielded
            log.append("exited")

    async def body() -> None:
        async with Runtime() as rt:
            await rt.enter("k", slow_exit)
            if path == "error":
                raise KeyError("boom")
            outer.cancel()
            await anyio.sleep_forever()

    with anyio.CancelScope() as outer:
        if path == "error":
            with pytest.raises(KeyError):
                await body()
        else:
            await body()
    assert log == ["exited"]


async def test_closed_runtime_refuses() -> None:
    async with Runtime() as rt:
        pass
    with pytest.raises(RuntimeClosed):
        await rt.enter("k", tracked([], "k"))


class Closing:
    def __init__(self, log: list[str], name: str, fail: bool = False) -> None:
        self.log = log
        self.name = name
        self.fail = fail

    async def aclose(self) -> None:
        self.log.append(f"close {self.name}")
        if self.fail:
            raise RuntimeError("cannot close")


async def test_close_on_exit_closes_each_once_in_reverse_after_the_contexts_are_due() -> None:
    log: list[str] = []
    a, b = Closing(log, "a", fail=True), Closing(log, "b")
    async with Runtime() as rt:
        await rt.enter("ctx", tracked(log, "ctx"))
        rt.close_on_exit(a)
        rt.close_on_exit(b)
        rt.close_on_exit(a)  # the same object again: not added twice
        assert log == ["enter ctx"]
    # a failing close is logged and the others are closed all the same
    assert log == ["enter ctx", "close b", "close a", "exit ctx"]
    with pytest.raises(RuntimeClosed):
        rt.close_on_exit(b)
