"""Images and documents on the wire: both providers against a loopback server on
127.0.0.1, streamed and not, each request's JSON checked as its API requires.

OpenAI chat completions: a user turn's content becomes an array of ``text``,
``image_url`` and ``file`` parts; a tool message takes text only, so a tool result's
parts follow the step's tool messages in one user message. Anthropic Messages: a
user turn's ``image`` and ``document`` blocks, and the same blocks inside a
``tool_result``. Each part is named by a text block just before it (``describe_part``).
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import pytest

from fractor.actors import (
    Agent,
    AssistantMessage,
    Document,
    FallbackModel,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    ProviderError,
    ReActModel,
    RetryPolicy,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    describe_part,
    tool,
)
from fractor.actors._parts import anthropic_image_tokens, openai_image_tokens
from fractor.actors.providers import _content
from fractor.runtime import Budget, Runtime

from ..loopback import LoopbackServer, Reply, json_reply, sse_reply
from ..parts_data import pdf, png
from .test_anthropic_stream import streamed as anthropic_events
from .wires import Provider, Wire, completion, message, text, tool_use, wire_call

SHOT = Image(data=png(1000, 1000))
SMALL = Image(data=png(4, 3, fill=7))
REPORT = Document(data=pdf(pages=2), name="report.pdf")
WEB = Image.from_url("https://example.com/chart.png")
WEB_PDF = Document.from_url("https://example.com/paper.pdf")
STORED = Image(media_type="image/png", sha256="ab" * 32, size=1_000, width=10, height=10)

STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])


def b64(data: bytes | None) -> str:
    assert data is not None
    return base64.b64encode(data).decode("ascii")


def named(part: Image | Document) -> dict[str, Any]:
    return {"type": "text", "text": describe_part(part)}


# -- what each wire format must send ---------------------------------------------------


def openai_part(part: Image | Document) -> dict[str, Any]:
    if type(part) is Image:
        url = part.url or f"data:{part.media_type};base64,{b64(part.data)}"
        return {"type": "image_url", "image_url": {"url": url}}
    assert type(part) is Document
    data = f"data:application/pdf;base64,{b64(part.data)}"
    return {"type": "file", "file": {"filename": part.name, "file_data": data}}


def anthropic_part(part: Image | Document) -> dict[str, Any]:
    kind = "image" if type(part) is Image else "document"
    if part.url:
        return {"type": kind, "source": {"type": "url", "url": part.url}}
    source = {"type": "base64", "media_type": part.media_type, "data": b64(part.data)}
    return {"type": kind, "source": source}


def openai_blocks(*media: Image | Document) -> list[dict[str, Any]]:
    return [block for part in media for block in (named(part), openai_part(part))]


def anthropic_blocks(*media: Image | Document) -> list[dict[str, Any]]:
    return [block for part in media for block in (named(part), anthropic_part(part))]


# -- what the server answers -----------------------------------------------------------


def final(wire: Wire, value: str, streamed: bool) -> Reply:
    if not streamed:
        return json_reply(wire.reply(value))
    if wire.provider == "openai":
        return openai_stream({"content": value}, "stop")
    return sse_reply(anthropic_events(message(text(value))))


def calls_tool(wire: Wire, call_id: str, name: str, arguments: str, streamed: bool) -> Reply:
    if wire.provider == "openai":
        if not streamed:
            return json_reply(completion(None, (wire_call(call_id, name, arguments),)))
        fragment = {"index": 0, **wire_call(call_id, name, arguments)}
        return openai_stream({"tool_calls": [fragment]}, "tool_calls")
    whole = message(tool_use(call_id, name, msgspec.json.decode(arguments)))
    return sse_reply(anthropic_events(whole)) if streamed else json_reply(whole)


def openai_stream(delta: dict[str, Any], finish: str) -> Reply:
    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        body: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 1}
        body |= {"model": "test-model", "choices": choices}
        if delta is None:
            body["usage"] = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        return body

    events = [chunk({"role": "assistant"}), chunk(delta), chunk({}, finish), chunk(None)]
    return sse_reply(events, done=True)


async def send(model: Provider, request: ModelRequest, streamed: bool) -> ModelResponse:
    if streamed:
        return await model.stream(request, lambda piece: None)
    return await model.request(request)


# -- user turns ------------------------------------------------------------------------


@STREAMED
async def test_a_user_turn_sends_images_and_a_pdf_as_the_api_expects(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    media: tuple[Image | Document, ...] = (SMALL, WEB, REPORT)
    if wire.provider == "anthropic":
        media += (WEB_PDF,)  # the Messages API takes a PDF by URL too
    request = ModelRequest(messages=(UserMessage(content="What do these show?", parts=media),))
    server.queue(final(wire, "A chart.", streamed))
    async with wire.model(server) as model:
        response = await send(model, request, streamed)
    assert response.text == "A chart."
    body = server.requests[0].json()
    assert bool(body.get("stream")) is streamed
    question = {"type": "text", "text": "What do these show?"}
    if wire.provider == "openai":
        expected = [question, *openai_blocks(*media)]
        assert body["messages"] == [{"role": "user", "content": expected}]
        assert expected[2]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
        assert expected[-1]["file"]["file_data"].startswith("data:application/pdf;base64,JVBER")
    else:
        expected = [question, *anthropic_blocks(*media)]
        assert body["messages"] == [{"role": "user", "content": expected}]
        assert expected[2]["source"]["media_type"] == "image/png"
        assert expected[6]["source"] == {
            "type": "base64",
            "media_type": "application/pdf",
            "data": b64(REPORT.data),
        }


@STREAMED
async def test_a_data_url_and_a_turn_with_no_text(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    url = f"data:image/png;base64,{b64(SMALL.data)}"
    image = Image.from_url(url)
    request = ModelRequest(messages=(UserMessage(content="", parts=(image,)),))
    server.queue(final(wire, "ok", streamed))
    async with wire.model(server) as model:
        await send(model, request, streamed)
    (turn,) = server.requests[0].json()["messages"]
    if wire.provider == "openai":  # sent as the URL it is; no empty text part
        assert turn["content"] == [named(image), openai_part(image)]
        assert turn["content"][1]["image_url"]["url"] == url
    else:  # the Messages API takes no data: URL: its base64 source
        source = {"type": "base64", "media_type": "image/png", "data": b64(SMALL.data)}
        assert turn["content"] == [named(image), {"type": "image", "source": source}]


@STREAMED
async def test_text_only_requests_are_sent_as_before(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    request = ModelRequest(
        messages=(
            UserMessage(content="Add them."),
            AssistantMessage(content="", tool_calls=(ToolCall(id="c1", name="add"),)),
            ToolResultMessage(call_id="c1", name="add", content="3"),
        )
    )
    server.queue(final(wire, "3", streamed))
    async with wire.model(server) as model:
        await send(model, request, streamed)
    sent = server.requests[0].json()["messages"]
    if wire.provider == "openai":
        assert sent[0] == {"role": "user", "content": "Add them."}  # a plain string
        assert sent[2] == {"role": "tool", "tool_call_id": "c1", "content": "3"}
        assert len(sent) == 3  # no attachments message
    else:
        assert sent[0] == {"role": "user", "content": [{"type": "text", "text": "Add them."}]}
        assert sent[2] == {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "3"}],
        }


# -- tool results ----------------------------------------------------------------------


def step_with_parts() -> ModelRequest:
    """A step of two parallel calls: the first returned text and an image and a PDF,
    the second text only."""
    calls = (ToolCall(id="call_a", name="shoot"), ToolCall(id="call_b", name="count"))
    return ModelRequest(
        messages=(
            UserMessage(content="Check the page."),
            AssistantMessage(content="", tool_calls=calls),
            ToolResultMessage(
                call_id="call_a", name="shoot", content="the home page", parts=(SMALL, REPORT)
            ),
            ToolResultMessage(call_id="call_b", name="count", content="3 links"),
        )
    )


@STREAMED
async def test_a_tool_results_parts_go_where_each_api_allows(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    server.queue(final(wire, "A page with 3 links.", streamed))
    async with wire.model(server) as model:
        await send(model, step_with_parts(), streamed)
    sent = server.requests[0].json()["messages"]
    if wire.provider == "openai":
        # Tool messages take text only: the parts follow the step's tool messages.
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
        assert sent[2] == {"role": "tool", "tool_call_id": "call_a", "content": "the home page"}
        assert sent[3] == {"role": "tool", "tool_call_id": "call_b", "content": "3 links"}
        assert sent[4] == {
            "role": "user",
            "content": [
                {"type": "text", "text": "Attached to the tool results above:"},
                {"type": "text", "text": "From call call_a (shoot):"},
                *openai_blocks(SMALL, REPORT),
            ],
        }
    else:
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert sent[2]["content"] == [
            {
                "type": "tool_result",
                "tool_use_id": "call_a",
                "content": [
                    {"type": "text", "text": "the home page"},
                    *anthropic_blocks(SMALL, REPORT),
                ],
            },
            {"type": "tool_result", "tool_use_id": "call_b", "content": "3 links"},
        ]


async def test_the_base64_of_a_part_is_made_once_per_request(
    server: LoopbackServer, wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded: list[int] = []
    real = base64.b64encode

    def counting(data: bytes) -> bytes:
        encoded.append(len(data))
        return real(data)

    monkeypatch.setattr(base64, "b64encode", counting)  # the module _content calls
    before = msgspec.structs.asdict(SMALL)
    request = ModelRequest(
        messages=(
            UserMessage(content="first", parts=(SMALL,)),
            AssistantMessage(content="", tool_calls=(ToolCall(id="c1", name="shoot"),)),
            ToolResultMessage(call_id="c1", name="shoot", content="again", parts=(SMALL,)),
            UserMessage(content="and once more", parts=(SMALL, REPORT)),
        )
    )
    server.queue(final(wire, "ok", False), final(wire, "ok", True))
    async with wire.model(server) as model:
        await send(model, request, False)
        assert encoded == [SMALL.size, REPORT.size]  # three turns carry SMALL: once
        await send(model, request, True)
    assert encoded == [SMALL.size, REPORT.size] * 2  # once per request built
    assert msgspec.structs.asdict(SMALL) == before  # nothing stored back in the part
    assert SMALL.data == png(4, 3, fill=7)


@tool
async def screenshot(page: str) -> list[str | Image]:
    """Take a screenshot of a page."""
    return [f"the {page} page", SHOT]


@STREAMED
async def test_a_tool_returning_an_image_reaches_the_server(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    server.queue(
        calls_tool(wire, "call_1", "screenshot", '{"page": "home"}', streamed),
        final(wire, "A red square.", streamed),
    )
    async with wire.model(server, stream=streamed) as model, Runtime() as rt:
        ref = await rt.spawn(Agent("looker", model, tools=[screenshot]))
        result = await ref.ask("What does the home page show?")
    assert result.ok, result.stop_reason
    assert result.text == "A red square."
    sent = server.requests[1].json()["messages"]
    if wire.provider == "openai":
        assert sent[-2] == {"role": "tool", "tool_call_id": "call_1", "content": "the home page"}
        assert sent[-1]["content"][1:] == [
            {"type": "text", "text": "From call call_1 (screenshot):"},
            *openai_blocks(SHOT),
        ]
    else:
        (result_block,) = sent[-1]["content"]
        assert result_block == {
            "type": "tool_result",
            "tool_use_id": "call_1",
            "content": [{"type": "text", "text": "the home page"}, *anthropic_blocks(SHOT)],
        }


@STREAMED
async def test_a_subagent_returning_an_image_reaches_its_parents_next_request(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    def draw(request: ModelRequest) -> ModelResponse:
        return ModelResponse(text="Here is the chart.", parts=(SHOT,))

    artist = Agent("artist", FunctionModel(draw), description="Draws charts.")
    server.queue(
        calls_tool(wire, "call_1", "artist", '{"task": "draw the sales chart"}', streamed),
        final(wire, "Done.", streamed),
    )
    async with wire.model(server, stream=streamed) as model, Runtime() as rt:
        ref = await rt.spawn(Agent("lead", model, subagents=[artist]))
        result = await ref.ask("Make a chart.")
    assert result.ok, result.stop_reason
    sent = server.requests[1].json()["messages"]
    if wire.provider == "openai":
        assert sent[-2]["role"] == "tool"
        assert sent[-1]["content"][1:] == [
            {"type": "text", "text": "From call call_1 (artist):"},
            *openai_blocks(SHOT),
        ]
    else:
        (result_block,) = sent[-1]["content"]
        assert result_block["content"] == [
            {"type": "text", "text": "Here is the chart."},
            *anthropic_blocks(SHOT),
        ]


async def test_react_observations_carry_the_tools_image(server: LoopbackServer, wire: Wire) -> None:
    action = '{"thought": "look", "actions": [{"tool": "screenshot", "arguments": {"page": "a"}}]}'
    server.queue(final(wire, action, False), final(wire, '{"final": "A red square."}', False))
    async with wire.model(server, stream=False) as inner:
        model = ReActModel(inner)
        async with Runtime() as rt:
            ref = await rt.spawn(Agent("looker", model, tools=[screenshot]))
            result = await ref.ask("What does page a show?")
    assert result.text == "A red square.", result.stop_reason
    last = server.requests[1].json()["messages"][-1]
    observation = {"type": "text", "text": "Observation for call react_1 (screenshot): the a page"}
    assert last["role"] == "user"
    if wire.provider == "openai":
        assert last["content"] == [observation, *openai_blocks(SHOT)]
    else:
        assert last["content"] == [observation, *anthropic_blocks(SHOT)]


# -- refusals, before anything is sent ------------------------------------------------


@STREAMED
async def test_a_part_without_its_bytes_is_refused_before_anything_is_sent(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    assert STORED.stored
    for carrier in (
        UserMessage(content="look", parts=(SMALL, STORED)),
        ToolResultMessage(call_id="c1", name="shoot", content="x", parts=(STORED,)),
    ):
        async with wire.model(server) as model:
            with pytest.raises(ProviderError) as caught:
                await send(model, ModelRequest(messages=(carrier,)), streamed)
        error = caught.value
        assert describe_part(STORED) in str(error)
        assert "no bytes" in str(error)
        assert "load_blobs" in str(error)
        assert error.kind == "content"
        assert not error.retryable
    assert server.requests == []


@STREAMED
async def test_a_kind_the_endpoint_does_not_take_is_refused(
    server: LoopbackServer, wire: Wire, streamed: bool
) -> None:
    async with wire.model(server, accepts=()) as text_only:
        assert text_only.accepts == frozenset()
        request = ModelRequest(messages=(UserMessage(content="look", parts=(SMALL,)),))
        with pytest.raises(ProviderError) as caught:
            await send(text_only, request, streamed)
    assert describe_part(SMALL) in str(caught.value)
    assert "does not take images" in str(caught.value)
    assert "accepts=" in str(caught.value)
    async with wire.model(server, accepts=("image",)) as no_pdf:
        request = ModelRequest(messages=(UserMessage(content="read", parts=(REPORT,)),))
        with pytest.raises(ProviderError) as caught:
            await send(no_pdf, request, streamed)
        assert "does not take documents (it takes images" in str(caught.value)
        assert server.requests == []
        server.queue(final(wire, "a square", streamed))  # an image it takes
        request = ModelRequest(messages=(UserMessage(content="look", parts=(SMALL,)),))
        assert (await send(no_pdf, request, streamed)).text == "a square"


async def test_accepts_names_kinds(wire: Wire) -> None:
    with pytest.raises(ValueError, match="accepts names kinds"):
        wire.model_class("m", api_key="k", accepts=("image", "video"))
    with pytest.raises(TypeError, match="accepts is a collection"):
        wire.model_class("m", api_key="k", accepts="image")
    every = frozenset({"image", "document", "audio"})
    assert wire.model_class("m", api_key="k").accepts == every


@STREAMED
async def test_openai_refuses_a_pdf_given_only_by_its_url(
    server: LoopbackServer, streamed: bool
) -> None:
    from .wires import openai_model

    request = ModelRequest(messages=(UserMessage(content="read", parts=(WEB_PDF,)),))
    async with openai_model(server) as model:
        with pytest.raises(ProviderError) as caught:
            await send(model, request, streamed)
    assert describe_part(WEB_PDF) in str(caught.value)
    assert "no URL form" in str(caught.value)
    assert server.requests == []


# -- estimates and budgets -------------------------------------------------------------


def test_the_estimate_counts_parts_by_each_providers_rule(wire: Wire) -> None:
    model = wire.model_class("m", api_key="k")
    text_only = ModelRequest(messages=(UserMessage(content="hello"),))
    with_image = ModelRequest(messages=(UserMessage(content="hello", parts=(SHOT,)),))
    with_pdf = ModelRequest(messages=(UserMessage(content="hello", parts=(REPORT,)),))
    rule = openai_image_tokens if wire.provider == "openai" else anthropic_image_tokens
    image = rule(1000, 1000)
    assert image == (765 if wire.provider == "openai" else 1334)
    label = _content.PART_LABEL_TOKENS
    assert model.estimate_tokens(with_image) == model.estimate_tokens(text_only) + image + label
    assert model.estimate_tokens(with_pdf) == model.estimate_tokens(text_only) + 3_000 + label
    in_a_result = ModelRequest(
        messages=(ToolResultMessage(call_id="c", name="t", content="hello", parts=(SHOT,)),)
    )
    bare_result = ModelRequest(
        messages=(ToolResultMessage(call_id="c", name="t", content="hello"),)
    )
    assert model.estimate_tokens(in_a_result) == model.estimate_tokens(bare_result) + image + label


async def test_a_budget_refusal_counts_the_image_through_the_provider(
    server: LoopbackServer, wire: Wire
) -> None:
    rule = openai_image_tokens if wire.provider == "openai" else anthropic_image_tokens
    image = rule(1000, 1000)
    async with wire.model(server) as model:
        agent = Agent("viewer", model, budget=Budget(tokens=600))
        async with Runtime() as rt:
            result = await (await rt.spawn(agent)).ask(["What is this?", SHOT])
        assert result.status == "budget_exceeded", result.stop_reason
        need = int(result.stop_reason.split("needs about ")[1].split(" ")[0].replace(",", ""))
        assert need >= image + _content.PART_LABEL_TOKENS  # the image's tokens are in it
        assert server.requests == []  # refused before it was sent
        server.queue(final(wire, "A question.", True))
        async with Runtime() as rt:  # the same text alone fits
            assert (await (await rt.spawn(agent)).ask("What is this?")).ok
    assert len(server.requests) == 1


async def test_an_agent_whose_model_takes_no_images_fails_clearly(
    server: LoopbackServer, wire: Wire
) -> None:
    async with wire.model(server, accepts=()) as model, Runtime() as rt:
        result = await (await rt.spawn(Agent("reader", model))).ask(["What is this?", SMALL])
    assert result.status == "failed"
    assert describe_part(SMALL) in result.stop_reason
    assert "does not take images" in result.stop_reason
    assert server.requests == []  # never sent, not retried


async def test_a_pdf_as_a_data_url_and_a_data_url_that_is_not_base64(
    server: LoopbackServer, wire: Wire
) -> None:
    url = f"data:application/pdf;base64,{b64(REPORT.data)}"
    paper = Document.from_url(url, name="paper.pdf")
    server.queue(final(wire, "ok", False))
    async with wire.model(server) as model:
        await model.request(ModelRequest(messages=(UserMessage(content="", parts=(paper,)),)))
        (turn,) = server.requests[0].json()["messages"]
        if wire.provider == "openai":  # a file part takes the data: URL as it is
            file = {"filename": "paper.pdf", "file_data": url}
            assert turn["content"] == [named(paper), {"type": "file", "file": file}]
        else:
            source = {"type": "base64", "media_type": "application/pdf", "data": b64(REPORT.data)}
            assert turn["content"] == [named(paper), {"type": "document", "source": source}]
        plain = Image.from_url("data:image/png,not-base64")
        request = ModelRequest(messages=(UserMessage(content="x", parts=(plain,)),))
        if wire.provider == "anthropic":  # no form of the Messages API takes it
            with pytest.raises(ProviderError, match="not base64"):
                await model.request(request)
            assert len(server.requests) == 1


async def test_a_text_only_model_hands_an_image_to_the_next_model_of_its_chain(
    server: LoopbackServer, wire: Wire
) -> None:
    # A refused part ("content") is not mended by retrying, and a vision model may
    # take it: a FallbackModel goes to the next model at once.
    seen: list[ModelRequest] = []

    async def vision(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return ModelResponse(text="A small picture.")

    async with wire.model(server, accepts=()) as text_only, Runtime() as rt:
        chain = FallbackModel(text_only, FunctionModel(vision, name="vision"))
        agent = Agent("reader", chain, retry=RetryPolicy(retries=3, initial_delay=0.001))
        result = await (await rt.spawn(agent)).ask(["What is this?", SMALL])
    assert (result.status, result.text) == ("completed", "A small picture.")
    (request,) = seen
    assert request.messages[-1].parts == (SMALL,)  # type: ignore[union-attr]
    assert server.requests == []  # the text-only model sent nothing
