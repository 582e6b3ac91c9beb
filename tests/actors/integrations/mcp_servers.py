"""MCP servers the tests start, written with the ``mcp`` SDK's own server API.

``python -m tests.actors.integrations.mcp_servers`` serves over stdio; with ``http PORT`` it
serves streamable HTTP on 127.0.0.1:PORT (path ``/mcp``). Each process writes its pid
to the file named by ``$MCP_PID_FILE``, when set, so a test can check it is gone; an
HTTP server notes each ``DELETE`` it answers (the end of a session) in
``$MCP_MARK_FILE``, with its status.
"""

from __future__ import annotations

import base64
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    Tool,
    ToolExecution,
)

from tests.actors.parts_data import gif, pdf, png, wav

#: The tools listed as needing task augmentation (``execution.taskSupport``).
TASK_ONLY = frozenset({"queued_job"})


class _Server(MCPServer):
    """The SDK's server; the tools in ``TASK_ONLY`` are listed as callable only as
    tasks (the SDK's decorator has no option for it)."""

    async def list_tools(self) -> list[Tool]:
        listed = await super().list_tools()
        required = ToolExecution(task_support="required")
        return [
            tool.model_copy(update={"execution": required}) if tool.name in TASK_ONLY else tool
            for tool in listed
        ]


server = _Server("fractor-tests", log_level="CRITICAL")

#: 12,600 bytes of "image" of no kind: 13 KB.
IMAGE = bytes(range(256)) * 49 + bytes(56)
#: A real 4x3 PNG, a GIF, and a PDF of 2 pages.
PNG = png(4, 3)
GIF = gif(7, 5)
PDF = pdf(2)
WAV = wav(0.25)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """Repeat the text in capitals."""
    return text.upper()


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason given."""
    raise ToolError(f"refused: {reason}")


@server.tool()
async def hang() -> str:
    """Never answers; notes in ``$MCP_MARK_FILE`` that it was cancelled."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        mark = os.environ.get("MCP_MARK_FILE")
        if mark:
            # Cancelled, it cannot await: a line to a file, written at once.
            with open(mark, "a") as file:  # noqa: ASYNC230
                file.write("hang cancelled\n")
        raise
    return "never"


@server.tool()
def crash() -> str:
    """Kills the server process in the middle of the call."""
    os._exit(3)


@server.tool()
def media() -> CallToolResult:
    """Text, images (one true, one whose bytes are not what it says, one of no kind),
    a sound, a text resource, a PDF, a binary resource, an untyped PDF and a link."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    text = TextResourceContents(uri="file:///notes.txt", mime_type="text/plain", text="the notes")
    blob = BlobResourceContents(
        uri="file:///data.bin", mime_type="application/octet-stream", blob=b64(bytes(1500))
    )
    report = BlobResourceContents(
        uri="file:///docs/report.pdf", mime_type="application/pdf", blob=b64(PDF)
    )
    untyped = BlobResourceContents(uri="file:///scan", blob=b64(PDF))
    return CallToolResult(
        content=[
            TextContent(type="text", text="here they are"),
            ImageContent(type="image", data=b64(PNG), mime_type="image/png"),
            ImageContent(type="image", data=b64(GIF), mime_type="image/png"),
            ImageContent(type="image", data=b64(IMAGE), mime_type="image/png"),
            AudioContent(type="audio", data=b64(WAV), mime_type="audio/wav"),
            AudioContent(type="audio", data=b64(bytes(2048)), mime_type="audio/wav"),
            EmbeddedResource(type="resource", resource=text),
            EmbeddedResource(type="resource", resource=report),
            EmbeddedResource(type="resource", resource=blob),
            EmbeddedResource(type="resource", resource=untyped),
            ResourceLink(
                type="resource_link",
                name="report",
                uri="file:///report.pdf",
                mime_type="application/pdf",
                size=5_000,
            ),
        ]
    )


@server.tool()
def read_media_file(path: str) -> CallToolResult:
    """A file as ``server-filesystem`` serves it: a PDF (whatever the path), labelled
    ``application/octet-stream``, the type it gives what it does not know."""
    served = BlobResourceContents(
        uri=f"file://{path}",
        mime_type="application/octet-stream",
        blob=base64.b64encode(PDF).decode(),
    )
    return CallToolResult(content=[EmbeddedResource(type="resource", resource=served)])


@server.tool()
async def slow(steps: int, ctx: Context) -> str:
    """Reports its progress at each of its steps."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step} of {steps}")
    return f"{steps} steps done"


@server.tool()
def whoami(ctx: Context) -> str:
    """The name and version the client gave when it connected."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    return f"{info.name} {info.version}" if info is not None else "anonymous"


@server.tool()
def queued_job() -> str:
    """Listed as callable only as a task (see ``TASK_ONLY``)."""
    return "ran without a task"


def _http_app() -> Any:
    """The SDK's streamable-HTTP app, noting each DELETE it answers in $MCP_MARK_FILE."""
    app = server.streamable_http_app()
    mark = os.environ.get("MCP_MARK_FILE")
    if not mark:
        return app

    async def noted(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "DELETE":
            await app(scope, receive, send)
            return

        async def send_noted(message: Any) -> None:
            if message["type"] == "http.response.start":
                with open(mark, "a") as file:  # noqa: ASYNC230
                    file.write(f"DELETE {message['status']}\n")
            await send(message)

        await app(scope, receive, send_noted)

    return noted


def main(argv: list[str]) -> None:
    pid_file = os.environ.get("MCP_PID_FILE")
    if pid_file:
        with open(pid_file, "a") as file:
            file.write(f"{os.getpid()}\n")
    if argv[:1] == ["http"]:
        import uvicorn

        uvicorn.run(_http_app(), host="127.0.0.1", port=int(argv[1]), log_level="critical")
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
