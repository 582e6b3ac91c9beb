"""The web view's server: a page on 127.0.0.1 showing a live runtime's tree.

::

    async with Runtime() as rt, serve_ui(rt) as ui:
        ...  # ui.url, printed once, carries the token every request needs

**Threads and loops.** The runtime runs on anyio, on asyncio or on trio; uvicorn (the
ASGI server, a dependency of ``mcp`` already) runs on asyncio only. So the server
runs in a thread of its own, on its own asyncio event loop, and never touches the
runtime's objects there:

- The runtime's side (a task in the ``UI``'s task group, on the runtime's loop)
  **publishes**: every ``interval`` seconds it reads ``rt.tree()``, what the
  supervisor holds reserved, the events since the last time (the latest streamed
  lines) and the pending approvals, and encodes them once as JSON (a ``TreeView``).
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
without it the answer is 403. The page and its script ship in this package (no CDN).
What the page shows comes from snapshots and events, which carry no secrets (the
providers redact their errors before anything records them); on top of that every
view goes through the same ``redact`` as the providers' errors
(``fractor.actors.providers.redact``): any ``secrets=`` given, and credentials in a
URL, are ``[redacted]``.
"""

from __future__ import annotations

import re
import secrets as _secrets
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import msgspec
from anyio.abc import TaskGroup

from fractor.runtime import Runtime, Subscription, TreeSnapshot

from .._agent._ref import Decide, GetApprovals
from .._messages import safe_text
from .._observation._lines import LatestLines
from .._tools._approval import ApprovalError, ApprovalRequest
from ..providers import redact
from ._view import Held, tree_view

if TYPE_CHECKING:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["UI", "serve_ui"]

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


def _page() -> bytes:
    return resources.files(__package__).joinpath("page.html").read_bytes()


class UI:
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
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port must be a whole number from 0 to 65535, got {port!r}")
        if not isinstance(interval, int | float) or not 0 < interval < 3600:
            raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
        self.rt = rt
        self.interval = float(interval)
        #: The token every request needs.
        self.token = _secrets.token_urlsafe(32)
        #: The port it listens on (the one given, or the one the system chose for 0).
        self.port = port
        #: As they stand in JSON (``redact`` takes out those of 4 characters or more).
        self._secrets = tuple(
            msgspec.json.encode(secret)[1:-1].decode()
            for secret in secrets
            if isinstance(secret, str)
        )
        self._announce = announce
        self._lines = LatestLines()
        self._events: Subscription | None = None
        self._version = 0
        #: The latest view, encoded: replaced whole, read by the server's thread.
        self._payload = b""
        self._stack = AsyncExitStack()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._group: TaskGroup | None = None

    @property
    def url(self) -> str:
        """The page's address, with the token."""
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    # -- the runtime's side --------------------------------------------------------

    def view(self) -> bytes:
        """The latest view published, as the page reads it (JSON)."""
        return self._payload

    def publish(self) -> None:
        """Read the tree, the events since the last view and the approvals, and
        publish a new view (on the runtime's loop; ``interval`` does it on its own)."""
        events = self._events
        if events is not None:
            while (event := events.receive_nowait()) is not None:
                self._lines.feed(event)
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
        self._payload = _redacted(_encode(view), self._secrets)

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

        page = _page()

        async def index(request: Request) -> Response:
            return Response(page, media_type="text/html; charset=utf-8", headers=_NO_STORE)

        async def tree(request: Request) -> Response:
            return Response(self._payload, media_type="application/json", headers=_NO_STORE)

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

        @asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            started.set()
            yield

        app = Starlette(
            routes=[
                Route("/", index),
                Route("/api/tree", tree),
                Route("/api/approvals/{request_id}", approval, methods=["POST"]),
            ],
            lifespan=lifespan,
        )
        return _TokenGate(app, self.token)

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as error:  # reported by __aexit__, never lost in the thread
            self._failure = error
        finally:
            sock.close()

    async def __aenter__(self) -> UI:
        import uvicorn

        async with AsyncExitStack() as stack:
            self._token = anyio.lowlevel.current_token()
            self._events = await stack.enter_async_context(self.rt.events())
            self.publish()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", self.port))
                sock.listen(128)
            except OSError:
                sock.close()
                raise
            self.port = sock.getsockname()[1]
            started = threading.Event()
            config = uvicorn.Config(
                self._app(started),
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
            stack.push_async_callback(self._stop)
            if not await anyio.to_thread.run_sync(started.wait, THREAD_TIMEOUT):
                raise RuntimeError(f"the web view's server did not start: {self._failure!r}")
            self._stack = stack.pop_all()
        # Apart from the stack: the body's exception goes through it as it was raised.
        group = self._group = anyio.create_task_group()
        await group.__aenter__()
        group.start_soon(self._publish_every)
        show = self._announce
        if show is None:
            print(f"fractor web view: {self.url}", file=sys.stderr, flush=True)
        else:
            show(self.url)
        return self

    async def _stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.join, THREAD_TIMEOUT)
        self._server = self._thread = None

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
        finally:
            self._events = None
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


class _TokenGate:
    """Every HTTP request without the token is answered 403."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            from starlette.requests import Request
            from starlette.responses import PlainTextResponse

            request = Request(scope)
            given = request.query_params.get("token") or request.headers.get(TOKEN_HEADER, "")
            if not _secrets.compare_digest(given.encode(), self.token):
                refusal = PlainTextResponse(
                    "403: this page needs the token printed with its URL (?token=...)", 403
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
