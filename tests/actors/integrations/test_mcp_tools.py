"""Tools from MCP servers the tests start (``tests.actors.integrations.mcp_servers``, written
with the ``mcp`` SDK's server API), over stdio and over streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import anyio
import anyio.abc
import pytest
from anyio import wait_all_tasks_blocked
from structlog.testing import capture_logs

from fractor.actors import (
    Agent,
    Audio,
    ContentLimits,
    Document,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    ToolCall,
    ToolProgress,
    ToolResultMessage,
    UserMessage,
    call,
    calls,
    describe_part,
    reply,
)
from fractor.actors.integrations import mcp
from fractor.actors.integrations.mcp import MCPServer, MCPTool, mcp_tools
from fractor.runtime import Budget, Runtime
from tests.actors.integrations.mcp_servers import PDF, PNG, WAV

ROOT = pathlib.Path(__file__).parents[3]
MODULE = "tests.actors.integrations.mcp_servers"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone as far as anyone can tell, but still answers kill(pid, 0).
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _pids(path: pathlib.Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture
def files(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    return tmp_path / "pids", tmp_path / "marks"


@pytest.fixture
def stdio(files: tuple[pathlib.Path, pathlib.Path]) -> MCPServer:
    pids, marks = files
    return MCPServer.stdio(
        sys.executable,
        ["-m", MODULE],
        env={"MCP_PID_FILE": str(pids), "MCP_MARK_FILE": str(marks)},
        cwd=str(ROOT),
    )


@pytest.fixture(scope="module")
def http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One streamable-HTTP server for the module, in a subprocess on a free port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", MODULE, "http", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the MCP HTTP test server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


async def _written(path: pathlib.Path) -> None:
    """Wait for another process to write ``path`` (nothing to wait on but the file)."""
    while not await anyio.Path(path).exists():  # noqa: ASYNC110
        await anyio.sleep(0.01)


def _agent(tools: tuple[MCPTool, ...], *turns: object, **options: object) -> Agent:
    return Agent("mcp_user", ScriptedModel(turns), tools=list(tools), **options)  # type: ignore[arg-type]


async def test_stdio_tools_through_one_shared_session(
    stdio: MCPServer, files: tuple[pathlib.Path, pathlib.Path]
) -> None:
    """One server process for the runtime: listing, filter and prefix, calls, a server
    error, a hung call past the timeout, the budget, the deadline cancelling a call,
    and last a crash of the server mid-call; then the process is gone."""
    pids, marks = files
    # A guard against a hang, not a time to meet: the server process starts twice, and
    # under a loaded parallel suite a Python start takes seconds (22 s seen on CI).
    with anyio.fail_after(90):
        async with Runtime() as rt:
            tools = await mcp_tools(rt, stdio, timeout=0.3)
            assert {t.name for t in tools} == {
                *("add", "shout", "fail", "hang", "crash", "media", "slow", "whoami"),
                "read_media_file",
            }
            add = next(t for t in tools if t.name == "add")
            assert add.spec.description == "Add two integers."
            assert add.spec.parameters["properties"].keys() == {"a", "b"}
            assert set(add.spec.parameters["required"]) == {"a", "b"}
            with pytest.raises(ValueError, match=r"has no tool 'nope'; it has add, crash"):
                await mcp_tools(rt, stdio, include=["nope"])
            # Filtered and prefixed, on the same session: the server started once.
            chosen = await mcp_tools(rt, stdio, include=["add", "shout"], prefix="m_")
            assert [t.name for t in chosen] == ["m_add", "m_shout"]
            assert chosen[0].session is add.session
            agent = _agent(
                chosen,
                calls(call("m_add", a=2, b=3), call("m_shout", {"text": "hi"})),
                reply("done"),
            )
            model = agent.model
            assert (await (await rt.spawn(agent)).ask("go")).ok
            assert [s.name for s in model.requests[0].tools] == ["m_add", "m_shout"]  # type: ignore[attr-defined]

            # A server error and a hung call are results; the session goes on.
            ref = await rt.spawn(
                _agent(
                    tools,
                    call("fail", reason="because"),
                    call("hang"),
                    call("add", a=40, b=2),
                    reply("done"),
                )
            )
            assert (await ref.ask("go")).ok
            (trace,) = await ref.trace()
            failed, hung, added = (step.outcomes[0] for step in trace.steps[:3])
            assert failed.is_error
            assert "refused: because" in failed.content
            assert hung.content == "tool 'hang' timed out after 0.3 s"
            assert (added.content, added.is_error) == ("42", False)
            # The server was told the hung call was abandoned: its handler was cancelled.
            await _written(marks)
            marks.unlink()

            # The budget counts MCP calls.
            ref = await rt.spawn(
                _agent(tools, call("add", a=1, b=1), call("add", a=2, b=2), call("add", a=3, b=3))
            )
            result = await ref.ask("go", budget=Budget(tool_calls=2))
            assert result.status == "budget_exceeded"
            assert "tool_calls" in result.stop_reason

            # The deadline stops the execution and cancels the call, on the server too.
            (untimed,) = await mcp_tools(rt, stdio, include=["hang"])
            ref = await rt.spawn(_agent((untimed,), call("hang"), reply("never")))
            result = await ref.ask("go", budget=Budget(seconds=0.2))
            assert result.status == "timed_out"
            (trace,) = await ref.trace()
            assert trace.steps[0].interrupted
            await _written(marks)
            assert marks.read_text() == "hang cancelled\n"

            # The server dies mid-call: an error result; the next call runs on a new
            # server process, started again (the crashed call is not sent again).
            (pid,) = _pids(pids)
            assert _alive(pid)
            again = await mcp_tools(rt, stdio, include=["crash", "add"])
            (quick,) = await mcp_tools(rt, stdio, include=["add"], prefix="quick_", timeout=0.05)
            steps = (call("crash"), call("quick_add", a=0, b=0), call("add", a=1, b=2))
            ref = await rt.spawn(_agent((*again, quick), *steps, reply("ok")))
            assert (await ref.ask("go")).ok
            (trace,) = await ref.trace()
            crashed, waited, after = (step.outcomes[0] for step in trace.steps[:3])
            # The server is connected again after a backoff (0.2 s): a quick call waits.
            assert waited.content == (
                f"tool 'quick_add' timed out after 0.05 s waiting for the MCP server {stdio} "
                "to be connected again"
            )
            assert crashed.is_error
            assert "went away before it answered" in crashed.content
            assert "may have done part of its work" in crashed.content
            assert (after.content, after.is_error) == ("3", False)
            first, second = _pids(pids)
            assert first == pid
            assert not _alive(first)
            assert _alive(second)
    assert not any(_alive(pid) for pid in _pids(pids))


async def test_a_server_that_keeps_crashing_is_gone_after_its_reconnects(
    stdio: MCPServer, files: tuple[pathlib.Path, pathlib.Path]
) -> None:
    """Connected again after each crash, at most RECONNECTS times within the window;
    then every call says the server is gone, and why, without waiting."""
    pids, _ = files
    crashes = [call("crash") for _ in range(mcp.RECONNECTS + 1)]
    with anyio.fail_after(60):
        async with Runtime() as rt:
            tools = await mcp_tools(rt, stdio)
            ref = await rt.spawn(_agent(tools, *crashes, call("add", a=1, b=2), reply("ok")))
            assert (await ref.ask("go")).ok
            (trace,) = await ref.trace()
    outcomes = [step.outcomes[0] for step in trace.steps[: mcp.RECONNECTS + 2]]
    assert all("went away before it answered" in o.content for o in outcomes[:-1])
    last = outcomes[-1]
    assert last.is_error
    assert "is gone: it went away 4 times within 60 s" in last.content
    assert last.attempts == 0  # never sent
    assert len(_pids(pids)) == mcp.RECONNECTS + 1
    assert not any(_alive(pid) for pid in _pids(pids))


async def test_a_malformed_reply_is_an_error_result() -> None:
    server = MCPServer.stdio(
        sys.executable, ["-m", "tests.actors.integrations.mcp_raw_server"], cwd=str(ROOT)
    )
    with anyio.fail_after(60):
        async with Runtime() as rt:
            (broken,) = await mcp_tools(rt, server)
            assert broken.spec.description == "Answers garbage."
            ref = await rt.spawn(_agent((broken,), call("broken"), reply("done")))
            assert (await ref.ask("go")).ok
            (trace,) = await ref.trace()
    (outcome,) = trace.steps[0].outcomes
    assert outcome.is_error
    assert "sent a malformed reply" in outcome.content


#: Under trio, the SDK's streamable-HTTP client (on httpx2) leaves the async generators
#: of its SSE streams to the garbage collector, which trio reports as ResourceWarnings;
#: nothing of ours, and the calls are right: those, and those only, are let through.
SDK_HTTP_TRIO_LEAK = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <async_generator object "
    r"(EventSource|PoolByteStream|Response)\.:pytest.PytestUnraisableExceptionWarning"
)


@SDK_HTTP_TRIO_LEAK
async def test_http_tools_and_errors(http_url: str) -> None:
    server = MCPServer.http(http_url)
    with anyio.fail_after(60):
        async with Runtime() as rt:
            # The hang gets a short timeout of its own; the others a loaded machine's.
            answering = await mcp_tools(rt, server, include=["add", "fail"], timeout=10)
            hanging = await mcp_tools(rt, server, include=["hang"], timeout=0.3)
            agent = _agent(
                (*answering, *hanging),
                calls(
                    call("add", a=1, b=1),
                    call("fail", reason="no"),
                    call("hang"),
                    call("add", a="x", b=1),
                    call("add", {"a": 1}, id="bad"),
                ),
                reply("done"),
            )
            ref = await rt.spawn(agent)
            assert (await ref.ask("go")).ok
            (trace,) = await ref.trace()
            ok, failed, hung, invalid, missing = trace.steps[0].outcomes
    assert (ok.content, ok.is_error) == ("2", False)
    assert failed.is_error
    assert "refused: no" in failed.content
    assert hung.content == "tool 'hang' timed out after 0.3 s"
    assert invalid.is_error
    assert missing.is_error


async def test_no_server_process_is_left_on_any_path(
    stdio: MCPServer, files: tuple[pathlib.Path, pathlib.Path]
) -> None:

    async def failing_body() -> None:
        async with Runtime() as rt:
            (tool,) = await mcp_tools(rt, stdio, include=["hang"])
            ref = await rt.spawn(_agent((tool,), call("hang"), reply("x")))
            await ref.tell("go")
            await wait_all_tasks_blocked()
            raise ZeroDivisionError

    # The body fails while a call hangs.
    with anyio.fail_after(60), pytest.raises(ZeroDivisionError):
        await failing_body()
    # The body is cancelled from outside.
    with anyio.move_on_after(20) as outer:
        async with Runtime() as rt:
            await mcp_tools(rt, stdio)
            outer.cancel()
            await anyio.sleep_forever()
    pids = _pids(files[0])
    assert len(pids) == 2
    assert not any(_alive(pid) for pid in pids)


async def test_after_the_runtime_closed_it_cannot_connect(stdio: MCPServer) -> None:
    async with Runtime() as rt:
        pass
    with pytest.raises(Exception, match="the runtime is closed"):
        await mcp_tools(rt, stdio)


def test_server_definitions_are_values() -> None:
    a = MCPServer.stdio("srv", ["x"], env={"K": "v"})
    assert a == MCPServer.stdio("srv", ("x",), env={"K": "v"})
    assert hash(a) == hash(MCPServer.stdio("srv", ["x"], env={"K": "v"}))
    assert str(MCPServer.http("http://h/mcp")) == "http://h/mcp"
    with pytest.raises(ValueError, match="needs an http"):
        MCPServer.http("h/mcp")
    with pytest.raises(TypeError, match="sequence of strings"):
        MCPServer.stdio("srv", "x")


async def test_an_agent_defined_anywhere_takes_a_servers_tools_next_to_its_own(
    stdio: MCPServer, files: tuple[pathlib.Path, pathlib.Path]
) -> None:
    """``server.tools(...)`` in ``tools=[...]``: the definition needs no runtime; each
    runtime that spawns it lists the server's tools once, for the agent and for every
    spawn of it as a subagent, on one server process."""
    from fractor.actors import tool

    @tool
    async def local(word: str) -> str:
        """A tool of the agent's own."""
        return word.upper()

    helper = Agent(
        "helper",
        ScriptedModel([call("m_add", a=1, b=2), reply("3"), call("m_add", a=2, b=2), reply("4")]),
        tools=[stdio.tools(include=["add"], prefix="m_")],
    )
    lead_model = ScriptedModel(
        [
            calls(call("local", word="hi"), call("m_shout", {"text": "yo"})),
            calls(call("helper", task="one"), call("helper", task="two")),
            reply("done"),
        ]
    )
    lead = Agent(
        "lead", lead_model, tools=[local, stdio.tools(include=["shout"], prefix="m_")],
        subagents=[helper],
    )  # fmt: skip
    assert [type(t).__name__ for t in lead.tools] == ["Tool", "MCPToolset"]
    assert [s.name for s in lead.specs] == ["local", "helper"]  # the server's come later
    pids, _ = files
    with anyio.fail_after(60):
        async with Runtime() as rt:
            result = await (await rt.spawn(lead)).ask("go")
    assert result.ok, result.stop_reason
    assert [s.name for s in lead_model.requests[0].tools] == ["local", "m_shout", "helper"]
    contents = [m.content for m in lead_model.requests[1].messages[-2:]]
    assert contents == ["HI", "YO"]
    assert sorted(m.content for m in lead_model.requests[2].messages[-2:]) == ["3", "4"]
    assert len(_pids(pids)) == 1  # one server process for every agent that used it
    assert not any(_alive(pid) for pid in _pids(pids))


async def _serve_http(port: int, env: dict[str, str] | None = None) -> anyio.abc.Process:
    process = await anyio.open_process(
        [sys.executable, "-m", MODULE, "http", str(port)],
        cwd=ROOT,
        env={**os.environ, **env} if env else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        try:
            await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
            return process
        except OSError:
            await anyio.sleep(0.05)


@SDK_HTTP_TRIO_LEAK
async def test_an_http_server_that_restarts_is_connected_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Attempts 1, 3 and 7 s after it went away: a busy machine takes seconds to start
    # a Python server again, longer than the default backoff's three attempts.
    monkeypatch.setattr(mcp, "RECONNECT_DELAY", 1.0)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with anyio.fail_after(60):
        process = await _serve_http(port)
        try:
            async with Runtime() as rt:
                server = MCPServer.http(f"http://127.0.0.1:{port}/mcp")
                (add,) = await mcp_tools(rt, server, include=["add"])
                first = await add.invoke(ToolCall(id="1", name="add", arguments='{"a": 1, "b": 2}'))
                process.kill()
                await process.wait()
                down = await add.invoke(ToolCall(id="2", name="add", arguments='{"a": 1, "b": 2}'))
                process = await _serve_http(port)  # the same URL, a new server
                again = await add.invoke(ToolCall(id="3", name="add", arguments='{"a": 2, "b": 2}'))
        finally:
            process.kill()
            await process.wait()
    assert (first.content, first.is_error) == ("3", False)
    assert down.is_error
    assert "is being connected again" in down.content
    assert (again.content, again.is_error) == ("4", False)


async def test_media_in_a_result_are_parts_or_described_never_pasted(
    stdio: MCPServer,
) -> None:
    """An image, a recording and the PDFs (typed, or untyped but a PDF by its bytes)
    become parts, in order; an image or a recording whose bytes are not what it says,
    or of no kind, a binary resource and a link become lines saying what was dropped,
    how big or where, and why (never base64); a text resource's text is included."""
    with anyio.fail_after(60):
        async with Runtime() as rt:
            (media,) = await mcp_tools(rt, stdio, include=["media"])
            outcome = await media.invoke(ToolCall(id="1", name="media", arguments="{}"))
    assert not outcome.is_error
    assert outcome.content.splitlines() == [
        "here they are",
        "[image/png image, 1 KB: dropped, the image's media_type says 'image/png', "
        "its bytes are image/gif]",
        "[image/png image, 13 KB: dropped, an image must be PNG or JPEG or WebP or GIF, "
        "got bytes of no known type (starting b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07')]",
        "[audio/wav audio, 2 KB: dropped, an audio must be WAV or MP3, got bytes of no known "
        "type (starting b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00')]",
        "[text/plain resource file:///notes.txt]",
        "the notes",
        "[application/octet-stream resource file:///data.bin, 2 KB: dropped, the model "
        "takes images (PNG, JPEG, WebP, GIF), documents (PDF), audio (WAV, MP3) only]",
        "[a link to the resource 'report': file:///report.pdf, application/pdf, 5 KB; not fetched]",
    ]
    assert "AAAA" not in outcome.content
    image, sound, report, scan = outcome.parts
    assert isinstance(image, Image)
    assert isinstance(sound, Audio)
    assert (sound.media_type, sound.data, sound.seconds) == ("audio/wav", WAV, 0.25)
    assert isinstance(report, Document)
    assert isinstance(scan, Document)
    assert (image.media_type, image.data, image.width, image.height) == ("image/png", PNG, 4, 3)
    assert (report.media_type, report.data, report.name, report.pages) == (
        "application/pdf",
        PDF,
        "report.pdf",
        2,
    )
    assert (scan.data, scan.name) == (PDF, "scan")


async def test_media_over_the_content_limits_are_dropped_saying_which_limit(
    stdio: MCPServer,
) -> None:
    """A part over ``ContentLimits.part`` is a line naming the limit; so is one that
    would take the result's parts past ``ContentLimits.request``; the others stay."""
    with anyio.fail_after(60):
        async with Runtime() as rt:
            (per_part,) = await mcp_tools(
                rt, stdio, include=["media"], content_limits=ContentLimits(part=len(PDF) - 1)
            )
            first = await per_part.invoke(ToolCall(id="1", name="media", arguments="{}"))
            whole = ContentLimits(part=None, request=len(PNG) + len(PDF))
            (per_result,) = await mcp_tools(
                rt, stdio, include=["media"], prefix="b_", content_limits=whole
            )
            second = await per_result.invoke(ToolCall(id="2", name="b_media", arguments="{}"))
    assert [type(p) for p in first.parts] == [Image]
    assert (
        "[application/pdf resource file:///docs/report.pdf, 1 KB: dropped, more than the "
        "1 KB a part may have (ContentLimits.part)]"
    ) in first.content.splitlines()
    assert (
        "[binary resource file:///scan, 1 KB: dropped, more than the 1 KB a part may have "
        "(ContentLimits.part)]"
    ) in first.content.splitlines()
    assert [type(p) for p in second.parts] == [Image, Document]
    assert (
        "[binary resource file:///scan, 1 KB: dropped, with the parts before it, more than "
        "the 1 KB one result may carry (ContentLimits.request)]"
    ) in second.content.splitlines()


async def test_an_mcp_image_reaches_the_model_as_an_image_part(stdio: MCPServer) -> None:
    """Through an agent: the model's next request holds the tool result with the
    image, the recording and the PDFs as parts, and the lines for what was dropped."""
    seen: list[ToolResultMessage] = []

    def model(request: ModelRequest) -> ModelResponse:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if not results:
            return call("media")
        seen.extend(results)
        return reply("seen")

    with anyio.fail_after(60):
        async with Runtime() as rt:
            agent = Agent("looker", FunctionModel(model), tools=[stdio.tools(include=["media"])])
            result = await (await rt.spawn(agent)).ask("look")
    assert result.text == "seen"
    (message,) = seen
    assert [describe_part(p) for p in message.parts] == [
        describe_part(Image(data=PNG)),
        describe_part(Audio(data=WAV)),
        describe_part(Document(data=PDF, name="report.pdf")),
        describe_part(Document(data=PDF, name="scan")),
    ]
    assert "an audio must be WAV or MP3" in message.content


async def test_a_pdf_served_as_octet_stream_reaches_the_model_as_a_document(
    stdio: MCPServer,
) -> None:
    """A server that labels a PDF ``application/octet-stream`` (as ``server-filesystem``
    does): the label says nothing, the bytes decide, and the model gets the PDF."""
    seen: list[ToolResultMessage] = []

    def model(request: ModelRequest) -> ModelResponse:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if not results:
            return call("read_media_file", path="/srv/docs/report.pdf")
        seen.extend(results)
        return reply("read")

    with anyio.fail_after(60):
        async with Runtime() as rt:
            tools = stdio.tools(include=["read_media_file"])
            agent = Agent("reader", FunctionModel(model), tools=[tools])
            result = await (await rt.spawn(agent)).ask("read the report")
    assert result.text == "read", result.stop_reason
    (message,) = seen
    (document,) = message.parts
    assert isinstance(document, Document)
    assert (document.media_type, document.data, document.name, document.pages) == (
        "application/pdf",
        PDF,
        "report.pdf",
        2,
    )
    assert "dropped" not in message.content


async def test_tools_that_need_a_task_are_not_offered(stdio: MCPServer) -> None:
    """A tool the server says can be called only as a task (``execution.taskSupport``
    "required") would fail on every call: it is left out, and the log says so."""
    with anyio.fail_after(60), capture_logs() as logs:
        async with Runtime() as rt:
            tools = await mcp_tools(rt, stdio)
            with pytest.raises(ValueError, match=r"'queued_job'.* only as a task"):
                await mcp_tools(rt, stdio, include=["add", "queued_job"])
    assert "queued_job" not in {t.name for t in tools}
    assert "add" in {t.name for t in tools}
    (left_out,) = [log for log in logs if log["event"] == "mcp_tools_left_out"]
    assert left_out["tools"] == ["queued_job"]
    assert left_out["server"] == str(stdio)
    assert "only as a task" in left_out["reason"]


async def test_the_client_introduces_itself_as_fractor(stdio: MCPServer) -> None:
    with anyio.fail_after(60):
        async with Runtime() as rt:
            (whoami,) = await mcp_tools(rt, stdio, include=["whoami"])
            outcome = await whoami.invoke(ToolCall(id="1", name="whoami", arguments="{}"))
    assert outcome.content == f"fractor {importlib.metadata.version('fractor')}"


async def test_a_tools_progress_is_an_event_of_its_call(stdio: MCPServer) -> None:
    """Each call sends a progress token; what the server reports on it becomes a
    ``tool_progress`` event of that call, between its start and its end."""
    with anyio.fail_after(60):
        async with Runtime() as rt, rt.events() as events:
            tools = await mcp_tools(rt, stdio, include=["slow"])
            agent = _agent(tools, call("slow", steps=3, id="s1"), reply("done"))
            assert (await (await rt.spawn(agent)).ask("go")).ok
            seen = []
            while (event := events.receive_nowait()) is not None:
                if event.kind in ("tool_start", "tool_progress", "tool_end"):
                    seen.append(event)
    assert [e.kind for e in seen] == ["tool_start", *["tool_progress"] * 3, "tool_end"]
    progress = [e.detail for e in seen[1:-1]]
    assert progress == [
        ToolProgress(
            tool="slow", call_id="s1", progress=float(step), total=3.0, message=f"step {step} of 3"
        )
        for step in (1, 2, 3)
    ]
    assert {e.execution_id for e in seen} == {seen[0].execution_id}


@SDK_HTTP_TRIO_LEAK
async def test_closing_the_runtime_ends_the_http_session(tmp_path: pathlib.Path) -> None:
    """The HTTP session is terminated (a DELETE the server answers) when the runtime
    closes, on every path: its body ends, or fails."""
    marks = tmp_path / "marks"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = MCPServer.http(f"http://127.0.0.1:{port}/mcp")
    with anyio.fail_after(60):
        process = await _serve_http(port, env={"MCP_MARK_FILE": str(marks)})
        try:
            async with Runtime() as rt:
                (add,) = await mcp_tools(rt, server, include=["add"])
                first = await add.invoke(ToolCall(id="1", name="add", arguments='{"a": 1, "b": 2}'))
            assert (first.content, first.is_error) == ("3", False)
            assert _lines(marks) == ["DELETE 200"]

            async def failing_body() -> None:
                async with Runtime() as rt:
                    await mcp_tools(rt, server, include=["add"])
                    raise ZeroDivisionError

            with pytest.raises(ZeroDivisionError):
                await failing_body()
            assert _lines(marks) == ["DELETE 200", "DELETE 200"]
        finally:
            process.kill()
            await process.wait()


def _lines(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@SDK_HTTP_TRIO_LEAK
async def test_an_http_server_restarted_between_two_calls_gets_a_new_session() -> None:
    """Stopped and started again on the same port with no call between: the next call
    is answered 404 for the old session, which means a new session (the spec): the
    call goes again on it and succeeds, and so does listing the tools at a spawn."""
    port = _free_port()
    server = MCPServer.http(f"http://127.0.0.1:{port}/mcp")
    with anyio.fail_after(60):
        process = await _serve_http(port)
        try:
            async with Runtime() as rt:
                (add,) = await mcp_tools(rt, server, include=["add"])
                first = await add.invoke(ToolCall(id="1", name="add", arguments='{"a": 1, "b": 2}'))
                process.kill()
                await process.wait()
                process = await _serve_http(port)
                again = await add.invoke(ToolCall(id="2", name="add", arguments='{"a": 2, "b": 2}'))
                later = await add.invoke(ToolCall(id="3", name="add", arguments='{"a": 3, "b": 2}'))
                process.kill()
                await process.wait()
                process = await _serve_http(port)
                agent = Agent(
                    "shouter",
                    ScriptedModel([call("shout", {"text": "hi"}), reply("done")]),
                    tools=[server.tools(include=["shout"])],
                )
                ref = await rt.spawn(agent)
                result = await ref.ask("go")
                (trace,) = await ref.trace()
        finally:
            process.kill()
            await process.wait()
    assert (first.content, first.is_error) == ("3", False)
    assert (again.content, again.is_error) == ("4", False)
    assert (later.content, later.is_error) == ("5", False)
    assert result.ok, result.stop_reason
    assert trace.steps[0].outcomes[0].content == "HI"


@SDK_HTTP_TRIO_LEAK
async def test_tools_that_cannot_be_listed_fail_the_ask_not_the_spawn() -> None:
    """A server not there when the agent is spawned: the spawn succeeds, the ask is
    ``failed`` naming the server and why, out of the conversation; a subagent's call
    is an error result its parent's model reads; once the server is up, the next ask
    lists the tools and runs."""
    port = _free_port()
    server = MCPServer.http(f"http://127.0.0.1:{port}/mcp")
    shouter = Agent(
        "shouter",
        ScriptedModel([call("shout", {"text": "hi"}), reply("done")]),
        tools=[server.tools(include=["shout"])],
    )
    lead = Agent(
        "lead",
        ScriptedModel([call("shouter", task="shout"), reply("the shouter failed")]),
        subagents=[shouter],
    )
    with anyio.fail_after(60):
        async with Runtime() as rt:
            ref = await rt.spawn(shouter)
            failed = await ref.ask("go")
            led = await (await rt.spawn(lead)).ask("go")
            process = await _serve_http(port)
            try:
                result = await ref.ask("go again")
                conversation = await ref.conversation()
            finally:
                process.kill()
                await process.wait()
    assert failed.status == "failed"
    assert failed.stop_reason.startswith(
        f"cannot list the tools of the MCP server {server}: connecting failed (ConnectError"
    )
    assert led.ok
    outcome = lead.model.requests[1].messages[-1]  # type: ignore[attr-defined]
    assert isinstance(outcome, ToolResultMessage)
    assert outcome.is_error
    assert f"cannot list the tools of the MCP server {server}" in outcome.content
    assert result.ok, result.stop_reason
    assert [m.content for m in conversation.messages if isinstance(m, UserMessage)] == ["go again"]
