"""``fractor mcp-serve``: an agent served as one MCP tool, driven by the ``mcp`` SDK's client.

The command runs as a subprocess (``python -m actors.cli mcp-serve``, the agents of
``served_agents.py``), over stdio and over streamable HTTP on 127.0.0.1; the server
itself (``agent_server``) is also driven in process, on both backends, for the edges.
No network, no real model: the agents' models are ``FunctionModel``\\ s.
"""

from __future__ import annotations

import base64
import importlib.metadata
import pathlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
import msgspec
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from fractor.actors import (
    Agent,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    UserMessage,
    describe_part,
    reply,
)
from fractor.actors.cli import main
from fractor.actors.integrations.mcp_serve import TASK_SCHEMA, agent_server, part_content
from fractor.runtime import Budget, Runtime

from .served_agents import PAINTING, REPORT, echo, greedy

ROOT = pathlib.Path(__file__).parents[3]
AGENTS = "tests.actors.integrations.served_agents"
#: Seconds a test's exchange with a served agent may take (a subprocess starts in ~1 s).
LIMIT = 30


def _text(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


@asynccontextmanager
async def _stdio_session(
    spec: str, tmp_path: pathlib.Path, *options: str
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "fractor.actors.cli", "mcp-serve", spec, *options],
        cwd=ROOT,
    )
    with (tmp_path / "server.err").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
    # The client closed the server's stdin: it stopped its runtime and exited cleanly.
    assert "Traceback" not in (tmp_path / "server.err").read_text()


# -- over stdio, as a subprocess --------------------------------------------------------


async def test_stdio_lists_the_agent_as_one_tool_and_answers_a_call(
    tmp_path: pathlib.Path,
) -> None:
    with anyio.fail_after(LIMIT):
        async with _stdio_session(f"{AGENTS}:echo", tmp_path) as session:
            listed = await session.list_tools()
            assert [tool.name for tool in listed.tools] == ["echo"]
            (tool,) = listed.tools
            assert tool.description == "Shouts the task back, through its tool."
            assert tool.input_schema == TASK_SCHEMA
            result = await session.call_tool("echo", {"task": "hello there"})
            assert not result.is_error
            assert _text(result) == "The agent says: HELLO THERE"
            # Each call spawns the agent afresh: the second answers the same way.
            again = await session.call_tool("echo", {"task": "once more"})
            assert _text(again) == "The agent says: ONCE MORE"
    assert "serving agent 'echo' over stdio" in (tmp_path / "server.err").read_text()


async def test_stdio_an_answers_image_and_pdf_come_back_as_mcp_content(
    tmp_path: pathlib.Path,
) -> None:
    """``fractor mcp-serve`` of an agent whose answer carries a PNG and a PDF: the
    call's result is its text, then the image as ``ImageContent`` (base64 of the very
    bytes, its media type), then the PDF as an embedded blob resource."""
    with anyio.fail_after(LIMIT):
        async with _stdio_session(f"{AGENTS}:painter", tmp_path) as session:
            result = await session.call_tool("painter", {"task": "a red square"})
    assert not result.is_error
    text, image, document = result.content
    assert isinstance(text, types.TextContent)
    assert text.text == "Here it is."
    assert isinstance(image, types.ImageContent)
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data) == PAINTING.data
    assert isinstance(document, types.EmbeddedResource)
    blob = document.resource
    assert isinstance(blob, types.BlobResourceContents)
    assert blob.mime_type == "application/pdf"
    assert base64.b64decode(blob.blob) == REPORT.data
    assert str(blob.uri) == f"fractor://parts/{REPORT.sha256}/report.pdf"


def test_parts_without_bytes_are_links_or_their_line() -> None:
    """A part given by URL comes back as a link to it; one decoded from a store
    without its bytes as its one line, never nothing."""
    link = part_content(Image.from_url("https://example.com/a/chart.png"))
    assert isinstance(link, types.ResourceLink)
    assert (str(link.uri), link.name, link.mime_type) == (
        "https://example.com/a/chart.png",
        "chart.png",
        "image/png",
    )
    stored = msgspec.structs.replace(PAINTING, data=None)
    line = part_content(stored)
    assert isinstance(line, types.TextContent)
    assert line.text == describe_part(PAINTING)


async def test_stdio_the_server_names_fractors_version_and_a_bad_argument(
    tmp_path: pathlib.Path,
) -> None:
    with anyio.fail_after(LIMIT):
        async with _stdio_session(f"{AGENTS}:echo", tmp_path) as session:
            assert session.initialize_result is not None
            info = session.initialize_result.server_info
            assert (info.name, info.version) == ("echo", importlib.metadata.version("fractor"))
            result = await session.call_tool("echo", {"task": 5})
            assert result.is_error
            assert _text(result) == "echo: argument 'task' must be a string, got 5 (a number)"
            missing = await session.call_tool("echo", {})
            assert _text(missing) == (
                "echo: argument 'task' (a string) is missing; no arguments were given"
            )


async def test_stdio_the_agents_budget_stops_its_tree(tmp_path: pathlib.Path) -> None:
    with anyio.fail_after(LIMIT):
        async with _stdio_session(f"{AGENTS}:greedy", tmp_path) as session:
            result = await session.call_tool("greedy", {"task": "hi"})
    assert result.is_error
    text = _text(result)
    assert text.startswith("budget_exceeded: tool_calls limit of 1 reached"), text


async def test_stdio_budget_options_apply_to_each_call(tmp_path: pathlib.Path) -> None:
    with anyio.fail_after(LIMIT):
        async with _stdio_session(f"{AGENTS}:echo", tmp_path, "--budget-requests", "1") as session:
            result = await session.call_tool("echo", {"task": "hi"})
    assert result.is_error
    assert _text(result).startswith("budget_exceeded: requests limit of 1 reached"), _text(result)


# -- over streamable HTTP on 127.0.0.1 -----------------------------------------------


# The SDK's streamable HTTP client leaves httpx2's async generators to trio's garbage
# collector (a ResourceWarning, an error here): the client side runs on asyncio only.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_http_serves_the_agent_on_a_port_of_its_own() -> None:
    command = [sys.executable, "-m", "fractor.actors.cli", "mcp-serve", f"{AGENTS}:echo"]
    with anyio.fail_after(LIMIT):
        async with await anyio.open_process(
            [*command, "--http", "127.0.0.1:0"], cwd=ROOT, stderr=subprocess.PIPE
        ) as process:
            assert process.stderr is not None
            seen = ""
            async for chunk in process.stderr:
                seen += chunk.decode()
                if "\n" in seen:
                    break
            assert "serving agent 'echo' at http://127.0.0.1:" in seen, seen
            url = seen.split(" at ", 1)[1].strip()
            try:
                async with (
                    streamable_http_client(url) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    listed = await session.list_tools()
                    assert [tool.name for tool in listed.tools] == ["echo"]
                    result = await session.call_tool("echo", {"task": "over http"})
                    assert _text(result) == "The agent says: OVER HTTP"
            finally:
                process.terminate()
            rest = b"".join([chunk async for chunk in process.stderr]).decode()
            # uvicorn shuts down gracefully, then lets SIGTERM end the process as asked.
            assert await process.wait() in (0, -signal.SIGTERM)
    assert "Traceback" not in rest, rest


# -- the server in process: the edges ---------------------------------------------------


@asynccontextmanager
async def _client(agent: Any, budget: Budget | None = None) -> AsyncIterator[Client]:
    async with Runtime() as runtime, Client(agent_server(agent, runtime, budget=budget)) as client:
        yield client


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({}, "echo: argument 'task' (a string) is missing; no arguments were given"),
        ({"text": "hi"}, "echo: argument 'task' (a string) is missing; got 'text' instead"),
        ({"task": 5}, "echo: argument 'task' must be a string, got 5 (a number)"),
        ({"task": None}, "echo: argument 'task' must be a string, got null"),
        ({"task": True}, "echo: argument 'task' must be a string, got true (a boolean)"),
        (
            {"task": ["a", "b"]},
            'echo: argument \'task\' must be a string, got ["a","b"] (an array)',
        ),
        (
            {"task": {"text": "x" * 100}},
            'echo: argument \'task\' must be a string, got {"text":"'
            + "x" * 41
            + "... (an object)",
        ),
        (
            {"task": "x", "more": 1, "also": 2},
            "echo: unexpected arguments 'also', 'more'; it takes one, 'task' (a string)",
        ),
    ],
)
async def test_a_call_with_bad_arguments_is_told_which_and_why(
    arguments: dict[str, Any], said: str
) -> None:
    with anyio.fail_after(LIMIT):
        async with _client(echo) as client:
            result = await client.call_tool("echo", arguments)
            assert result.is_error
            assert _text(result) == said


async def test_a_call_of_another_tool_is_a_protocol_error() -> None:
    with anyio.fail_after(LIMIT):
        async with _client(echo) as client:
            with pytest.raises(MCPError, match="unknown tool 'other'"):
                await client.call_tool("other", {"task": "x"})


async def test_calls_run_concurrently_and_apart_under_the_servers_budget() -> None:
    results: dict[str, types.CallToolResult] = {}
    with anyio.fail_after(LIMIT):
        async with _client(echo, Budget(tool_calls=1)) as client:

            async def ask(task: str) -> None:
                results[task] = await client.call_tool("echo", {"task": task})

            async with anyio.create_task_group() as tg:
                for task in ("a", "b", "c"):
                    tg.start_soon(ask, task)
    # Each call is an execution of its own: one tool call each, within its budget.
    assert {task: _text(result) for task, result in results.items()} == {
        "a": "The agent says: A",
        "b": "The agent says: B",
        "c": "The agent says: C",
    }


async def test_the_agents_own_budget_and_the_servers_both_hold() -> None:
    with anyio.fail_after(LIMIT):
        async with _client(greedy, Budget(tokens=100_000)) as client:
            result = await client.call_tool("greedy", {"task": "hi"})
    assert result.is_error
    assert _text(result).startswith("budget_exceeded: tool_calls limit of 1 reached")


async def test_a_cancelled_call_stops_its_agent_and_the_server_goes_on() -> None:
    asked = anyio.Event()

    async def wait_forever(request: ModelRequest) -> ModelResponse:
        if request.messages[-1] == UserMessage(content="quick"):
            return reply("done")
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    slow = Agent(name="slow", model=FunctionModel(wait_forever))
    with anyio.fail_after(LIMIT):
        async with Runtime() as runtime, Client(agent_server(slow, runtime)) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "slow", {"task": "take your time"})
                await asked.wait()
                assert runtime.statistics().live_actors == 1
                tg.cancel_scope.cancel()
            assert runtime.statistics().live_actors == 0
            result = await client.call_tool("slow", {"task": "quick"})
            assert _text(result) == "done"
            assert runtime.statistics().live_actors == 0


# -- bad usage --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "expected MODULE:NAME"),
        ("tests.actors.integrations.no_such_module:agent", "cannot import module"),
        (f"{AGENTS}:nobody", "has no attribute 'nobody'"),
        (f"{AGENTS}:not_an_agent", "is a int, not a fractor.Agent"),
    ],
)
def test_bad_usage_exits_2_saying_what_is_wrong(
    spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mcp-serve", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fractor mcp-serve: "), err
    assert message in err


def test_a_bad_address_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp-serve", f"{AGENTS}:echo", "--http", "localhost"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err


# -- stopped by a signal ----------------------------------------------------------------

SIGNALS = pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
IN_FLIGHT = pytest.mark.parametrize("in_flight", [False, True], ids=["idle", "in_flight"])
SLEEPER = [sys.executable, "-m", "fractor.actors.cli", "mcp-serve", f"{AGENTS}:sleeper"]


def _said_when_stopped(signum: signal.Signals, in_flight: bool) -> str:
    name = signal.Signals(signum).name
    answered = "; 1 call in flight answered with an error" if in_flight else ""
    return f"fractor mcp-serve: stopped ({name}){answered}"


async def _line(stream: BufferedByteReceiveStream) -> str:
    return (await stream.receive_until(b"\n", 1_000_000)).decode()


async def _request(stdin: Any, message: dict[str, Any]) -> None:
    await stdin.send(msgspec.json.encode({"jsonrpc": "2.0", **message}) + b"\n")


@SIGNALS
@IN_FLIGHT
async def test_stdio_a_signal_answers_the_call_in_flight_and_exits_0_with_one_line(
    signum: signal.Signals, in_flight: bool
) -> None:
    """Ctrl-C or SIGTERM on ``fractor mcp-serve``: the call in flight (if any) is
    answered with an error saying the server stopped, and the command exits 0
    after one line (no traceback)."""
    with anyio.fail_after(LIMIT):
        async with await anyio.open_process(SLEEPER, cwd=ROOT) as process:
            assert process.stdin is not None
            assert process.stdout is not None
            assert process.stderr is not None
            out = BufferedByteReceiveStream(process.stdout)
            err = BufferedByteReceiveStream(process.stderr)
            assert "serving agent 'sleeper' over stdio" in await _line(err)
            params = {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            }
            await _request(process.stdin, {"id": 1, "method": "initialize", "params": params})
            assert '"id":1' in await _line(out)
            await _request(process.stdin, {"method": "notifications/initialized"})
            await _request(process.stdin, {"id": 2, "method": "tools/list"})
            assert '"sleeper"' in await _line(out)
            if in_flight:
                call = {"name": "sleeper", "arguments": {"task": "rest"}}
                await _request(process.stdin, {"id": 3, "method": "tools/call", "params": call})
                assert await _line(err) == "asleep"
            process.send_signal(signum)
            if in_flight:
                answer = msgspec.json.decode(await _line(out))
                assert answer["id"] == 3
                assert answer["result"]["isError"] is True
                name = signal.Signals(signum).name
                assert answer["result"]["content"][0]["text"] == (
                    f"sleeper: cancelled: the server stopped ({name}) before the agent answered"
                )
            status = await process.wait()
            rest = b"".join([chunk async for chunk in err]).decode()
            await process.stdin.aclose()
    assert status == 0
    assert rest.splitlines() == [_said_when_stopped(signum, in_flight)]


@SIGNALS
@IN_FLIGHT
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the SDK's HTTP client: see above
async def test_http_a_signal_answers_the_call_in_flight_and_exits_0_with_one_line(
    signum: signal.Signals, in_flight: bool
) -> None:
    """The same over HTTP: the client in flight gets the error answer (not a cut
    stream), its event stream ends, and the command exits 0 after one line."""
    answers: list[types.CallToolResult] = []
    with anyio.fail_after(LIMIT):
        async with await anyio.open_process(
            [*SLEEPER, "--http", "127.0.0.1:0"], cwd=ROOT, stderr=subprocess.PIPE
        ) as process:
            assert process.stderr is not None
            err = BufferedByteReceiveStream(process.stderr)
            url = (await _line(err)).split(" at ", 1)[1].strip()
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                assert [t.name for t in (await session.list_tools()).tools] == ["sleeper"]
                if in_flight:

                    async def ask() -> None:
                        answers.append(await session.call_tool("sleeper", {"task": "rest"}))

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(ask)
                        assert await _line(err) == "asleep"
                        process.send_signal(signum)
                else:
                    process.send_signal(signum)
                status = await process.wait()
            rest = b"".join([chunk async for chunk in err]).decode()
    assert status == 0
    assert rest.splitlines() == [_said_when_stopped(signum, in_flight)]
    if in_flight:
        (answer,) = answers
        assert answer.is_error
        name = signal.Signals(signum).name
        assert _text(answer) == (
            f"sleeper: cancelled: the server stopped ({name}) before the agent answered"
        )
