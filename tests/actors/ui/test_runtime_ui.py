"""``Runtime(ui=serve_ui)``: the web view held open by the runtime itself, from the
moment it is entered until its actors ended (the runtime's ``enter``), as ``rt.ui``."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import anyio
import httpx2
import msgspec
import pytest

from fractor import Agent, Runtime, ScriptedModel, call, reply, serve_ui, tool
from fractor.actors.ui import UI, TreeView


def quiet(url: str) -> None:
    """What ``announce`` gets instead of stderr."""


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_a_runtime_serves_its_tree_while_it_runs_and_stops_serving_as_it_ends() -> None:
    release = anyio.Event()

    @tool
    async def wait() -> str:
        """Wait for the test."""
        await release.wait()
        return "done"

    agent = Agent(name="lead", model=ScriptedModel([call("wait"), reply("ok")]), tools=[wait])
    async with Runtime(ui=partial(serve_ui, announce=quiet, interval=0.05)) as rt:
        ui = rt.ui
        assert isinstance(ui, UI)
        assert ui.url.startswith("http://127.0.0.1:")
        ref = await rt.spawn(agent)
        async with anyio.create_task_group() as group, httpx2.AsyncClient() as client:
            group.start_soon(ref.ask, "go")
            with anyio.fail_after(10):
                while True:
                    await anyio.sleep(0.05)
                    response = await client.get(
                        f"http://127.0.0.1:{ui.port}/api/tree", params={"token": ui.token}
                    )
                    assert response.status_code == 200
                    view = msgspec.json.decode(response.content, type=TreeView)
                    statuses = {node.agent: node.status for node in view.nodes}
                    if statuses.get("lead") == "running":
                        break
            refused = await client.get(f"http://127.0.0.1:{ui.port}/api/tree")
            assert refused.status_code == 403
            release.set()
        port = ui.port
        assert listening(port)
    assert not listening(port)


async def test_a_ui_that_fails_to_start_leaves_nothing_running() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        rt = Runtime(ui=partial(serve_ui, port=port, announce=quiet))
        with pytest.raises(OSError, match="in use"):
            async with rt:
                pytest.fail("the body ran without its view")
        assert rt.state == "closed"
        assert rt.ui is None


async def test_the_view_is_entered_once_running_and_exited_after_every_actor_ended() -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def view(rt: Runtime) -> AsyncIterator[str]:
        seen.append(f"enter {rt.state}")
        yield "the view"
        seen.append(f"exit {rt.state} {rt.statistics().live_actors}")

    async with Runtime(ui=view) as rt:
        assert rt.ui == "the view"
        await rt.spawn(Agent(name="a", model=ScriptedModel([reply("x")])))
        seen.append("body")
    assert seen == ["enter running", "body", "exit closed 0"]


def test_a_ui_that_is_not_callable_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match="ui must be a callable"):
        Runtime(ui="http://127.0.0.1:8000")  # type: ignore[arg-type]
