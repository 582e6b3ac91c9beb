"""MCP servers the tests start, written with the ``mcp`` SDK's own server API.

``python -m tests.integrations.mcp_servers`` serves over stdio; with ``http PORT`` it
serves streamable HTTP on 127.0.0.1:PORT (path ``/mcp``). Each process writes its pid
to the file named by ``$MCP_PID_FILE``, when set, so a test can check it is gone.
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("fractor-tests", log_level="CRITICAL")


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


def main(argv: list[str]) -> None:
    pid_file = os.environ.get("MCP_PID_FILE")
    if pid_file:
        with open(pid_file, "a") as file:
            file.write(f"{os.getpid()}\n")
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
