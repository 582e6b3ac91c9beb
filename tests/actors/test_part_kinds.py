"""Every kind of media part (``MEDIA_KINDS``) through every consumer of parts.

A kind is one class (``actors/_parts.py``); each test here takes every kind, so a new
kind without a sample, or one a consumer does not handle, fails: made from its bytes
(its facts read, cut bytes refused), labelled or not, from a file; described and
estimated; at the door of a task and a tool's result, named in a subagent's task;
stored and sent to a host without its bytes and given them back; on each provider's
wire (sent, or refused before anything is sent, saying why); as MCP content both
ways; and from the command line.
"""

from __future__ import annotations

import base64
import pathlib
from typing import Any

import msgspec
import pytest
from mcp import types

from fractor.actors import (
    Audio,
    ContentLimits,
    Document,
    Image,
    ModelRequest,
    ProviderError,
    UserMessage,
    describe_part,
)
from fractor.actors._blobs import attach_parts, detach_parts
from fractor.actors._parts import (
    MEDIA_KINDS,
    ContentError,
    Media,
    MediaPart,
    named_parts,
    part_from_bytes,
    part_from_file,
    part_tokens,
    sniff,
    split_content,
)
from fractor.actors.cli._run import load_parts
from fractor.actors.integrations.mcp import _content
from fractor.actors.integrations.mcp_serve import part_content
from fractor.actors.providers import _content as wire_content

from .loopback import LoopbackServer, json_reply
from .parts_data import mp3, pdf, png, wav
from .providers.wires import ANTHROPIC, OPENAI, Wire

#: Whole bytes of each kind, its media type, and what its header says.
SAMPLES: dict[str, tuple[bytes, str, dict[str, Any]]] = {
    "image": (png(4, 3), "image/png", {"width": 4, "height": 3}),
    "document": (pdf(2), "application/pdf", {"pages": 2}),
    "audio": (wav(0.5), "audio/wav", {"seconds": 0.5}),
}
#: Other media types of a kind, checked the same way.
MORE = [(Audio, mp3(38), "audio/mpeg", {"seconds": pytest.approx(1.0, rel=0.01)})]

KINDS = pytest.mark.parametrize("kind", MEDIA_KINDS, ids=lambda kind: kind.kind)


def sample(kind: type[MediaPart]) -> Media:
    data, media_type, _ = SAMPLES[kind.kind]
    part = kind.from_bytes(data, media_type)
    assert isinstance(part, Image | Document | Audio)
    return part


def test_every_kind_has_a_sample_here() -> None:
    assert set(SAMPLES) == {kind.kind for kind in MEDIA_KINDS}


@KINDS
def test_made_from_its_bytes_it_reads_its_facts_and_refuses_cut_bytes(
    kind: type[MediaPart],
) -> None:
    data, media_type, facts = SAMPLES[kind.kind]
    cases = [(kind, data, media_type, facts)] + [m for m in MORE if m[0] is kind]
    for made, raw, expected, said in cases:
        part = made(data=raw)  # the bytes say what they are
        assert (type(part), part.media_type, part.size) == (made, expected, len(raw))
        assert {name: getattr(part, name) for name in said} == said
        assert sniff(raw) == expected
        assert type(part_from_bytes(raw, "application/octet-stream")) is made
        assert type(part_from_bytes(raw, expected)) is made
        with pytest.raises(ContentError, match=r"not a whole|must be"):
            made(data=raw[: len(raw) // 3])
    other = next(k for k in MEDIA_KINDS if k is not kind)
    with pytest.raises(ContentError, match=f"{kind.kind} must be"):
        kind(data=SAMPLES[other.kind][0])


@KINDS
def test_from_a_file_by_its_bytes(kind: type[MediaPart], tmp_path: pathlib.Path) -> None:
    path = tmp_path / f"thing{next(iter(kind.url_types))}"
    path.write_bytes(SAMPLES[kind.kind][0])
    part = part_from_file(path)
    assert type(part) is kind
    assert part == kind.from_bytes(SAMPLES[kind.kind][0], name=path.name)


@KINDS
def test_described_in_one_line_and_estimated(kind: type[MediaPart]) -> None:
    part = sample(kind)
    line = describe_part(part)
    assert line.startswith(f"[{kind.kind} ")
    assert line.endswith(f", sha256:{part.sha256[:8]}]")
    assert "KB" in line
    assert part_tokens(part) > 0
    by_url = kind(url=f"https://example.com/x{next(iter(kind.url_types))}")
    assert isinstance(by_url, Image | Document | Audio)
    assert describe_part(by_url) == f"[{kind.kind} {by_url.url}]"
    assert by_url.media_type in kind.media_types  # by its extension
    assert part_tokens(by_url) > 0


@KINDS
def test_at_the_door_named_in_a_task_and_within_the_limits(kind: type[MediaPart]) -> None:
    part = sample(kind)
    text, parts = split_content(["look at", part, "this"], "the task")
    assert (text, parts) == ("look at\n\nthis", (part,))
    assert named_parts(f"use sha256:{part.sha256[:12]}", [part]) == (part,)
    with pytest.raises(ContentError, match=r"ContentLimits\.part"):
        ContentLimits(part=part.size - 1).check([part])


@KINDS
def test_stored_and_sent_without_its_bytes_then_given_them_back(kind: type[MediaPart]) -> None:
    part = sample(kind)
    blobs: dict[str, bytes] = {}
    (bare,) = detach_parts((part,), blobs)
    assert bare.data is None
    assert blobs == {part.sha256: part.data}
    # As a store and the hosts' wire carry it: JSON, tagged by its kind.
    message = UserMessage(content="x", parts=(bare,))
    decoded = msgspec.json.decode(msgspec.json.encode(message), type=UserMessage)
    (stored,) = decoded.parts
    assert type(stored) is kind
    assert stored.stored
    assert attach_parts((stored,), blobs) == (part,)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # (the Anthropic SDK's)
@pytest.mark.parametrize("wire", [OPENAI, ANTHROPIC], ids=lambda wire: wire.provider)
@KINDS
async def test_each_wire_sends_it_or_refuses_it_before_anything_is_sent(
    kind: type[MediaPart], wire: Wire, server: LoopbackServer
) -> None:
    part = sample(kind)
    assert kind.kind in wire_content.KINDS
    request = ModelRequest(messages=(UserMessage(content="what is it?", parts=(part,)),))
    refused = wire.provider == "anthropic" and kind is Audio
    if not refused:
        server.queue(json_reply(wire.reply("a thing")))
    async with wire.model(server) as model:
        if refused:
            with pytest.raises(ProviderError, match="takes images and PDFs, no audio") as caught:
                await model.request(request)
            assert caught.value.kind == "content"
            assert server.requests == []
            return
        assert (await model.request(request)).text == "a thing"
    (sent,) = server.requests
    content = sent.json()["messages"][-1]["content"]
    assert content[1] == {"type": "text", "text": describe_part(part)}
    encoded = base64.b64encode(SAMPLES[kind.kind][0]).decode()
    assert encoded in msgspec.json.encode(content[2]).decode()


@KINDS
def test_as_mcp_content_both_ways(kind: type[MediaPart]) -> None:
    part = sample(kind)
    block = part_content(part)  # what fractor's MCP server answers with
    text, parts = _content(types.CallToolResult(content=[block]), ContentLimits())
    assert parts == (part,) or (
        type(parts[0]) is kind and parts[0].data == part.data  # (a name from its URI)
    )
    assert text == ""


@KINDS
def test_from_the_command_line(kind: type[MediaPart], tmp_path: pathlib.Path) -> None:
    path = tmp_path / f"given{next(iter(kind.url_types))}"
    path.write_bytes(SAMPLES[kind.kind][0])
    images, files = ([str(path)], []) if kind is Image else ([], [str(path)])
    (part,) = load_parts(images, files)
    assert type(part) is kind
    assert part.data == SAMPLES[kind.kind][0]
