"""The web view's server: a page on 127.0.0.1 showing a live runtime's tree.

::

    async with Runtime() as rt, serve_ui(rt) as ui:
        ...  # ui.url, printed once, carries the token every request needs

The same server, with the same thread and token, serves two other kinds of pages:
``serve_stored(path)`` (``StoredUI``, ``fractor ui --db FILE``) the executions of a
SQLite store, each as a timeline with its steps' details (``_stored.py``), and
``serve_sweep(tool, levels, calls=N)`` (``SweepUI``, ``fractor bench --sweep --ui``)
a tool's concurrency sweep, its chart growing as each level is measured.

**Threads and loops.** The runtime runs on anyio, on asyncio or on trio; uvicorn (the
ASGI server, a dependency of ``mcp`` already) runs on asyncio only. So the server
runs in a thread of its own, on its own asyncio event loop, and never touches the
runtime's objects there:

- The runtime's side (a task in the ``UI``'s task group, on the runtime's loop)
  **publishes**: every ``interval`` seconds it reads ``rt.tree()``, what the
  supervisor holds reserved, the latest line each execution streamed (a listener
  of the event bus keeps it where each event happens: ``LatestLines``, which skips
  at once the kinds that set no line; nothing queued, nothing dropped) and the
  pending approvals, and encodes them once as JSON (a ``TreeView``).
  The bytes are handed over by one assignment of an immutable value, which the
  server's thread reads as it is: however many events happen, the page gets at
  most ``1 / interval`` new views a second, coalesced here, never a message per event.
- The server's side only serves those bytes (``GET /api/tree``) and the page. A
  decision on an approval (``POST /api/approvals/{id}``) is the one call the other
  way: it is run on the runtime's loop (``anyio.from_thread.run_sync`` with the
  loop's token, from a worker thread of the server so its loop never blocks), through
  the agent's control lane, as ``AgentRef.approve`` and ``AgentRef.deny`` do.

**Safe by default.** It binds 127.0.0.1 only. A random token
(``secrets.token_urlsafe``), printed once with the URL as Jupyter does, is required
for every request (in the query, ``?token=``, or the ``X-Fractor-Token`` header);
without it the answer is 403. So is the answer to a request for another ``Host``
than 127.0.0.1, localhost or [::1] with the server's port, or from another
``Origin``: a page of another site that has its own name point at 127.0.0.1 (DNS
rebinding) sends its name, as local dev servers know (``_Gate``, in front of every
kind of page). The page and its script ship in this package (no CDN).
What the page shows comes from snapshots and events, which carry no secrets (the
providers redact their errors before anything records them); on top of that every
view goes through the same ``redact`` as the providers' errors
(``fractor.actors.providers.redact``): any ``secrets=`` given, and credentials in a
URL, are ``[redacted]``.
"""

from __future__ import annotations

import os
import re
import secrets as _secrets
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from functools import partial
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import msgspec
from anyio.abc import TaskGroup

from fractor.runtime import Runtime, SQLiteStore, TreeSnapshot

from .._agent._ref import Decide, GetApprovals
from .._messages import ExecutionTrace, safe_text
from .._observation._lines import LatestLines
from .._observation._traces import TRACE_KIND, collect_trace_tree, render_trace_tree
from .._tools._approval import ApprovalError, ApprovalRequest
from ..providers import redact
from ._stored import ExecutionSummary, execution_details, list_executions
from ._sweep import SweepLevel, SweepReport, find_knee, render_sweep_svg
from ._timeline import render_timeline_svg
from ._view import Held, tree_view

if TYPE_CHECKING:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["UI", "StoredUI", "SweepUI", "SweepView", "serve_stored", "serve_sweep", "serve_ui"]

#: The default seconds between two views published (a few a second at most).
INTERVAL = 0.25
#: How long starting or stopping the server's thread may take.
THREAD_TIMEOUT = 10.0
#: The header that may carry the token instead of the query.
TOKEN_HEADER = "x-fractor-token"


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``POST /api/approvals/{id}``."""

    approved: bool
    reason: str = ""


_encode = msgspec.json.Encoder().encode
_decode_decision = msgspec.json.Decoder(Decision).decode


def _check_port(port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port must be a whole number from 0 to 65535, got {port!r}")


class _Served:
    """What the live view's, the stored traces' and the sweep's servers share: a
    token, a port, a thread serving ``_app``, the URL said once on entering."""

    def __init__(self, *, port: int, announce: Callable[[str], None] | None) -> None:
        _check_port(port)
        #: The token every request needs.
        self.token = _secrets.token_urlsafe(32)
        #: The port it listens on (the one given, or the one the system chose for 0).
        self.port = port
        self._announce = announce
        self._serving = _ServerThread()

    @property
    def url(self) -> str:
        """The page's address, with the token."""
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    def _app(self, started: threading.Event) -> ASGIApp:
        raise NotImplementedError  # pragma: no cover - each kind serves its own

    async def _check(self) -> None:
        """Raise, before anything is served, when it cannot serve what it should."""

    async def _enter(self) -> None:
        await self._check()
        self.port = await self._serving.start(self._app, self.port, self.token)
        _say(self.url, self._announce)

    async def aclose(self) -> None:
        await self._serving.stop()


class UI(_Served):
    """A running web view of ``rt`` (see the module): an async context manager."""

    def __init__(
        self,
        rt: Runtime,
        *,
        port: int = 0,
        interval: float = INTERVAL,
        secrets: Iterable[str] = (),
        announce: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(port=port, announce=announce)
        if not isinstance(interval, int | float) or not 0 < interval < 3600:
            raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
        self.rt = rt
        self.interval = float(interval)
        #: As they stand in JSON (``redact`` takes out those of 4 characters or more).
        self._secrets = tuple(
            msgspec.json.encode(secret)[1:-1].decode()
            for secret in secrets
            if isinstance(secret, str)
        )
        self._lines = LatestLines()
        self._version = 0
        #: The latest view, encoded, and its ``ETag`` (its digest, quoted: a read
        #: naming it in ``If-None-Match`` is answered 304, nothing sent): one value,
        #: replaced whole, which the server's thread reads as it is.
        self._published: tuple[bytes, str] = (b"", "")
        self._stack = AsyncExitStack()
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._group: TaskGroup | None = None

    # -- the runtime's side --------------------------------------------------------

    def view(self) -> bytes:
        """The latest view published, as the page reads it (JSON)."""
        return self._published[0]

    def publish(self) -> None:
        """Read the tree, the latest lines and the approvals, and
        publish a new view (on the runtime's loop; ``interval`` does it on its own)."""
        snapshot = self.rt.tree()
        held = {
            node.id: Held(
                input_tokens=node.reserved_input,
                output_tokens=node.reserved_output,
                cost=node.reserved_cost,
                requests=node.in_flight,
            )
            for node in list(self.rt.supervisor.nodes.values())
            if node.in_flight
        }
        self._version += 1
        view = tree_view(
            snapshot,
            version=self._version,
            held=held,
            lines=self._lines.line,
            approvals=self._approvals(snapshot),
        )
        self._published = (_redacted(_encode(view), self._secrets), f'"{view.digest}"')

    def _tops(self, snapshot: TreeSnapshot) -> list[str]:
        """The actor ids of the running top-level agents (the ones approvals go through)."""
        roots = {node.id for node in snapshot.nodes if node.parent_id is None}
        tops: dict[str, None] = {}
        for node in snapshot.nodes:
            if node.parent_id in roots and node.status == "running" and node.actor_id:
                tops[node.actor_id] = None
        return list(tops)

    def _approvals(self, snapshot: TreeSnapshot) -> list[ApprovalRequest]:
        found: list[ApprovalRequest] = []
        for actor_id in self._tops(snapshot):
            try:
                found.extend(self.rt.ref(actor_id).inspect(GetApprovals()))
            except Exception:  # it stopped, or is no agent: none to list
                continue
        return found

    def decide(self, request_id: str, *, approved: bool, reason: str = "") -> None:
        """Answer a pending approval as ``ref.approve``/``ref.deny`` of its top-level
        agent do; ``ApprovalError`` if none waits with this id (on the runtime's loop)."""
        for actor_id in self._tops(self.rt.tree()):
            try:
                ref = self.rt.ref(actor_id)
                pending = ref.inspect(GetApprovals())
            except Exception:  # it stopped, or is no agent
                continue
            if any(request.id == request_id for request in pending):
                if approved:
                    ref.inspect(Decide(id=request_id, approved=True))
                else:
                    ref.inspect(Decide(id=request_id, approved=False, reason=safe_text(reason)))
                self.publish()
                return
        raise ApprovalError(request_id, "(any running agent)")

    async def _publish_every(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            self.publish()

    # -- the server's side (its own thread and asyncio loop) -------------------------

    def _app(self, started: threading.Event) -> ASGIApp:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        page = _asset("page.html")

        async def index(request: Request) -> Response:
            return _html(page)

        async def tree(request: Request) -> Response:
            payload, etag = self._published
            headers = {**_NO_STORE, "etag": etag}
            if etag and request.headers.get("if-none-match") == etag:
                return Response(status_code=304, headers=headers)  # nothing new to draw
            return Response(payload, media_type="application/json", headers=headers)

        async def approval(request: Request) -> Response:
            request_id = request.path_params["request_id"]
            try:
                decision = _decode_decision(await request.body())
            except msgspec.ValidationError as error:
                return JSONResponse({"error": f"the body must be {_BODY}: {error}"}, 400)
            except msgspec.DecodeError:
                return JSONResponse({"error": f"the body must be JSON: {_BODY}"}, 400)
            call = partial(
                anyio.from_thread.run_sync,
                partial(
                    self.decide, request_id, approved=decision.approved, reason=decision.reason
                ),
                token=self._token,
            )
            try:
                await anyio.to_thread.run_sync(call)
            except ApprovalError:
                return JSONResponse({"error": f"no approval {request_id!r} is waiting"}, 404)
            return JSONResponse({"id": request_id, "approved": decision.approved})

        routes = [
            Route("/", index),
            Route("/api/tree", tree),
            # ``path``: the id of a request made on another host names it
            # (``default-0/approval-1``), sent as one segment (``%2F``) or not.
            Route("/api/approvals/{request_id:path}", approval, methods=["POST"]),
        ]
        return Starlette(routes=routes, lifespan=_lifespan(started))

    async def __aenter__(self) -> UI:
        async with AsyncExitStack() as stack:
            self._token = anyio.lowlevel.current_token()
            # Fed where each event happens (a listener: no queue to drop from, no
            # task to wake), skipping at once the kinds that set no line.
            stack.callback(self.rt.event_bus.listen(self._lines.feed))
            self.publish()
            stack.push_async_callback(self.aclose)
            await self._enter()
            self._stack = stack.pop_all()
        # Apart from the stack: the body's exception goes through it as it was raised.
        group = self._group = anyio.create_task_group()
        await group.__aenter__()
        group.start_soon(self._publish_every)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, self._group = self._group, None
        stack, self._stack = self._stack, AsyncExitStack()
        try:
            if group is not None:
                group.cancel_scope.cancel()
                await group.__aexit__(None, None, None)
        except BaseException as error:
            await stack.__aexit__(type(error), error, error.__traceback__)
            raise
        return await stack.__aexit__(exc_type, exc, tb)


#: A string of a JSON document (its quotes included).
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _redacted(data: bytes, secrets: tuple[str, ...]) -> bytes:
    """JSON ``data`` with each of its strings through ``redact`` (one string at a
    time, so that URL credentials are looked for within a string, never across two),
    when there may be something to take out: a secret, or a URL and an ``@``."""
    found = any(len(secret) >= 4 and secret.encode() in data for secret in secrets)
    if not found and not (b"://" in data and b"@" in data):
        return data
    return _JSON_STRING.sub(lambda match: redact(match[0].decode(), secrets).encode(), data)


_NO_STORE = {"cache-control": "no-store"}
_BODY = '{"approved": true or false, "reason": "..."}'


#: The names of this machine a page of it may be asked for by (with the port).
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


class _Gate:
    """Every HTTP request is answered 403 unless it is for this server and from it:
    its ``Host`` names it (127.0.0.1, localhost or [::1], with its port: a page of
    another site that had its own name point here, DNS rebinding, sends its name),
    its ``Origin``, when sent, is one of those (a page of another site sends its
    own), and it carries the token."""

    def __init__(self, app: ASGIApp, token: str, port: int) -> None:
        self.app = app
        self.token = token.encode()
        names = [f"{name}:{port}" for name in LOOPBACK]
        if port == 80:  # the port a browser leaves out
            names += LOOPBACK
        self.hosts = frozenset(names)
        self.origins = frozenset(f"http://{host}" for host in names)
        self.expected = " or ".join(f"{name}:{port}" for name in LOOPBACK)

    def refusal(self, request: Request) -> str:
        """Why ``request`` is refused, or ``""``."""
        host = request.headers.get("host", "")
        if host.lower() not in self.hosts:
            return (
                f"403: this server answers requests for {self.expected} only, not for "
                f"Host {host!r} (a name that points here is not enough)"
            )
        origin = request.headers.get("origin")
        if origin is not None and origin.lower() not in self.origins:
            return (
                f"403: this server answers its own pages only (Origin http://"
                f"{self.expected}), not a page of Origin {origin!r}"
            )
        given = request.query_params.get("token") or request.headers.get(TOKEN_HEADER, "")
        if not _secrets.compare_digest(given.encode(), self.token):
            return "403: this page needs the token printed with its URL (?token=...)"
        return ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            from starlette.requests import Request
            from starlette.responses import PlainTextResponse

            refusal = self.refusal(Request(scope))
            if refusal:
                await PlainTextResponse(refusal, 403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- serving one app in a thread of its own --------------------------------------------


class _ServerThread:
    """uvicorn serving one ASGI app on 127.0.0.1 behind the ``_Gate``, in a thread of
    its own on its own asyncio loop (the thread is named ``fractor-ui``): ``await
    start(make_app, port, token)`` gives the port it listens on, ``await stop()``
    (idempotent) ends it."""

    def __init__(self) -> None:
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    async def start(
        self, make_app: Callable[[threading.Event], ASGIApp], port: int, token: str
    ) -> int:
        """Bind ``port`` (0: a free one), serve ``make_app(started)`` (its lifespan sets
        ``started``) to the requests for this port with ``token``, and return once it
        serves; ``RuntimeError`` if it cannot."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        port = sock.getsockname()[1]
        started = threading.Event()
        config = uvicorn.Config(
            _Gate(make_app(started), token, port),
            loop="asyncio",
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        server = self._server = uvicorn.Server(config)
        thread = self._thread = threading.Thread(
            target=self._serve, args=(server, sock), name="fractor-ui", daemon=True
        )
        thread.start()

        def wait() -> bool:  # until it serves, or its thread ended (it never will)
            deadline = THREAD_TIMEOUT
            while deadline > 0 and thread.is_alive():
                if started.wait(0.05):
                    return True
                deadline -= 0.05
            return started.is_set()

        if not await anyio.to_thread.run_sync(wait):
            await self.stop()
            raise RuntimeError(f"the web view's server did not start: {self._failure!r}")
        return port

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as error:  # reported by start, never lost in the thread
            self._failure = error
        finally:
            sock.close()

    async def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.join, THREAD_TIMEOUT)
        self._server = self._thread = None


def _lifespan(
    started: threading.Event, resource: Callable[[], AbstractAsyncContextManager[Any]] | None = None
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """A Starlette lifespan that sets ``started`` once it serves, inside ``resource()``
    (opened and closed on the server's loop) if one is given."""

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if resource is not None:
                await stack.enter_async_context(resource())
            started.set()
            yield

    return lifespan


def _say(url: str, announce: Callable[[str], None] | None) -> None:
    """The URL with its token, said once: to ``announce``, else on stderr."""
    if announce is None:
        print(f"fractor web view: {url}", file=sys.stderr, flush=True)
    else:
        announce(url)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _html(text: str) -> Response:
    from starlette.responses import Response

    return Response(text, media_type="text/html; charset=utf-8", headers=_NO_STORE)


def _json(data: bytes, status: int = 200) -> Response:
    from starlette.responses import Response

    return Response(data, status, media_type="application/json", headers=_NO_STORE)


# -- stored traces ---------------------------------------------------------------------


class StoredUI(_Served):
    """The executions a SQLite store keeps, served on 127.0.0.1 (``serve_stored``):
    an async context manager.

    ``GET /`` lists the top-level executions (from ``GET /api/executions``);
    ``GET /executions/{id}`` is one execution's timeline with the text ``fractor
    trace`` prints, and ``GET /api/executions/{id}`` the details of each of its
    steps (the page shows them when a bar is clicked). The store is opened on the
    server's loop and read at each request, so executions saved meanwhile appear.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        port: int = 0,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(port=port, announce=announce)
        self.path = os.fspath(path)

    async def _check(self) -> None:
        if not await anyio.Path(self.path).is_file():
            raise FileNotFoundError(
                f"no store at {self.path!r}: give the SQLite file a Runtime(store="
                "SQLiteStore(...)) or fractor run --db wrote"
            )
        async with SQLiteStore(self.path) as store:  # a StoreError if it is not one
            await store.records(kind=TRACE_KIND, limit=1)

    def _app(self, started: threading.Event) -> ASGIApp:
        from starlette.applications import Starlette
        from starlette.routing import Route

        # Made on the server's loop (its lifespan), where every request reads it.
        opened: list[SQLiteStore] = []

        def open_store() -> SQLiteStore:
            opened.append(SQLiteStore(self.path))
            return opened[0]

        listing, timeline = _asset("executions.html"), _asset("traces.html")

        async def index(request: Request) -> Response:
            return _html(listing)

        async def executions(request: Request) -> Response:
            found = await list_executions(opened[0])
            view = StoredList(store=self.path, executions=found)
            return _json(_redacted(_encode(view), ()))

        async def read(request: Request) -> tuple[str, tuple[ExecutionTrace, ...]]:
            execution_id = request.path_params["execution_id"]
            return execution_id, await collect_trace_tree(opened[0], execution_id)

        async def page(request: Request) -> Response:
            execution_id, traces = await read(request)
            if not traces:
                return _html(_missing(execution_id))
            svg = render_timeline_svg(traces)
            if svg.startswith("<?xml"):
                svg = svg.split("\n", 1)[1]
            values = {
                "title": escape(f"{traces[0].agent_name or traces[0].agent_id} [{execution_id}]"),
                "id": escape(execution_id, {'"': "&quot;"}),
                "svg": svg,
                "trace": escape(render_trace_tree(traces)),
            }
            return _html(_FIELD.sub(lambda match: values[match[1]], timeline))

        async def details(request: Request) -> Response:
            execution_id, traces = await read(request)
            if not traces:
                return _json(_encode({"error": f"no execution {execution_id!r} is stored"}), 404)
            return _json(_redacted(_encode(execution_details(traces)), ()))

        routes = [
            Route("/", index),
            Route("/api/executions", executions),
            Route("/executions/{execution_id}", page),
            Route("/api/executions/{execution_id}", details),
        ]
        return Starlette(routes=routes, lifespan=_lifespan(started, open_store))

    async def __aenter__(self) -> StoredUI:
        await self._enter()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class StoredList(msgspec.Struct, frozen=True, kw_only=True):
    """The body of ``GET /api/executions``: the store's path and its executions."""

    store: str
    executions: tuple[ExecutionSummary, ...]


#: A field of a page's template, ``{{name}}``: filled in one pass, so that nothing
#: filled in is read again as a field.
_FIELD = re.compile(r"\{\{(title|id|svg|trace)\}\}")


def _missing(execution_id: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>not stored'
        f"</title></head><body><p>No execution {escape(repr(execution_id))} is stored."
        "</p></body></html>"
    )


def serve_stored(
    path: str | os.PathLike[str],
    *,
    port: int = 0,
    announce: Callable[[str], None] | None = None,
) -> StoredUI:
    """The executions of the SQLite store at ``path`` as pages on
    ``http://127.0.0.1:<port>``, as ``async with serve_stored(path) as ui:``; its URL
    with the token is said once on stderr (or to ``announce``). ``FileNotFoundError``
    on entering for a missing file, ``StoreError`` for one that is no store."""
    return StoredUI(path, port=port, announce=announce)


# -- a tool's concurrency sweep ----------------------------------------------------------


class SweepView(msgspec.Struct, frozen=True, kw_only=True):
    """What the sweep's page shows: the levels measured so far, their chart, the knee."""

    tool: str
    calls: int
    levels: tuple[int, ...]
    measured: tuple[SweepLevel, ...]
    knee: int | None
    finished: bool
    svg: str


class SweepUI(_Served):
    """A tool's sweep served as it runs (``serve_sweep``): an async context manager.

    The sweep (on the caller's loop) reports each call (``called``) and each level
    measured (``measured``); ``GET /api/sweep`` gives the chart of the levels so far
    (``render_sweep_svg``), the knee among them and the progress of the level being
    measured, which ``GET /`` draws and redraws as it grows.
    """

    def __init__(
        self,
        tool: str,
        levels: Sequence[int],
        *,
        calls: int,
        port: int = 0,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(port=port, announce=announce)
        self.tool = tool
        self.levels = tuple(levels)
        self.calls = calls
        self._measured: tuple[SweepLevel, ...] = ()
        #: The level being measured and its calls done: one tuple, replaced whole.
        self._progress: tuple[int, int] = (self.levels[0] if self.levels else 0, 0)
        self._payload = b""
        self._publish(finished=False)

    def called(self, concurrency: int, done: int) -> None:
        """A call of the level ``concurrency`` ended, ``done`` of them so far."""
        self._progress = (concurrency, done)

    def measured(self, level: SweepLevel) -> None:
        """A level was measured: the chart grows by one point."""
        self._measured = (*self._measured, level)
        self._publish(finished=False)

    def finish(self, report: SweepReport) -> None:
        """The sweep ended: its report, as the command prints it."""
        self.tool = report.tool
        self._measured = report.levels
        self._publish(finished=True)

    def view(self) -> SweepView:
        return msgspec.json.decode(self._payload, type=SweepView)

    def _publish(self, *, finished: bool) -> None:
        measured = self._measured
        report = SweepReport(tool=self.tool, levels=measured, knee=find_knee(measured))
        svg = render_sweep_svg(report).split("\n", 1)[1] if measured else ""
        view = SweepView(
            tool=self.tool,
            calls=self.calls,
            levels=self.levels,
            measured=measured,
            knee=report.knee,
            finished=finished,
            svg=svg,
        )
        self._payload = _encode(view)

    def _app(self, started: threading.Event) -> ASGIApp:
        from starlette.applications import Starlette
        from starlette.routing import Route

        page = _asset("sweep.html")

        async def index(request: Request) -> Response:
            return _html(page)

        async def state(request: Request) -> Response:
            concurrency, done = self._progress
            progress = _encode({"concurrency": concurrency, "done": done})
            return _json(b'{"progress":' + progress + b',"view":' + self._payload + b"}")

        routes = [Route("/", index), Route("/api/sweep", state)]
        return Starlette(routes=routes, lifespan=_lifespan(started))

    async def __aenter__(self) -> SweepUI:
        await self._enter()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def serve_sweep(
    tool: str,
    levels: Sequence[int],
    *,
    calls: int,
    port: int = 0,
    announce: Callable[[str], None] | None = None,
) -> SweepUI:
    """A page on ``http://127.0.0.1:<port>`` whose chart grows as ``sweep(...,
    on_call=ui.called, on_level=ui.measured)`` measures each level; ``ui.finish(report)``
    at the end. Its URL with the token is said once (stderr, or ``announce``)."""
    return SweepUI(tool, levels, calls=calls, port=port, announce=announce)


def serve_ui(
    rt: Runtime,
    *,
    port: int = 0,
    interval: float = INTERVAL,
    secrets: Iterable[str] = (),
    announce: Callable[[str], None] | None = None,
) -> UI:
    """A web view of ``rt``'s live tree on ``http://127.0.0.1:<port>`` (0: a free
    port), as ``async with serve_ui(rt) as ui:``. Its URL with the token is printed
    once to stderr (or given to ``announce``); ``secrets`` are masked in every view."""
    return UI(rt, port=port, interval=interval, secrets=secrets, announce=announce)
