"""Images and documents through the tree: asks, tool results, subagents, budgets."""

from __future__ import annotations

import msgspec
import pytest

from fractor.actors import (
    Agent,
    ContentError,
    ContentLimits,
    Document,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    Part,
    ScriptedModel,
    Text,
    ToolResultMessage,
    UserMessage,
    call,
    calls,
    estimate_tokens,
    reply,
    tool,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Budget, Runtime

from .parts_data import big_png, pdf, png

SHOT = Image(data=png(1000, 1000))


@tool
async def screenshot(page: str) -> list[str | Image]:
    """Take a screenshot of a page."""
    return [f"the {page} page", SHOT]


def data_of(part: Part) -> bytes | None:
    assert isinstance(part, Image | Document)
    return part.data


def tool_results(request: ModelRequest) -> list[ToolResultMessage]:
    return [m for m in request.messages if isinstance(m, ToolResultMessage)]


async def test_a_tool_returning_an_image_reaches_the_model_in_its_tool_result() -> None:
    model = ScriptedModel([call("screenshot", page="home"), reply("A red square.")])
    agent = Agent("looker", model, tools=[screenshot])
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("What does the home page show?")
    assert result.text == "A red square."
    (message,) = tool_results(model.requests[1])
    assert message.content == "the home page"
    assert message.parts == (SHOT,)
    assert data_of(message.parts[0]) is SHOT.data  # the same bytes object, not a copy


async def test_the_trace_keeps_a_tool_results_parts() -> None:
    model = ScriptedModel([call("screenshot", page="home"), reply("ok")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("looker", model, tools=[screenshot]))
        await ref.ask("look")
        (trace,) = await ref.trace()
    assert trace.steps[0].outcomes[0].parts == (SHOT,)


async def test_a_tool_may_return_one_part_or_text_and_parts() -> None:
    document = Document(data=pdf(pages=2))

    @tool
    async def fetch() -> Document:
        """Fetch the report."""
        return document

    @tool
    async def both() -> tuple[Text, Image]:
        """Both kinds."""
        return (Text(text="see"), SHOT)

    model = ScriptedModel([calls(call("fetch"), call("both")), reply("done")])
    async with Runtime() as rt:
        await (await rt.spawn(Agent("reader", model, tools=[fetch, both]))).ask("read it")
    first, second = tool_results(model.requests[1])
    assert (first.content, first.parts) == ("", (document,))
    assert (second.content, second.parts) == ("see", (SHOT,))


async def test_a_tool_result_over_the_part_limit_is_an_error_result() -> None:
    @tool
    async def huge() -> Image:
        """Too large."""
        return Image(data=big_png(21_000_000))

    model = ScriptedModel([call("huge"), reply("no")])
    async with Runtime() as rt:
        await (await rt.spawn(Agent("a", model, tools=[huge]))).ask("go")
    (message,) = tool_results(model.requests[1])
    assert message.is_error
    assert "more than the 20 MB a part may have" in message.content
    assert message.parts == ()


async def test_ask_with_an_image_and_a_document() -> None:
    document = Document(data=pdf(pages=1))
    model = ScriptedModel([reply("Seen.")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("viewer", model))
        result = await ref.ask(["What is in this?", SHOT, "and this", document])
        conversation = await ref.conversation()
        (trace,) = await ref.trace()
    assert result.ok
    (user,) = [m for m in model.requests[0].messages if isinstance(m, UserMessage)]
    assert user.content == "What is in this?\n\nand this"
    assert user.parts == (SHOT, document)
    assert data_of(user.parts[0]) is SHOT.data
    assert conversation.messages[0] == user
    assert trace.task_parts == (SHOT, document)


async def test_ask_refuses_parts_over_the_agents_limits_before_the_agent_sees_them() -> None:
    model = ScriptedModel([reply("never")])
    agent = Agent("small", model, content_limits=ContentLimits(part=1_000, request=2_000))
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        with pytest.raises(ContentError, match="more than the 1 KB a part may have"):
            await ref.ask(["look", Image(data=big_png(5_000))])
        small = [Image(data=big_png(900, width=w)) for w in (1, 2, 3)]
        with pytest.raises(ContentError, match="a request may carry"):
            await ref.ask(["look", *small])
        with pytest.raises(TypeError, match="mixes str and parts"):
            await ref.ask(["look", b"raw bytes"])  # type: ignore[list-item]
        conversation = await ref.conversation()
    assert conversation.messages == ()
    assert len(model.requests) == 0


async def test_a_subagent_returns_an_image_to_its_parent() -> None:
    def draw(request: ModelRequest) -> ModelResponse:
        return ModelResponse(text="Here is the chart.", parts=(SHOT,))

    artist = Agent("artist", FunctionModel(draw), description="Draws charts.")
    lead_model = ScriptedModel([call("artist", task="draw the sales chart"), reply("Done.")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("lead", lead_model, subagents=[artist]))
        result = await ref.ask("Make a chart.")
        (trace,) = await ref.trace()
    assert result.ok
    (message,) = tool_results(lead_model.requests[1])
    assert message.content == "Here is the chart."
    assert data_of(message.parts[0]) is SHOT.data
    assert trace.steps[0].outcomes[0].parts == (SHOT,)


async def test_an_agents_result_carries_the_parts_of_its_answer() -> None:
    model = FunctionModel(lambda request: ModelResponse(text="", parts=(SHOT,)))
    async with Runtime() as rt:
        result = await (await rt.spawn(Agent("artist", model))).ask("draw")
    assert result.ok
    assert result.parts == (SHOT,)
    assert data_of(result.parts[0]) is SHOT.data


async def test_one_image_reaches_100_subagents_without_a_copy() -> None:
    image = Image(data=big_png(500_000, width=1024, height=768))
    tag = f"sha256:{image.sha256[:8]}"
    seen: list[ModelRequest] = []

    def worker(request: ModelRequest) -> Turn:
        seen.append(request)
        return reply("a picture")

    workers = Agent("worker", FunctionModel(worker), description="Looks at an image.")
    lead_model = ScriptedModel(
        [
            calls(*(call("worker", task=f"Describe part {i} of {tag}.") for i in range(100))),
            reply("All described."),
        ]
    )
    lead = Agent("lead", lead_model, subagents=[workers], tool_concurrency=100)
    async with Runtime() as rt:
        result = await (await rt.spawn(lead)).ask(["Split the work on this image.", image])
    assert result.ok
    assert len(seen) == 100
    for request in seen:
        (user,) = [m for m in request.messages if isinstance(m, UserMessage)]
        assert user.parts == (image,)
        assert data_of(user.parts[0]) is image.data  # one bytes object in 100 requests


async def test_a_subagent_call_naming_no_part_hands_none_down() -> None:
    seen: list[ModelRequest] = []

    def worker(request: ModelRequest) -> Turn:
        seen.append(request)
        return reply("ok")

    lead_model = ScriptedModel([call("worker", task="plain text"), reply("done")])
    lead = Agent("lead", lead_model, subagents=[Agent("worker", FunctionModel(worker))])
    async with Runtime() as rt:
        await (await rt.spawn(lead)).ask(["look", SHOT])
    (user,) = [m for m in seen[0].messages if isinstance(m, UserMessage)]
    assert user.parts == ()


def test_the_estimate_counts_images_and_pages() -> None:
    text_only = ModelRequest(messages=(UserMessage(content="hello"),))
    with_image = ModelRequest(messages=(UserMessage(content="hello", parts=(SHOT,)),))
    with_pdf = ModelRequest(
        messages=(UserMessage(content="hello", parts=(Document(data=pdf(pages=4)),)),)
    )
    assert estimate_tokens(with_image) == estimate_tokens(text_only) + 1334
    assert estimate_tokens(with_pdf) == estimate_tokens(text_only) + 6_000


async def test_a_budget_refusal_counts_the_image_in_what_the_request_needs() -> None:
    model = ScriptedModel([reply("never")])
    agent = Agent("viewer", model, budget=Budget(tokens=1_000))
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask(["What is this?", SHOT])
    assert result.status == "budget_exceeded"
    assert "needs about" in result.stop_reason
    need = int(result.stop_reason.split("needs about ")[1].split(" ")[0].replace(",", ""))
    assert need >= 1334  # the image's tokens (1000x1000 / 750) are in it
    assert len(model.requests) == 0
    async with Runtime() as rt:  # the same text alone fits
        assert (await (await rt.spawn(agent)).ask("What is this?")).ok


def test_text_only_messages_encode_as_before() -> None:
    user = UserMessage(content="hi")
    assert msgspec.json.encode(user) == b'{"type":"user","content":"hi"}'
    with_parts = UserMessage(content="hi", parts=(SHOT,))
    back = msgspec.json.decode(msgspec.json.encode(with_parts), type=UserMessage)
    assert back == with_parts
    result = ToolResultMessage(call_id="c", name="t", content="x")
    assert msgspec.json.decode(msgspec.json.encode(result), type=ToolResultMessage) == result


async def test_tool_results_past_the_request_limit_leave_their_parts_out() -> None:
    first, second = Image(data=big_png(3_000, width=1)), Image(data=big_png(3_000, width=2))
    shots = iter([first, second])

    @tool
    async def snap() -> list[str | Image]:
        """A picture."""
        return ["a picture", next(shots)]

    model = ScriptedModel([call("snap"), call("snap"), reply("done")])
    limits = ContentLimits(part=4_000, request=5_000)
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[snap], content_limits=limits))
        assert (await ref.ask("Take two.")).ok
    kept, dropped = tool_results(model.requests[2])
    assert kept.parts == (first,)
    assert dropped.parts == ()
    assert dropped.content.startswith("a picture\n[left out: [image 2x768 png, 3 KB, sha256:")
    assert "carry 6 KB of images and documents, more than the 5 KB allowed" in dropped.content
    assert "(content_limits.request)" in dropped.content


async def test_a_subagents_own_content_limits_apply_to_the_parts_handed_to_it() -> None:
    # A child that takes parts of at most 1 MB is handed a 5 MB image by name: the
    # call is refused before the child starts, saying which limit; its model sees
    # nothing. A part within its limits is handed as before.
    image = Image(data=big_png(5_000_000))
    small = Image(data=big_png(500_000, width=2))
    seen: list[ModelRequest] = []

    def worker(request: ModelRequest) -> Turn:
        seen.append(request)
        return reply("a picture")

    child = Agent(
        "worker",
        FunctionModel(worker),
        description="Looks at an image.",
        content_limits=ContentLimits(part=1_000_000),
    )
    lead_model = ScriptedModel(
        [
            calls(
                call("worker", task=f"Describe sha256:{image.sha256[:12]}."),
                call("worker", task=f"Describe sha256:{small.sha256[:12]}."),
            ),
            reply("done"),
        ]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("lead", lead_model, subagents=[child]))
        result = await ref.ask(["Describe these.", image, small])
    assert result.ok
    refused, handed = tool_results(lead_model.requests[1])
    assert refused.is_error
    assert refused.content.startswith("subagent 'worker' not started: [image 1024x768 png, 5.0 MB")
    assert "more than the 1.0 MB a part may have (ContentLimits.part)" in refused.content
    assert (handed.is_error, handed.content) == (False, "a picture")
    (request,) = seen
    (user,) = [m for m in request.messages if isinstance(m, UserMessage)]
    assert user.parts == (small,)
