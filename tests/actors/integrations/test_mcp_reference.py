"""fractor's MCP client against the official reference server,
``@modelcontextprotocol/server-everything`` from npm: installed once (by the module's
fixture, into ``.venv/npm``: fetched from the registry on a fresh clone, then kept),
and started by the test with ``node``, as a user's MCP configuration starts it."""

from __future__ import annotations

import base64
import fcntl
import json
import pathlib
import shutil
import subprocess

import anyio
import pytest

from fractor.actors import (
    Agent,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    call,
    reply,
)
from fractor.actors.integrations.mcp import MCPServer
from fractor.runtime import Runtime

#: The reference server's release the test runs (pinned: its tool names changed
#: between releases, ``getTinyImage`` became ``get-tiny-image``).
EVERYTHING = "@modelcontextprotocol/server-everything@2026.8.31"


#: Where the module installs it: beside the project's virtual environment, so that a
#: second run (and ``make clean``) treats it as the environment's.
PREFIX = pathlib.Path(__file__).resolve().parents[3] / ".venv" / "npm"


@pytest.fixture(scope="module")
def everything() -> MCPServer:
    """The reference server, installed if it is not (one worker at a time: a lock)."""
    npm, node = shutil.which("npm"), shutil.which("node")
    assert npm is not None, "npm (Node.js) installs the MCP reference server"
    assert node is not None, "Node.js starts the MCP reference server"
    name, _, version = EVERYTHING.rpartition("@")
    package = PREFIX / "node_modules" / name
    PREFIX.mkdir(parents=True, exist_ok=True)
    with (PREFIX / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = package / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text())["version"] != version:
            command = [npm, "install", "--prefix", str(PREFIX), "--no-save", "--no-audit"]
            subprocess.run([*command, "--no-fund", EVERYTHING], check=True, timeout=600)
    bin_ = json.loads(manifest.read_text())["bin"]
    script = bin_ if isinstance(bin_, str) else next(iter(bin_.values()))
    return MCPServer.stdio(node, [str(package / script), "stdio"])


async def test_the_reference_servers_tiny_image_reaches_the_model_as_an_image(
    everything: MCPServer,
) -> None:
    """``get-tiny-image`` through fractor's MCP client: the model's next request holds
    the tool result with the server's PNG as an Image part, its bytes exactly the
    base64 the server sent (read here with the SDK's own client), its text around it;
    a blob resource of a text type is read as text, resource links are named."""
    server = everything
    with anyio.fail_after(120):
        async with server.connect() as session:
            raw = await session.call_tool("get-tiny-image", {})
    (sent,) = [block for block in raw.content if block.type == "image"]
    assert sent.mime_type == "image/png"
    png = base64.b64decode(sent.data)

    seen: list[ToolResultMessage] = []

    def model(request: ModelRequest) -> ModelResponse:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if not results:
            return call("get-tiny-image")
        if len(results) == 1:
            return call("get-resource-reference", resourceType="Blob", resourceId=2)
        if len(results) == 2:
            return call("get-resource-links", count=2)
        seen.extend(results)
        return reply("a logo")

    tools = server.tools(include=["get-tiny-image", "get-resource-reference", "get-resource-links"])
    with anyio.fail_after(120):
        async with Runtime() as rt:
            agent = Agent("looker", FunctionModel(model), tools=[tools])
            result = await (await rt.spawn(agent)).ask("What is in the image?")
    assert result.ok, result.stop_reason
    image_result, blob_result, links_result = seen
    (image,) = image_result.parts
    assert isinstance(image, Image)
    assert image.media_type == "image/png"
    assert image.data == png
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert (image.width, image.height) == (20, 20)
    assert image_result.content.splitlines() == [
        "Here's the image you requested:",
        "The image above is the MCP logo.",
    ]
    assert blob_result.parts == ()
    header, text = blob_result.content.splitlines()[1:3]
    assert header == "[text/plain resource demo://resource/dynamic/blob/2]"
    assert text.startswith("Resource 2: This is a base64 blob")
    assert links_result.parts == ()
    links = [line for line in links_result.content.splitlines() if line.startswith("[a link")]
    assert links == [
        "[a link to the resource 'Blob Resource 1': demo://resource/dynamic/blob/1, "
        "text/plain; not fetched]",
        "[a link to the resource 'Text Resource 2': demo://resource/dynamic/text/2, "
        "text/plain; not fetched]",
    ]
