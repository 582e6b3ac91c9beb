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
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import anyio
import mcp.types as types
import msgspec
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from fractor.runtime import Budget, Runtime

from .._agent._agent import Agent
from .._messages import Result
from .._parts import Document, Image, Media, describe_part
from .._version import VERSION

__all__ = [
    "TASK_SCHEMA",
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
    """An image or a document of an answer as MCP content: an image with its bytes is
    ``ImageContent`` (base64, its media type); a PDF with its bytes an embedded
    resource (a blob, ``application/pdf``, its URI ``fractor://parts/<sha256>/<name>``);
    one given by URL a resource link to it; one without bytes (decoded from a store)
    its one line (``describe_part``)."""
    data = part.data
    if data is not None:
        encoded = base64.b64encode(data).decode()
        if type(part) is Image:
            return types.ImageContent(data=encoded, mime_type=part.media_type)
        assert type(part) is Document
        uri = f"fractor://parts/{part.sha256}/{quote(part.name or 'document.pdf')}"
        blob = types.BlobResourceContents(uri=uri, mime_type=part.media_type, blob=encoded)
        return types.EmbeddedResource(resource=blob)
    if part.url:
        name = part.url.rsplit("/", 1)[-1] or ("image" if type(part) is Image else "document")
        return types.ResourceLink(
            name=getattr(part, "name", "") or name,
            uri=part.url,
            mime_type=part.media_type or None,
        )
    return types.TextContent(text=describe_part(part))


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


def agent_server(agent: Agent, runtime: Runtime, *, budget: Budget | None = None) -> Server[Any]:
    """An MCP server offering ``agent`` as one tool, each call run in ``runtime``
    (which must be running while the server serves) under ``budget``."""
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
        return await _run(agent, runtime, task, budget)

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


async def serve_stdio(
    agent: Agent, *, budget: Budget | None = None, runtime: Runtime | None = None
) -> None:
    """Serve ``agent`` over this process's stdin and stdout until the client closes
    them, in ``runtime`` (by default one of its own, for the server's life)."""
    if runtime is None:
        async with Runtime() as own:
            await serve_stdio(agent, budget=budget, runtime=own)
        return
    server = agent_server(agent, runtime, budget=budget)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


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
) -> None:
    """Serve ``agent`` over streamable HTTP at ``path`` on the listening socket
    ``sock`` (see ``bind``) until the process is told to stop (SIGINT, SIGTERM).
    ``ready`` is called with the endpoint's URL once it accepts connections.
    Runs on asyncio (uvicorn)."""
    import uvicorn  # a dependency of the mcp SDK's HTTP server

    if runtime is None:
        async with Runtime() as own:
            await serve_http(agent, sock, budget=budget, runtime=own, path=path, ready=ready)
        return
    host, port = sock.getsockname()[:2]
    server = agent_server(agent, runtime, budget=budget)
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if ready is not None and self.started:
                ready(url)

    web = _Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    await web.serve(sockets=[sock])
