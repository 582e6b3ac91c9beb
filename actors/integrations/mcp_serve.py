"""An agent served over MCP: any MCP client hands it a task and gets its final answer.

::

    fractor mcp-serve myagents:researcher                       # stdio
    fractor mcp-serve myagents:researcher --http 127.0.0.1:8000  # streamable HTTP

The server offers **one tool**, named after the agent, described by the agent's
``description`` (or its instructions), with one ``task`` string argument. A call
runs the task and returns ``Result.text``, then the answer's images as MCP image
content (base64, their media type) and its PDFs as embedded resources (a blob,
``application/pdf``), in order (``part_content``); an execution that ends otherwise
(``budget_exceeded``, ``timed_out``, ``failed``, ``cancelled``) comes back as a tool
result marked as an error, whose text names the status and the stop reason. A call
whose arguments are not one ``task`` string runs nothing: its error names the
argument, the type expected and what was given (``echo: argument 'task' must be a
string, got 5 (a number)``). The server introduces itself (``serverInfo``) with the
agent's name and fractor's version.

One ``Runtime`` lives as long as the server. **Each call spawns the agent afresh**
and stops it after the answer: calls are independent (no conversation carried from
one client's task to another's) and run concurrently. Each call's execution is
bounded by the agent's own ``budget`` and by ``budget`` given here (the tighter of
the two, field by field), for the whole tree of subagents behind it.

``agent_server`` builds the MCP ``Server`` (the SDK's low-level one) for a running
runtime, to mount or to drive in process (on asyncio or trio); ``serve_stdio`` and
``serve_http`` run it over a transport. Streamable HTTP runs on uvicorn, so on
asyncio only; ``fractor mcp-serve`` runs both transports on asyncio.

``serve_stdio`` and ``serve_http`` stop on SIGINT or SIGTERM (they take the
process's signals: call them from its main thread): each call in flight is
cancelled with its agent's tree and answered with an error saying the server
stopped, a call arriving then is answered so at once, and once the answers are out
(``STOP_GRACE`` at most) the transport ends: stdio as if the client closed stdin,
HTTP with its event streams ended (the client sees them close) and uvicorn shut
down. They return how they stopped (``Stopped``).
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any, cast
from urllib.parse import quote

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp.types as types
import msgspec
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from fractor.runtime import Budget, Runtime

from .._agent._agent import Agent
from .._messages import Result
from .._parts import MEDIA_KINDS, Audio, Image, Media, describe_part
from .._version import VERSION

__all__ = [
    "TASK_SCHEMA",
    "Stopped",
    "agent_server",
    "agent_tool",
    "bind",
    "part_content",
    "serve_http",
    "serve_stdio",
    "tool_result",
]

#: The input schema of the agent's tool: one ``task`` string.
TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "what the agent should do"}},
    "required": ["task"],
    "additionalProperties": False,
}

#: Seconds a call's agent is given to stop once its answer is in (or the call ended).
STOP_GRACE = 5.0


def agent_tool(agent: Agent) -> types.Tool:
    """The MCP tool that stands for ``agent``."""
    description = agent.description or agent.instructions or f"Ask the agent {agent.name!r}."
    return types.Tool(name=agent.name, description=description, input_schema=TASK_SCHEMA)


def tool_result(result: Result) -> types.CallToolResult:
    """The MCP tool result of an execution: its text, then its images and documents
    (``Result.parts``, see ``part_content``); or an error naming how it ended."""
    if result.ok:
        content: list[types.ContentBlock] = [types.TextContent(text=result.text)]
        content.extend(part_content(part) for part in result.parts)
        return types.CallToolResult(content=content)
    text = f"{result.status}: {result.stop_reason}"
    if result.text:
        text += f"\n{result.text}"
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def part_content(part: Media) -> types.ContentBlock:
    """A part of an answer as MCP content: an image with its bytes is ``ImageContent``
    and a recording ``AudioContent`` (base64, its media type); any other kind with
    its bytes (a PDF) an embedded resource (a blob of its media type, its URI
    ``fractor://parts/<sha256>/<name>``); one given by URL a resource link to it; one
    without bytes (decoded from a store) its one line (``describe_part``)."""
    data = part.data
    if data is not None:
        encoded = base64.b64encode(data).decode()
        if type(part) is Image:
            return types.ImageContent(data=encoded, mime_type=part.media_type)
        if type(part) is Audio:
            return types.AudioContent(data=encoded, mime_type=part.media_type)
        name = getattr(part, "name", "") or f"{part.kind}{_EXTENSIONS.get(part.media_type, '')}"
        uri = f"fractor://parts/{part.sha256}/{quote(name)}"
        blob = types.BlobResourceContents(uri=uri, mime_type=part.media_type, blob=encoded)
        return types.EmbeddedResource(resource=blob)
    if part.url:
        name = part.url.rsplit("/", 1)[-1] or part.kind
        return types.ResourceLink(
            name=getattr(part, "name", "") or name,
            uri=part.url,
            mime_type=part.media_type or None,
        )
    return types.TextContent(text=describe_part(part))


#: The file extension of a part's name in its resource URI, by media type.
_EXTENSIONS = {
    media_type: extension
    for kind in MEDIA_KINDS
    for extension, media_type in reversed(kind.url_types.items())
}


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


#: How JSON names the type of a value a client sent, most specific first.
_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "a boolean"),
    ((int, float), "a number"),
    (str, "a string"),
    ((list, tuple), "an array"),
    (dict, "an object"),
)
#: Characters of a wrong argument's JSON shown in the error, at most.
_SHOWN = 50


def _bad_arguments(arguments: dict[str, Any]) -> str:
    """What is wrong with the arguments of a call, when they are not one ``task`` string:
    the argument, the type it must have, and what was given."""
    expected = "'task' (a string)"
    if "task" not in arguments:
        given = ", ".join(repr(name) for name in sorted(arguments))
        said = f"got {given} instead" if given else "no arguments were given"
        return f"argument {expected} is missing; {said}"
    task = arguments["task"]
    if not isinstance(task, str):
        return f"argument 'task' must be a string, got {_given(task)}"
    extra = sorted(name for name in arguments if name != "task")
    names = ", ".join(repr(name) for name in extra)
    return f"unexpected argument{'s' if len(extra) > 1 else ''} {names}; it takes one, {expected}"


def _given(value: object) -> str:
    """A value a client sent, as JSON (cut short), with its JSON type."""
    if value is None:
        return "null"
    try:
        shown = msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):  # pragma: no cover - arguments are JSON
        shown = repr(value)
    if len(shown) > _SHOWN:
        shown = shown[:_SHOWN] + "..."
    kind = next((name for types_, name in _JSON_TYPES if isinstance(value, types_)), None)
    return f"{shown} ({kind})" if kind else shown


class Stopped(msgspec.Struct, frozen=True, kw_only=True):
    """How ``serve_stdio`` or ``serve_http`` ended: the signal that stopped it
    (``"SIGINT"``, ``"SIGTERM"``; ``""``: the client closed stdin), and how many calls
    were in flight then (each answered with an error)."""

    signal: str = ""
    calls: int = 0


class _Calls:
    """The calls a server is running, each in a cancel scope of its own: a stop
    cancels them, and each answers with an error saying why (``stopping``)."""

    __slots__ = ("_idle", "scopes", "stopping", "unanswered", "written")

    def __init__(self, *, written: bool = False) -> None:
        self.scopes: set[anyio.CancelScope] = set()
        #: Why the server stops ("" while it serves): the error every call answers.
        self.stopping = ""
        #: Whether the transport says when an answer is written (``_Written``): the
        #: ids of the calls whose answer is not yet.
        self.written = written
        self.unanswered: set[Any] = set()
        self._idle: anyio.Event | None = None

    @contextmanager
    def running(self, request_id: Any) -> Iterator[anyio.CancelScope]:
        scope = anyio.CancelScope()
        self.scopes.add(scope)
        if self.written:
            self.unanswered.add(request_id)
        try:
            with scope:
                yield scope
        finally:
            self.scopes.discard(scope)
            self._check()

    def answered(self, request_id: Any) -> None:
        """The answer to ``request_id`` is written."""
        self.unanswered.discard(request_id)
        self._check()

    def _check(self) -> None:
        if not self.scopes and not self.unanswered and self._idle is not None:
            self._idle.set()

    async def stop(self, why: str) -> int:
        """Cancel every call in flight and wait (``STOP_GRACE`` at most) until each
        has answered (and its answer is written, when the transport says so); the
        number of them."""
        self.stopping = why
        count = len(self.scopes)
        if count:
            self._idle = anyio.Event()
            for scope in list(self.scopes):
                scope.cancel()
            with anyio.move_on_after(STOP_GRACE):
                await self._idle.wait()
        return count


def agent_server(agent: Agent, runtime: Runtime, *, budget: Budget | None = None) -> Server[Any]:
    """An MCP server offering ``agent`` as one tool, each call run in ``runtime``
    (which must be running while the server serves) under ``budget``."""
    return _agent_server(agent, runtime, budget, _Calls())


def _agent_server(
    agent: Agent, runtime: Runtime, budget: Budget | None, running: _Calls
) -> Server[Any]:
    if not isinstance(agent, Agent):
        raise TypeError(f"agent_server() serves a fractor.Agent, got {type(agent).__qualname__}")
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be a fractor.Budget or None, got {type(budget).__qualname__}")
    tool = agent_tool(agent)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name != agent.name:
            raise MCPError(
                types.INVALID_PARAMS,
                f"unknown tool {params.name!r}: this server has one tool, {agent.name!r}",
            )
        arguments = params.arguments or {}
        task = arguments.get("task")
        if not isinstance(task, str) or set(arguments) != {"task"}:
            return _error(f"{agent.name}: {_bad_arguments(arguments)}")
        if not running.stopping:
            with running.running(ctx.request_id):
                return await _run(agent, runtime, task, budget)
        return _error(f"{agent.name}: cancelled: {running.stopping} before the agent answered")

    return Server(
        agent.name,
        version=VERSION,
        description=tool.description,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=lambda name: TASK_SCHEMA if name == agent.name else None,
    )


async def _run(
    agent: Agent, runtime: Runtime, task: str, budget: Budget | None
) -> types.CallToolResult:
    """One call: a fresh actor for ``agent``, its answer, then the actor stopped
    (cancelled, with its execution, when the call is)."""
    try:
        ref = await runtime.spawn(agent)
    except Exception as exc:  # a closing runtime: the call fails, the server goes on
        return _error(f"failed: could not start agent {agent.name!r}: {exc}")
    result: Result | None = None
    try:
        result = await ref.ask(task, budget=budget)
    except Exception as exc:  # a task the agent refuses (e.g. bad text): a value here
        return _error(f"failed: {exc}")
    finally:
        # The call cancelled (the client gave up, the server stops): so is its execution,
        # with its whole tree. Else the actor is idle and stops at once.
        if result is None:
            ref.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_GRACE):
            await ref.stop()
    return tool_result(result)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def _stop_on_signal(
    running: _Calls, stopped: list[Stopped], end: Callable[[], Awaitable[None]]
) -> None:
    """At SIGINT or SIGTERM: answer the calls in flight (``_Calls.stop``), note how
    it stopped in ``stopped``, then ``end`` the transport."""
    with anyio.open_signal_receiver(*_SIGNALS) as signals:
        async for number in signals:
            name = signal.Signals(number).name
            count = await running.stop(f"the server stopped ({name})")
            stopped.append(Stopped(signal=name, calls=count))
            await end()
            return


async def serve_stdio(
    agent: Agent, *, budget: Budget | None = None, runtime: Runtime | None = None
) -> Stopped:
    """Serve ``agent`` over this process's stdin and stdout until the client closes
    them or a signal stops it (see the module), in ``runtime`` (by default one of its
    own, for the server's life)."""
    if runtime is None:
        async with Runtime() as own:
            return await serve_stdio(agent, budget=budget, runtime=own)
    running = _Calls(written=True)
    server = _agent_server(agent, runtime, budget, running)
    stopped: list[Stopped] = []
    with _claimed_stdin() as stdin:
        lines = _Lines(stdin)
        async with (
            stdio_server(stdin=cast("anyio.AsyncFile[str]", lines)) as (read, write),
            anyio.create_task_group() as tg,
        ):
            # Stopped, the input ends as if the client closed it: the SDK's server
            # ends, and its writer after the answers.
            tg.start_soon(_stop_on_signal, running, stopped, lines.close)
            written = _Written(write, running)
            await server.run(read, written, server.create_initialization_options())
            tg.cancel_scope.cancel()
    return stopped[0] if stopped else Stopped()


class _Written:
    """The stdio transport's write stream, telling ``calls`` of each answer it took
    (its writer takes one at a time, once the one before is written)."""

    def __init__(self, stream: Any, calls: _Calls) -> None:
        self.stream = stream
        self.calls = calls

    async def send(self, item: Any, /) -> None:
        await self.stream.send(item)
        message = item.message
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self.calls.answered(message.id)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> _Written:
        await self.stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        result: bool | None = await self.stream.__aexit__(*exc_info)
        return result


@contextmanager
def _claimed_stdin() -> Iterator[IO[str]]:
    """Fd 0 for the protocol alone: read from a private duplicate, with the null
    device in its place for the rest of the process (a tool's child reads EOF), and
    put back after (as the SDK's ``stdio_server`` does for the stdin it reads)."""
    private = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        yield os.fdopen(private, "r", encoding="utf-8", errors="replace", closefd=False)
    finally:
        os.dup2(private, 0)
        # ``private`` stays open: a reader thread a stop left blocked may still read it.


class _Lines:
    """The lines of ``stdin``, read by a daemon thread (a read of a pipe cannot be
    cancelled, and must not keep the process alive), as the async iterator
    ``stdio_server`` reads; ``close`` ends it at once, as an EOF would."""

    def __init__(self, stdin: IO[str]) -> None:
        self._stdin = stdin
        self._send, self._receive = anyio.create_memory_object_stream[str](1)
        self._started = False

    def __aiter__(self) -> _Lines:
        if not self._started:
            self._started = True
            token = anyio.lowlevel.current_token()
            threading.Thread(target=self._read, args=(token,), daemon=True).start()
        return self

    async def __anext__(self) -> str:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    def _read(self, token: Any) -> None:
        try:
            for line in iter(self._stdin.readline, ""):
                anyio.from_thread.run(self._send.send, line, token=token)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, RuntimeError):
            return  # stopped (or the loop is gone): nobody reads any more
        finally:
            with suppress(RuntimeError):  # the loop is gone
                anyio.from_thread.run_sync(self._send.close, token=token)

    async def close(self) -> None:
        self._send.close()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (port 0: one the system picks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(
    agent: Agent,
    sock: socket.socket,
    *,
    budget: Budget | None = None,
    runtime: Runtime | None = None,
    path: str = "/mcp",
    ready: Callable[[str], None] | None = None,
) -> Stopped:
    """Serve ``agent`` over streamable HTTP at ``path`` on the listening socket
    ``sock`` (see ``bind``) until a signal stops it (see the module). ``ready`` is
    called with the endpoint's URL once it accepts connections. Runs on asyncio
    (uvicorn)."""
    import uvicorn  # a dependency of the mcp SDK's HTTP server

    if runtime is None:
        async with Runtime() as own:
            return await serve_http(agent, sock, budget=budget, runtime=own, path=path, ready=ready)
    host, port = sock.getsockname()[:2]
    running = _Calls()
    server = _agent_server(agent, runtime, budget, running)
    requests = _Requests(server.streamable_http_app(streamable_http_path=path, host=host))
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if ready is not None and self.started:
                ready(url)

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the signals are serve_http's: it answers the calls in flight first

    config = uvicorn.Config(
        requests, log_level="warning", lifespan="on", timeout_graceful_shutdown=int(STOP_GRACE)
    )
    web = _Server(config)
    stopped: list[Stopped] = []

    async def end() -> None:
        await requests.stop()
        web.should_exit = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, running, stopped, end)
        await web.serve(sockets=[sock])
        tg.cancel_scope.cancel()
    return stopped[0] if stopped else Stopped()


class _Requests:
    """The HTTP app, with its requests in flight known: a stop waits for the POSTs
    (they carry the calls' answers), ``STOP_GRACE`` at most, then tells each event
    stream a client holds open (a GET) that the client left, so that it ends."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.posts = 0
        self._stopping = anyio.Event()
        self._idle: anyio.Event | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["method"] == "POST":
            self.posts += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.posts -= 1
                if not self.posts and self._idle is not None:
                    self._idle.set()
        else:
            await self._held(scope, receive, send)

    async def _held(self, scope: Any, receive: Any, send: Any) -> None:
        """A request that may hold an event stream open: told at a stop that its
        client left, it ends; its response is then ended here (the app leaves a
        stream a client left unfinished, and uvicorn would call that an error)."""
        state = {"started": False, "done": False}

        async def sent(message: Any) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                state["done"] = True
            await send(message)

        await self.app(scope, self._until_stopped(receive), sent)
        if self._stopping.is_set() and state["started"] and not state["done"]:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _until_stopped(self, receive: Callable[[], Any]) -> Callable[[], Any]:
        stopping = self._stopping

        async def received() -> Any:
            message: Any = {"type": "http.disconnect"}
            if stopping.is_set():
                return message
            async with anyio.create_task_group() as tg:

                async def take() -> None:
                    nonlocal message
                    message = await receive()
                    tg.cancel_scope.cancel()

                async def stop() -> None:
                    await stopping.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(take)
                tg.start_soon(stop)
            return message

        return received

    async def stop(self) -> None:
        if self.posts:
            self._idle = anyio.Event()
            with anyio.move_on_after(STOP_GRACE):
                await self._idle.wait()
        self._stopping.set()
