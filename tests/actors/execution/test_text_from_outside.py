"""Text that comes from outside is made safe once, where it comes in (``safe_text``):
a lone surrogate (half of a UTF-16 pair) in a definition's text (an agent's
instructions and description, a tool's description, a summarizer's instructions)
never reaches a provider's encoder or a store. (A task, a deny reason, a tool's
result, a model's reply: see test_persistence.py and test_approvals.py.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from fractor.actors import (
    Agent,
    Compaction,
    FunctionModel,
    ModelRequest,
    call,
    reply,
    tool,
)
from fractor.actors._models._turns import Turn
from fractor.runtime import Runtime, SQLiteStore

HALF = "\ud800"
SAFE = "\ufffd"


def on_the_wire(answer: Callable[[ModelRequest], Turn]) -> FunctionModel:
    """A model that encodes every request to JSON first, as a provider's client does
    (a lone surrogate raises there), then answers with ``answer(request)``."""

    def encoded(request: ModelRequest) -> Turn:
        msgspec.json.encode(request)
        return answer(request)

    return FunctionModel(encoded)


@tool(description=f"Look a topic up {HALF}.")
async def lookup(topic: str) -> str:
    return f"notes on {topic}"


async def documented(topic: str) -> str:
    return f"{topic} documented"


documented.__doc__ = f"Documented {HALF} here."


async def test_definitions_with_half_a_character_reach_the_model_and_the_store(
    tmp_path: Path,
) -> None:
    def helper_turns(request: ModelRequest) -> Turn:
        return reply("helped")

    def lead_turns(request: ModelRequest) -> Turn:
        if request.purpose == "summary":
            return reply("the summary")
        asked = sum(1 for m in request.messages if type(m).__name__ == "UserMessage")
        done = sum(1 for m in request.messages if type(m).__name__ == "ToolResultMessage")
        if asked == 1 and not done:
            return call("helper", task="help")
        return reply(f"answer {asked}")

    helper = Agent(
        "helper", on_the_wire(helper_turns), instructions=f"Help {HALF}.",
        description=f"Helps {HALF} out.",
    )  # fmt: skip
    lead = Agent(
        "lead",
        on_the_wire(lead_turns),
        instructions=f"Be {HALF} kind.",
        tools=[lookup, tool(documented)],
        subagents=[helper],
        memory=Compaction(threshold=1, keep=0, instructions=f"Fold {HALF} this."),
    )
    async with SQLiteStore(tmp_path / "agents.db") as store:
        async with Runtime(store=store) as rt:
            ref = await rt.spawn(lead, id="lead")
            first = await ref.ask("one")
            second = await ref.ask("two")  # compacted first: the summarizer's request
            conversation = await ref.conversation()
        records = await store.records()
        stored = await store.load("lead")
    assert (first.status, second.status) == ("completed", "completed"), second.stop_reason
    assert second.text == "answer 1"  # the first turn was folded into the summary
    assert conversation.system == f"Be {SAFE} kind."
    assert lead.instructions == f"Be {SAFE} kind."
    assert helper.description == f"Helps {SAFE} out."
    descriptions = {spec.name: spec.description for spec in lead.specs}
    assert descriptions["lookup"] == f"Look a topic up {SAFE}."
    assert descriptions["documented"] == f"Documented {SAFE} here."
    assert SAFE in descriptions["helper"]
    assert lead.memory is not None
    assert lead.memory.instructions == f"Fold {SAFE} this."
    # Every execution's trace is stored: the two asks' and the helper's in each.
    assert sorted(r.actor_id.split("#")[0] for r in records) == ["helper"] * 2 + ["lead"] * 2
    assert stored is not None
    assert b'"content":"answer 1"' in stored  # the agent's state too
