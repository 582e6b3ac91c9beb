"""A hand-written MCP server over stdio whose tool answers a malformed result.

The ``mcp`` SDK's server API cannot be made to send a reply that breaks the protocol:
this one speaks JSON-RPC by hand, just enough to be listed and called.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def answer(request: dict[str, Any]) -> dict[str, Any] | None:
    method = request.get("method")
    if "id" not in request:
        return None  # a notification
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
    if method == "initialize":
        reply["result"] = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "0"},
        }
    elif method == "tools/list":
        schema = {"type": "object", "properties": {}}
        reply["result"] = {
            "tools": [{"name": "broken", "description": "Answers garbage.", "inputSchema": schema}]
        }
    elif method == "tools/call":
        reply["result"] = {"content": "not a list of content blocks", "isError": 7}
    else:
        reply["error"] = {"code": -32601, "message": f"no method {method!r}"}
    return reply


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
