"""Tools served by MCP servers, as ``Tool``\\ s of an agent (extra ``fractor[mcp]``).

::

    server = MCPServer.stdio(sys.executable, ["my_server.py"])
    async with Runtime() as rt:
        tools = await mcp_tools(rt, server, include=["search"], prefix="web_")
        agent = Agent(name="a", model=model, tools=[*tools, my_own_tool])
        result = await (await rt.spawn(agent)).run("...")

A server is a definition (``MCPServer.stdio``: a command the runtime starts;
``MCPServer.http``: a streamable-HTTP URL), immutable and hashable. ``mcp_tools``
connects this runtime to it (once: ``Runtime.enter`` keys the session by the server,
so every agent of the runtime shares it, and calls are multiplexed on it), lists its
tools and makes each one a ``Tool`` whose name, description and JSON schema are the
server's (``include`` keeps some, by the server's names; ``prefix`` goes before each
name). fractor introduces itself as ``fractor`` and its version (``clientInfo``). The
session, and the server process of a stdio server, end when the runtime block exits,
after its actors stopped, on every path, the transport's own way: an HTTP session
is terminated (``DELETE``), a stdio server sent EOF (then killed if it lingers).

A call is a tool call like any other: counted by the budget, bounded by ``timeout``
and the execution's deadline, cancelled with its execution. A server error, a crash of
the server process, a malformed reply all become error results the model reads. Each
call sends a progress token: what the server reports on it becomes a
``tool_progress`` event of the call (when someone observes the execution). A
result's text is what the model reads, and its images and documents are parts of
the tool result (``ToolOutcome.parts``): an image block, or an embedded resource of
an image type, becomes an ``Image``; an audio block (WAV, MP3) an ``Audio``; an
embedded resource that is a PDF becomes a ``Document`` (named by its URI's last
segment), and one of another kind's type a part of that kind. A resource of a generic type (none,
``application/octet-stream``: what ``server-filesystem`` says of a PDF) is what its
bytes are. Their bytes are checked as any
part's are: the media type read from the magic number (a block whose bytes are not
what its ``mimeType`` says, or of no kind fractor takes, is refused), and the sizes
against ``content_limits`` (``ContentLimits``; a part, and all of one result's). What
the model cannot take becomes a line of text saying what was dropped and why, with
its size or URI, never its base64: a sound of another format, another binary
resource, a part refused, a link to a resource (not fetched). A text resource's text (or a blob's
of a ``text/*`` type, in UTF-8) is included after a line naming it. A tool the
server offers only as a task (``execution.taskSupport`` "required") is not offered
to the model: each call of it would fail (a warning names it; ``include`` naming
it is an error). A server that goes away (its process died, its connection closed)
is connected again (a stdio server started again) for the calls after it: at most
``RECONNECTS`` times within ``RECONNECT_WINDOW`` seconds, each attempt after a short
backoff; past that, every later call says the server is gone, and why. The call that
saw it go is not sent again (it may have done part of its work): its result says so,
and the model decides. An HTTP server that answers 404 for the session no longer
knows it (it restarted, or ended it) and did not handle the request: a new session
is started at once, and the request sent again on it (once). Tools that cannot be
listed raise ``ToolsUnavailable`` naming the server and why: an agent whose
``MCPToolset`` raises it is spawned all the same, and fails each execution saying
so until the tools can be listed (``AgentActor``).

The tools are bound to the runtime that listed them: build the agent inside the
runtime block. They cannot be shipped to another host.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Any, Literal, cast

import anyio
import httpx2
import msgspec
import pydantic
import structlog
from anyio.abc import TaskStatus
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from fractor.runtime import FractorError, Runtime

from .._execution._calling import ProgressReporter, progress_reporter
from .._messages import ToolCall, ToolOutcome, ToolSpec, exception_text
from .._parts import (
    TAKEN,
    Audio,
    ContentError,
    ContentLimits,
    Image,
    Media,
    MediaPart,
    generic_type,
    kind_of_type,
    size_text,
    sniff,
)
from .._tools._tool import DEFAULT_MAX_RESULT_CHARS, Tool, ToolDefinitionError
from .._tools._toolbox import ToolsUnavailable
from .._version import VERSION

__all__ = ["MCPServer", "MCPTool", "MCPToolset", "mcp_tools"]

#: How long connecting to a server (starting it, the MCP handshake) may take.
CONNECT_TIMEOUT = 30.0
#: How many times a server that went away is connected again within the window.
RECONNECTS = 3
RECONNECT_WINDOW = 60.0
#: Seconds before the first attempt to connect again; doubled after each failure.
RECONNECT_DELAY = 0.2
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_object_decoder = msgspec.json.Decoder(dict[str, Any])
#: Why a tool the server offers only as a task (``execution.taskSupport`` "required",
#: MCP 2025-11-25) is not offered to the model: fractor calls tools directly.
_TASK_ONLY = (
    "the server offers it only as a task (execution.taskSupport 'required'), and "
    "fractor calls MCP tools directly: every call would fail"
)

log = structlog.get_logger("fractor.mcp")


def _client_info() -> types.Implementation:
    """Who connects: fractor, in its installed version."""
    return types.Implementation(name="fractor", version=VERSION)


#: How fractor introduces itself to every server (``clientInfo``).
CLIENT_INFO = _client_info()


@dataclass(frozen=True, slots=True)
class MCPServer:
    """Where an MCP server is: a command to start (stdio) or a URL (streamable HTTP).

    Immutable and hashable: one runtime holds one session per distinct server.
    """

    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str = ""

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> MCPServer:
        """A server the runtime starts as ``command *args`` and talks to over its
        stdin and stdout; ``env`` is added to a minimal default environment."""
        if not isinstance(command, str) or not command:
            raise ValueError(f"an MCP stdio server needs a command, got {command!r}")
        if isinstance(args, str):
            raise TypeError(f"args is a sequence of strings, got the string {args!r}")
        return cls(
            transport="stdio",
            command=command,
            args=tuple(str(arg) for arg in args),
            env=tuple(sorted((env or {}).items())),
            cwd=cwd,
        )

    @classmethod
    def http(cls, url: str) -> MCPServer:
        """A server already running at ``url`` (streamable HTTP, e.g. ``.../mcp``)."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"an MCP HTTP server needs an http(s) URL, got {url!r}")
        return cls(transport="http", url=url)

    def __str__(self) -> str:
        if self.transport == "http":
            return self.url
        return " ".join((self.command, *self.args))

    def tools(
        self,
        *,
        include: Sequence[str] | None = None,
        prefix: str = "",
        timeout: float | None = None,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        content_limits: ContentLimits | None = None,
    ) -> MCPToolset:
        """This server's tools as an entry of an agent's ``tools``, next to its own:
        ``Agent(..., tools=[search, server.tools(prefix="fs_")])``. Resolved when the
        agent is spawned (through the runtime's one session with the server; see
        ``mcp_tools`` for the options), so the agent can be defined anywhere."""
        return MCPToolset(
            server=self,
            include=None if include is None else tuple(include),
            prefix=prefix,
            timeout=timeout,
            max_result_chars=max_result_chars,
            content_limits=content_limits,
        )

    @asynccontextmanager
    async def connect(
        self, *, on_expired: Callable[[], None] | None = None
    ) -> AsyncIterator[ClientSession]:
        """A session with this server, initialized (the server started, for stdio).

        ``on_expired`` is called when an HTTP server answers a request of the session
        with 404: it no longer knows the session (it restarted, or ended it), and did
        not handle the request; the spec's answer is a new session."""
        async with AsyncExitStack() as stack:
            if self.transport == "stdio":
                parameters = StdioServerParameters(
                    command=self.command, args=list(self.args), env=dict(self.env), cwd=self.cwd
                )
                read, write = await stack.enter_async_context(stdio_client(parameters))
            else:
                hooks: list[Callable[..., Any]] = []
                if on_expired is not None:
                    hooks.append(partial(_expired_hook, on_expired))
                client = await stack.enter_async_context(
                    httpx2.AsyncClient(timeout=_HTTP_TIMEOUT, event_hooks={"response": hooks})
                )
                read, write = await stack.enter_async_context(
                    streamable_http_client(self.url, http_client=client)
                )
            session = await stack.enter_async_context(
                ClientSession(read, write, client_info=CLIENT_INFO)
            )
            with anyio.fail_after(CONNECT_TIMEOUT):
                await session.initialize()
            yield session


#: The SDK's own timeouts for its HTTP client: 30 s, and 300 s to read (a server may
#: hold a stream open).
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
_SESSION_HEADER = "mcp-session-id"


async def _expired_hook(on_expired: Callable[[], None], response: httpx2.Response) -> None:
    """A 404 to a request that named a session: the server does not know it any more."""
    if response.status_code == 404 and _SESSION_HEADER in response.request.headers:
        on_expired()


class _Link:
    """A runtime's connection to one MCP server: the session of now, and a new one
    after the server went away (see the module). Held open by the runtime
    (``Runtime.enter``, which exits it shielded and bounded): ``_keep`` runs in a task
    group of its own there.

    Closing lets the session end the transport's own way, not cancelled: an HTTP
    session is terminated (a ``DELETE`` the server answers), a stdio server is sent
    EOF and waited for (then killed). Only between sessions (a backoff, a connection
    under way) is ``_keep`` cancelled: there is nothing to end then.
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.session: ClientSession | None = None
        #: Why no session can be had any more ("" while one can).
        self.gone = ""
        #: Set when the runtime closes the link: ``_keep`` ends its session, and stops.
        self.closing = False
        #: The last session the server answered 404 (it no longer knows it): a request
        #: of it that failed so was not handled, and is sent again on the next session.
        self.expired: ClientSession | None = None
        self._lost = anyio.Event()
        self._changed = anyio.Event()
        self._reconnects: list[float] = []
        #: Counts connections: a 404 noted by an earlier one says nothing of this one.
        self._epoch = 0

    @classmethod
    @asynccontextmanager
    async def open(cls, server: MCPServer) -> AsyncIterator[_Link]:
        link = cls(server)
        async with anyio.create_task_group() as tg:
            await tg.start(link._keep)  # the first connection: its error raises here
            try:
                yield link
            finally:
                link.closing = True
                if link.session is None:
                    tg.cancel_scope.cancel()
                else:
                    link._lost.set()  # _keep leaves the session, which ends its own way

    async def _keep(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold a session until a call sees it closed, then connect again (bounded)."""
        first = True
        delay = RECONNECT_DELAY
        why = ""
        while True:
            self._epoch += 1
            at_once = False
            try:
                expired = partial(self._expire, self._epoch)
                async with self.server.connect(on_expired=expired) as session:
                    self._up(session)
                    if first:
                        task_status.started()
                        first = False
                    delay = RECONNECT_DELAY
                    await self._lost.wait()
                    self._epoch += 1  # the 404 its DELETE may get is no news
                    if self.expired is session:  # the server is there: no backoff
                        at_once = True
                        why = "it no longer knew the session (HTTP 404)"
                    else:
                        why = "its connection closed"
            except Exception as exc:  # connecting failed, or the dead session's exit did
                if first:
                    raise
                why = why or exception_text(exc)
            self._down()
            if self.closing:
                return
            now = anyio.current_time()
            self._reconnects = [t for t in self._reconnects if now - t <= RECONNECT_WINDOW]
            if len(self._reconnects) >= RECONNECTS:
                self.gone = (
                    f"it went away {RECONNECTS + 1} times within {RECONNECT_WINDOW:g} s "
                    f"(last: {why}); it is not connected again"
                )
                self._notify()
                return
            self._reconnects.append(now)
            if not at_once:
                await anyio.sleep(delay)
                delay *= 2
            why = ""

    def _expire(self, epoch: int) -> None:
        """The server answered 404 to a request of connection ``epoch``'s session."""
        session = self.session
        if epoch == self._epoch and session is not None:
            self.expired = session
            self.lost(session)

    def _up(self, session: ClientSession) -> None:
        self.session = session
        self._lost = anyio.Event()
        self._notify()

    def _down(self) -> None:
        self.session = None
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def lost(self, session: ClientSession) -> None:
        """A call saw ``session`` closed: connect again (once, however many saw it)."""
        if session is self.session:
            self._lost.set()

    async def current(self) -> ClientSession | None:
        """The session to call through, waiting while the server is connected again;
        None once it is gone."""
        while True:
            session = self.session
            if session is not None and not self._lost.is_set():
                return session
            if self.gone:
                return None
            await self._changed.wait()


@dataclass(frozen=True, slots=True)
class MCPToolset:
    """An MCP server's tools in an agent's ``tools`` (``MCPServer.tools``): an
    ``fractor.Toolset``, resolved by ``mcp_tools`` in the runtime that spawns the agent."""

    server: MCPServer
    include: tuple[str, ...] | None = None
    prefix: str = ""
    timeout: float | None = None
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    content_limits: ContentLimits | None = None

    async def tools(self, runtime: Runtime) -> tuple[MCPTool, ...]:
        return await mcp_tools(
            runtime,
            self.server,
            include=self.include,
            prefix=self.prefix,
            timeout=self.timeout,
            max_result_chars=self.max_result_chars,
            content_limits=self.content_limits,
        )


class MCPTool(Tool[..., Any]):
    """One tool of an MCP server, called through a runtime's session with it."""

    __slots__ = ("content_limits", "link", "remote_name", "server")

    def __init__(
        self,
        link: _Link,
        server: MCPServer,
        listed: types.Tool,
        *,
        name: str,
        timeout: float | None,
        max_result_chars: int,
        content_limits: ContentLimits | None = None,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ToolDefinitionError(
                f"cannot use the tool {listed.name!r} of the MCP server {server}",
                f"its name {name!r} is not 1 to 64 letters, digits, '_' or '-'",
                "leave it out with include=, or choose another prefix",
            )
        self.link = link
        self.server = server
        #: What the images and documents of one result may weigh (``ContentLimits``).
        self.content_limits = content_limits or _LIMITS
        self.remote_name = listed.name
        self.fn = self._unbound
        self.name = name
        self.description = listed.description or ""
        self.timeout = timeout
        self.retries = 0
        self.retry_delay = 0.0
        self.max_result_chars = max_result_chars
        self.limiter = None
        self.approval = False
        self.is_async = True
        self.arguments_type = msgspec.Struct
        parameters = dict(listed.input_schema or {"type": "object", "properties": {}})
        self.spec = ToolSpec(name=name, description=self.description, parameters=parameters)
        self._attempts = 1
        self._invalid_prefix = f"invalid arguments for tool {name!r}: "
        self._expected = f"Expected arguments: {msgspec.json.encode(parameters).decode()}"
        self._timed_out = f"tool {name!r} timed out after {timeout:g} s" if timeout else ""
        self.direct = False

    @property
    def session(self) -> ClientSession | None:
        """The runtime's session with the server now (None while it reconnects)."""
        return self.link.session

    def _unbound(self, **kwargs: Any) -> Any:
        raise TypeError(f"the MCP tool {self.name!r} is called by the agent, not directly")

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(
            f"the MCP tool {self.name!r} uses this runtime's session with {self.server}: "
            "it cannot run on another host"
        )

    def __repr__(self) -> str:
        return f"<MCPTool {self.name!r} of {self.server} timeout={self.timeout!r}>"

    async def invoke(self, call: ToolCall) -> ToolOutcome:
        """Call the server's tool; the outcome is its text, or an error the model reads."""
        start = perf_counter()
        raw = call.arguments
        try:
            arguments = _object_decoder.decode(raw if raw and not raw.isspace() else "{}")
        except msgspec.DecodeError as exc:
            problem = f"the arguments are not a JSON object ({exc})"
            return self._finish(
                call, f"{self._invalid_prefix}{problem}. {self._expected}", 0, start
            )
        link = self.link
        session = None
        resent = False
        progress = _Progress(progress_reporter())
        try:
            with anyio.move_on_after(self.timeout) as scope:
                while True:
                    session = await link.current()
                    if session is None:
                        text = f"tool {self.name!r} failed: the MCP server {self.server} is gone: "
                        return self._finish(call, text + link.gone, 0, start)
                    try:
                        result = await session.call_tool(
                            self.remote_name, arguments, progress_callback=progress
                        )
                        break
                    except MCPError:
                        # A session the server no longer knows: the call was not handled,
                        # and goes again on a new session (once).
                        if link.expired is not session or resent:
                            raise
                        resent = True
        except MCPError as exc:
            if link.expired is session and session is not None:
                text = (
                    f"tool {self.name!r} failed: the MCP server {self.server} did not know "
                    "the session, a new one either (HTTP 404), and did not handle the call; "
                    "it is connected again for later calls"
                )
                return self._finish(call, text, 0, start)
            if exc.error.code == CONNECTION_CLOSED and session is not None:
                link.lost(session)
                text = (
                    f"tool {self.name!r} failed: the MCP server {self.server} went away "
                    "before it answered (its connection closed); if the call reached it, "
                    "it may have done part of its work. The server is being connected "
                    "again for later calls"
                )
            else:
                text = f"tool {self.name!r} failed: the MCP server answered {exception_text(exc)}"
            return self._finish(call, text, 1, start)
        except pydantic.ValidationError as exc:
            text = (
                f"tool {self.name!r} failed: the MCP server {self.server} sent a malformed "
                f"reply ({exception_text(exc)})"
            )
            return self._finish(call, text, 1, start)
        except Exception as exc:
            text = f"tool {self.name!r} (MCP server {self.server}) failed: {exception_text(exc)}"
            return self._finish(call, text, 1, start)
        finally:
            progress.report = None  # a notification later than the answer is not news
        if scope.cancelled_caught:
            if session is None:  # still waiting for the server to be connected again
                text = f"{self._timed_out} waiting for the MCP server {self.server} to be "
                return self._finish(call, text + "connected again", 0, start)
            return self._finish(call, self._timed_out, 1, start)
        text, parts = _content(result, self.content_limits)
        if result.is_error:
            outcome = self._finish(call, f"tool {self.name!r} failed: {text}", 1, start)
        else:
            outcome = self._outcome(call, text, False, 1, start)
        return msgspec.structs.replace(outcome, parts=parts) if parts else outcome


class _Progress:
    """The progress callback of one call: its progress token makes the server report
    how far along it is; each report becomes a ``tool_progress`` event of the call
    (when someone observes it), until the call returns."""

    __slots__ = ("report",)

    def __init__(self, report: ProgressReporter | None) -> None:
        self.report = report

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        report = self.report
        if report is not None:
            report(progress, total, message or "")


_LIMITS = ContentLimits()


def _content(result: types.CallToolResult, limits: ContentLimits) -> tuple[str, tuple[Media, ...]]:
    """A tool result's content as the text the model reads and the images and
    documents it sees (see the module): each block of text in order, one line for
    each block dropped, saying why."""
    lines: list[str] = []
    media = _Media(limits, lines)
    for block in result.content:
        match block:
            case types.TextContent(text=text):
                lines.append(text)
            case types.ImageContent(data=data, mime_type=mime):
                media.add(data, mime, f"{mime} image", kind=Image)
            case types.AudioContent(data=data, mime_type=mime):
                media.add(data, mime, f"{mime} audio", kind=Audio)
            case types.EmbeddedResource(resource=types.TextResourceContents() as resource):
                lines.append(f"[{resource.mime_type or 'text'} resource {resource.uri}]")
                lines.append(resource.text)
            case types.EmbeddedResource(resource=types.BlobResourceContents() as resource):
                mime = resource.mime_type or ""
                what = f"{mime or 'binary'} resource {resource.uri}"
                name = posixpath.basename(str(resource.uri).split("?", 1)[0].rstrip("/"))
                if (kind := kind_of_type(mime)) is not None:
                    media.add(resource.blob, mime, what, kind=kind, name=name)
                elif generic_type(mime):  # none, application/octet-stream: the bytes decide
                    media.add(resource.blob, mime, what, kind=None, name=name)
                elif mime.startswith("text/") and (said := _blob_text(resource.blob)) is not None:
                    lines.append(f"[{mime} resource {resource.uri}]")
                    lines.append(said)
                else:
                    lines.append(_dropped(what, _decoded_size(resource.blob), _NOT_TAKEN))
            case types.ResourceLink():
                about = [block.uri, block.mime_type or ""]
                if block.size is not None:
                    about.append(size_text(block.size))
                said = ", ".join(filter(None, about))
                lines.append(f"[a link to the resource {block.name!r}: {said}; not fetched]")
            case _:  # a kind of content newer than this code
                lines.append(f"[{getattr(block, 'type', 'unknown')} content: dropped, {_NEWER}]")
    if not lines and not media.parts and result.structured_content is not None:
        return msgspec.json.encode(result.structured_content).decode(), ()
    return "\n".join(lines), tuple(media.parts)


class _Media:
    """The images and documents of one result, as they are decoded and checked: a
    block refused adds its line to ``lines`` instead."""

    __slots__ = ("limits", "lines", "parts", "total")

    def __init__(self, limits: ContentLimits, lines: list[str]) -> None:
        self.limits = limits
        self.lines = lines
        self.parts: list[Media] = []
        self.total = 0

    def add(
        self,
        data: str,
        mime: str,
        what: str,
        *,
        kind: type[MediaPart] | None,
        name: str = "",
    ) -> None:
        """Decode base64 ``data`` that says it is ``mime`` (``kind`` None: a blob of
        no stated type, taken if its bytes are of a kind fractor takes) and keep it
        as a part, or say in a line why not."""
        limits = self.limits
        size = _decoded_size(data)
        if limits.part is not None and size > limits.part:
            why = f"more than the {size_text(limits.part)} a part may have (ContentLimits.part)"
            self.lines.append(_dropped(what, size, why))
            return
        if limits.request is not None and self.total + size > limits.request:
            why = (
                f"with the parts before it, more than the {size_text(limits.request)} one "
                "result may carry (ContentLimits.request)"
            )
            self.lines.append(_dropped(what, size, why))
            return
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            self.lines.append(_dropped(what, size, "its data is not valid base64"))
            return
        if kind is None:
            kind = kind_of_type(sniff(raw))
            if kind is None:
                self.lines.append(_dropped(what, len(raw), _NOT_TAKEN))
                return
        try:
            part = cast("Media", kind.from_bytes(raw, mime, name=name))  # (one of them)
        except ContentError as exc:
            self.lines.append(_dropped(what, len(raw), str(exc)))
            return
        self.parts.append(part)
        self.total += part.size


_NOT_TAKEN = f"the model takes {TAKEN} only"
_NEWER = "a kind of content fractor does not know"


def _blob_text(data: str) -> str | None:
    """The text a blob of a text type holds (None: not base64 of UTF-8)."""
    try:
        return base64.b64decode(data, validate=True).decode()
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def _dropped(what: str, size: int, why: str) -> str:
    """The line naming a block the model does not see: what it was, how big, why."""
    return f"[{what}, {size_text(size)}: dropped, {why}]"


def _decoded_size(data: str) -> int:
    """The bytes base64 ``data`` holds (without decoding it)."""
    return len(data.rstrip("=")) * 3 // 4


async def _listed(link: _Link) -> list[types.Tool]:
    """Every tool the server lists, page by page. A session the server no longer
    knows (HTTP 404) is replaced, and the listing starts again on the new one, once."""
    resent = False
    while True:
        session = await link.current()
        if session is None:
            raise ToolsUnavailable(
                f"cannot list the tools of the MCP server {link.server}: it is gone: {link.gone}"
            )
        listed: list[types.Tool] = []
        cursor: str | None = None
        try:
            while True:
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return listed
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED:
                link.lost(session)  # connected again for whoever lists or calls next
            if link.expired is not session or resent:
                raise
            resent = True


def _leaves(error: BaseException) -> Iterator[BaseException]:
    """The errors an exception group holds, however nested (the error itself if not
    a group): what the SDK's task groups wrap a failed connection in."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


async def mcp_tools(
    runtime: Runtime,
    server: MCPServer,
    *,
    include: Iterable[str] | None = None,
    prefix: str = "",
    timeout: float | None = None,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    content_limits: ContentLimits | None = None,
) -> tuple[MCPTool, ...]:
    """The tools of ``server``, through ``runtime``'s session with it (connected on
    first use, shared, closed with the runtime).

    ``include`` keeps the tools of those names (the server's names; one it does not
    have is an error naming those it has); ``prefix`` goes before every name the model
    sees; ``timeout`` bounds each call, in seconds; ``max_result_chars`` caps a
    result's text; ``content_limits`` bounds its images and documents (by default
    ``ContentLimits()``: 20 MB a part, 50 MB a result). A server that cannot be
    reached, is gone, or answers the listing with an error (or not within
    ``CONNECT_TIMEOUT``) raises ``ToolsUnavailable``.
    """
    if not isinstance(server, MCPServer):
        raise TypeError(f"server is an MCPServer, got {type(server).__qualname__}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
    unlisted = f"cannot list the tools of the MCP server {server}"
    try:
        link: _Link = await runtime.enter((MCPServer, server), lambda: _Link.open(server))
    except Exception as exc:  # RuntimeClosed is the caller's mistake, not the server's
        if isinstance(exc, FractorError):
            raise
        why = "; ".join(exception_text(leaf) for leaf in _leaves(exc))
        raise ToolsUnavailable(f"{unlisted}: connecting failed ({why})") from exc
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            listed = await _listed(link)
    except TimeoutError as exc:
        raise ToolsUnavailable(f"{unlisted}: no answer within {CONNECT_TIMEOUT:g} s") from exc
    except (MCPError, pydantic.ValidationError, OSError) as exc:
        if isinstance(exc, ToolsUnavailable):
            raise
        raise ToolsUnavailable(f"{unlisted}: {exception_text(exc)}") from exc
    task_only = [t.name for t in listed if t.execution and t.execution.task_support == "required"]
    if include is not None:
        wanted = [include] if isinstance(include, str) else list(include)
        names = {t.name for t in listed}
        missing = [name for name in wanted if name not in names]
        if missing:
            raise ValueError(
                f"the MCP server {server} has no tool {', '.join(map(repr, missing))}; "
                f"it has {', '.join(sorted(names)) or 'none'}"
            )
        unusable = [name for name in wanted if name in task_only]
        if unusable:
            raise ValueError(
                f"cannot use the tool {', '.join(map(repr, unusable))} of the MCP server "
                f"{server}: {_TASK_ONLY}"
            )
        chosen = set(wanted)
        listed = [t for t in listed if t.name in chosen]
    elif task_only:
        log.warning("mcp_tools_left_out", server=str(server), tools=task_only, reason=_TASK_ONLY)
        listed = [t for t in listed if t.name not in task_only]
    return tuple(
        MCPTool(
            link,
            server,
            entry,
            name=f"{prefix}{entry.name}",
            timeout=None if timeout is None else float(timeout),
            max_result_chars=max_result_chars,
            content_limits=content_limits,
        )
        for entry in listed
    )
