"""W4: request/response round trips through an actor's mailbox.

Baseline: a raw anyio ping-pong over two memory object streams, one echo task,
written as fast as anyio allows (``send_nowait`` where strict alternation guarantees
room, so only the receives wait).
fractor: ``ActorRef.ask`` to an echo actor. Target: at least 0.5 x raw.
"""

from __future__ import annotations

from typing import Any

import anyio

from fractor.runtime import Actor, Runtime

from ._harness import Row, compare

__all__ = ["run"]


class Echo(Actor):
    async def receive(self, message: Any) -> Any:
        return message


async def run(*, quick: bool = False, round_trips: int | None = None) -> list[Row]:
    if round_trips is None:
        round_trips = 2_000 if quick else 20_000
    repeats = 3 if quick else 5
    async with Runtime() as rt:
        echo = await rt.spawn(Echo())

        async def fractor() -> None:
            ask = echo.ask
            for i in range(round_trips):
                await ask(i)

        async with anyio.create_task_group() as tg:
            to_server, server_inbox = anyio.create_memory_object_stream[int](1)
            to_client, client_inbox = anyio.create_memory_object_stream[int](1)

            async def server() -> None:
                async with server_inbox, to_client:
                    async for item in server_inbox:
                        to_client.send_nowait(item)  # strict alternation: always room

            tg.start_soon(server)

            async def baseline() -> None:
                send, receive = to_server.send_nowait, client_inbox.receive
                for i in range(round_trips):
                    send(i)
                    await receive()

            row = await compare(
                f"W4 mailbox round trips (n={round_trips})",
                fractor=fractor,
                baseline=baseline,
                operations=round_trips,
                repeats=repeats,
                min_ratio=0.5,
            )
            await to_server.aclose()
            await client_inbox.aclose()
    return [row]
