"""Compaction and digests name images and documents; they never paste their bytes."""

from __future__ import annotations

import base64

from fractor.actors import (
    Agent,
    Compaction,
    Image,
    Message,
    ScriptedModel,
    UserMessage,
    call,
    fail,
    reply,
    tool,
)
from fractor.actors._memory._summarizer import conversation_tokens
from fractor.runtime import Runtime

from ..parts_data import big_png

IMAGE = Image(data=big_png(50_000, width=1000, height=1000))


async def test_a_summary_request_names_the_parts_of_the_turns_it_folds() -> None:
    summarizer = ScriptedModel([reply("They looked at a chart.")], name="small")
    model = ScriptedModel([reply("A chart."), reply("Yes."), reply("Fine.")])
    agent = Agent("a", model, memory=Compaction(threshold=200, keep=1, model=summarizer))
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        assert (await ref.ask(["What is this?", IMAGE])).ok
        assert (await ref.ask("Is it sales?")).ok
        assert (await ref.ask("Thanks.")).ok
    (request,) = summarizer.requests
    text = "\n".join(m.content for m in request.messages)
    assert f"(attached: [image 1000x1000 png, 50 KB, sha256:{IMAGE.sha256[:8]}])" in text
    assert "Attachments are named, not shown" in text
    assert all(not getattr(m, "parts", ()) for m in request.messages)
    assert base64.b64encode(IMAGE.data or b"")[:40].decode() not in text


def test_the_conversation_estimate_counts_a_turns_image() -> None:
    plain: list[Message] = [UserMessage(content="look")]
    with_image: list[Message] = [UserMessage(content="look", parts=(IMAGE,))]
    assert conversation_tokens(with_image) == conversation_tokens(plain) + 1334


async def test_a_digest_of_an_earlier_attempt_names_a_tool_results_image() -> None:
    @tool
    async def snap() -> Image:
        """A picture."""
        return IMAGE

    model = ScriptedModel([call("snap"), fail(RuntimeError("down")), reply("Seen.")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[snap]))
        first = await ref.ask("Look.")
        assert not first.ok
        assert (await ref.ask("Look.", resume=True)).ok
    digest = model.requests[-1].messages
    text = "\n".join(m.content for m in digest)
    assert f"with [image 1000x1000 png, 50 KB, sha256:{IMAGE.sha256[:8]}]" in text
