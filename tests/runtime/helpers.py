"""Small actors shared by the kernel tests."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from fractor.runtime import Actor


class Add(msgspec.Struct, frozen=True, kw_only=True):
    amount: int


class Get(msgspec.Struct, frozen=True, kw_only=True):
    pass


class Counter(Actor):
    """Keeps a total; answers ``Get`` with it."""

    accepts = (Add, Get)

    def __init__(self) -> None:
        self.total = 0

    async def receive(self, message: Add | Get) -> int:
        match message:
            case Add(amount=amount):
                self.total += amount
                return self.total
            case Get():
                return self.total
        raise AssertionError("unreachable")  # pragma: no cover


class Recorder(Actor):
    """Records every message it handles, in order."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def receive(self, message: Any) -> Any:
        if message == "dump":
            return list(self.seen)
        self.seen.append(message)
        return None


class Gate(Actor):
    """Blocks in its handler until ``release`` is set; answers with the message."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def receive(self, message: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return message


class Sleeper(Actor):
    """Sleeps forever on every message (until cancelled)."""

    def __init__(self) -> None:
        self.entered = anyio.Event()

    async def receive(self, message: Any) -> Any:
        self.entered.set()
        await anyio.sleep_forever()


class Faulty(Actor):
    """Raises on "boom", echoes anything else."""

    async def receive(self, message: Any) -> Any:
        if message == "boom":
            raise ValueError("boom on purpose")
        return message


class StopOnFailure(Faulty):
    on_failure = "stop"
