"""The usual step's fast path (``Execution._direct``: one call of a tool the loop awaits
itself) gives what the general path (``Execution._outcomes``) gives, call for call.

The fast path stays because a benchmark row shows it pays (W2 per step at S = 50:
about 5 % of a step, measured with it switched off); this test is what lets it stay.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fractor.actors import Agent, ModelResponse, ScriptedModel, ToolCall, ToolOutcome, reply, tool
from fractor.actors._execution._execution import Execution
from fractor.runtime import Budget, Runtime


async def _add(a: int, b: int) -> int:
    return a + b


async def _boom(reason: str) -> str:
    raise ValueError(f"refused: {reason}")


async def _pair(*, left: str, right: str = "r") -> str:
    return left + right


def _sync_upper(text: str) -> str:
    return text.upper()


TOOLS: list[Any] = [
    tool(_add, name="add"),
    tool(_boom, name="boom"),
    tool(_pair, name="pair"),
    tool(_sync_upper, name="upper"),
]

#: Arguments each tool may be sent: fitting ones, wrong types, missing, unknown, not JSON.
ARGUMENTS = {
    "add": ['{"a": 1, "b": 2}', '{"a": "x", "b": 2}', '{"a": 1}', '{"a": 1, "b": 2, "c": 3}'],
    "boom": ['{"reason": "no"}', "{}", "not json"],
    "pair": ['{"left": "l"}', '{"left": "l", "right": "x"}', '{"right": "x"}', "[1, 2]"],
    "upper": ['{"text": "hi"}', '{"text": 3}'],
    "missing": ["{}"],
}

step_calls = st.lists(
    st.sampled_from(sorted(ARGUMENTS)).flatmap(
        lambda name: st.tuples(st.just(name), st.sampled_from(ARGUMENTS[name]))
    ),
    min_size=1,
    max_size=6,
)


#: An execution's id (random per runtime), as refusals name it.
_ID = re.compile(r"#\d+\.[0-9a-f]{16}")


def _turns(chosen: list[tuple[str, str]]) -> list[ModelResponse]:
    steps = [
        ModelResponse(
            tool_calls=(ToolCall(id=f"c{index}", name=name, arguments=arguments),),
            finish_reason="tool_calls",
        )
        for index, (name, arguments) in enumerate(chosen)
    ]
    return [*steps, reply("done")]


async def _ran(chosen: list[tuple[str, str]], budget: Budget | None) -> tuple[Any, ...]:
    """What one execution of those steps gave: its result and every outcome, timings
    left out."""
    async with Runtime() as rt:
        agent = Agent("a", ScriptedModel(_turns(chosen)), tools=TOOLS, budget=budget)
        ref = await rt.spawn(agent)
        result = await ref.ask("go")
        (trace,) = await ref.trace()
    outcomes = [
        (o.call.name, _ID.sub("#id", o.content), o.is_error, o.attempts, o.interrupted, o.parts)
        for step in trace.steps
        for o in step.outcomes
    ]
    said = (_ID.sub("#id", result.text), result.status, _ID.sub("#id", result.stop_reason))
    return (*said, result.usage, outcomes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chosen=step_calls, limit=st.one_of(st.none(), st.integers(0, 4)))
async def test_one_call_steps_give_the_same_on_the_fast_and_the_general_path(
    chosen: list[tuple[str, str]], limit: int | None
) -> None:
    budget = None if limit is None else Budget(tool_calls=limit)
    fast = await _ran(chosen, budget)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Execution, "_direct", lambda self, calls: None)
        general = await _ran(chosen, budget)
    assert fast == general


async def test_the_fast_path_is_taken_for_the_usual_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # The comparison above means something only if the fast path runs at all.
    taken: list[object] = []
    original = Execution._direct

    def direct(self: Execution, calls: tuple[ToolCall, ...]) -> object:
        found = original(self, calls)
        taken.append(found)
        return found

    monkeypatch.setattr(Execution, "_direct", direct)
    await _ran([("add", '{"a": 1, "b": 2}'), ("add", '{"a": "x", "b": 2}')], None)
    awaited, answered = taken
    assert isinstance(awaited, tuple)  # the tool, its arguments: awaited by the loop
    assert isinstance(answered, ToolOutcome)  # invalid arguments: answered at once
    assert answered.is_error
