"""ReActModel: tool calls for text-only models, through the action protocol."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fractor.actors._messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from fractor.actors._models._protocol import (
    FunctionModel,
    Model,
    ScriptedModel,
    Turn,
    estimate_tokens,
    fail,
    reply,
)
from fractor.actors._models._react import MalformedAction, ReActModel
from fractor.runtime import FractorError

SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
ADD = ToolSpec(
    name="add",
    description="Add two numbers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    },
)
TOOLS = (SEARCH, ADD)


def task(text: str = "What is 2 + 3?", *, tools: tuple[ToolSpec, ...] = TOOLS) -> ModelRequest:
    return ModelRequest(
        messages=(SystemMessage(content="You are helpful."), UserMessage(content=text)),
        tools=tools,
    )


def scripted(*texts: str) -> ScriptedModel:
    """A text-only model answering these texts in order."""
    return ScriptedModel([reply(text) for text in texts], name="text-only")


def action(tool: str, **arguments: object) -> str:
    return json.dumps(
        {"thought": f"use {tool}", "actions": [{"tool": tool, "arguments": arguments}]}
    )


def decoded(call: ToolCall) -> Any:
    return msgspec.json.decode(call.arguments)


ADD_JSON = action("add", a=2, b=3)


@pytest.mark.parametrize(
    "text",
    [
        ADD_JSON,
        f"```json\n{ADD_JSON}\n```",
        f"I should add the numbers.\n{ADD_JSON}\nThat is my action.",
        f"Here:\n```\n{ADD_JSON}\n```\nDone.",
        f"```python\nprint(1)\n```\nthen\n```json\n{ADD_JSON}\n```",
    ],
    ids=["bare", "fenced", "prose", "plain-fence", "second-fence"],
)
async def test_action_json_becomes_tool_calls(text: str) -> None:
    model = ReActModel(scripted(text))
    response = await model.request(task())
    assert response.finish_reason == "tool_calls"
    assert response.text == "use add"
    (call,) = response.tool_calls
    assert (call.id, call.name, decoded(call)) == ("react_1", "add", {"a": 2, "b": 3})
    assert response.model == "react:text-only"


async def test_several_actions_become_several_calls_with_unique_ids() -> None:
    two = json.dumps(
        {
            "thought": "both",
            "actions": [
                {"tool": "search", "arguments": {"q": "x"}},
                {"tool": "add", "arguments": {"a": 1, "b": 1}},
            ],
        }
    )
    model = ReActModel(scripted(two, ADD_JSON))
    first = await model.request(task())
    second = await model.request(task())
    assert [(c.id, c.name) for c in first.tool_calls] == [("react_1", "search"), ("react_2", "add")]
    assert [c.id for c in second.tool_calls] == ["react_3"]


async def test_final_becomes_the_answer() -> None:
    model = ReActModel(scripted('{"thought": "easy", "final": "It is 5."}'))
    response = await model.request(task())
    assert (response.text, response.tool_calls, response.finish_reason) == ("It is 5.", (), "stop")


async def test_inner_context_has_the_protocol_observations_and_no_tools() -> None:
    inner = scripted('{"final": "5"}')
    model = ReActModel(inner)
    calls = (
        ToolCall(id="react_7", name="add", arguments='{"a":2,"b":3}'),
        ToolCall(id="react_8", name="search", arguments='{"q":"sum"}'),
    )
    request = ModelRequest(
        messages=(
            SystemMessage(content="You are helpful."),
            UserMessage(content="What is 2 + 3?"),
            AssistantMessage(content="adding", tool_calls=calls),
            ToolResultMessage(call_id="react_7", name="add", content="5"),
            ToolResultMessage(call_id="react_8", name="search", content="down", is_error=True),
        ),
        tools=TOOLS,
        max_tokens=300,
    )
    await model.request(request)
    (sent,) = inner.requests
    assert sent.tools == ()
    assert sent.max_tokens == 300
    system, user, assistant, first, second = sent.messages
    assert isinstance(system, SystemMessage)
    assert system.content.startswith("You are helpful.\n\n")
    for expected in ("- search: Search the web.", "- add: Add two numbers.", '"required":["q"]'):
        assert expected in system.content
    assert '"final"' in system.content
    assert '"actions"' in system.content
    assert user == UserMessage(content="What is 2 + 3?")
    assert isinstance(assistant, AssistantMessage)
    assert assistant.tool_calls == ()
    assert json.loads(assistant.content) == {
        "thought": "adding",
        "actions": [
            {"tool": "add", "arguments": {"a": 2, "b": 3}},
            {"tool": "search", "arguments": {"q": "sum"}},
        ],
    }
    assert first == UserMessage(content="Observation for call react_7 (add): 5")
    assert second == UserMessage(content="Observation for call react_8 (search) [error]: down")
    assert not any(isinstance(m, ToolResultMessage) for m in sent.messages)


def test_each_step_renders_only_the_new_messages() -> None:
    model = ReActModel(scripted())
    call = ToolCall(id="react_1", name="add", arguments="{}")
    step = (
        UserMessage(content="go"),
        AssistantMessage(content="", tool_calls=(call,)),
        ToolResultMessage(call_id="react_1", name="add", content="0"),
    )
    first = model.render(ModelRequest(messages=step, tools=TOOLS))
    later = (*step, AssistantMessage(tool_calls=(call,)))
    second = model.render(ModelRequest(messages=later, tools=TOOLS))
    assert second[:4] == first
    assert second[2] is first[2]  # the view of an unchanged message is reused
    assert second[4] == first[2]
    assert second[4] is not first[2]  # an equal but new message is rendered anew


async def test_without_a_system_message_the_protocol_comes_first() -> None:
    inner = scripted('{"final": "ok"}')
    await ReActModel(inner).request(
        ModelRequest(messages=(UserMessage(content="hi"),), tools=TOOLS)
    )
    system, user = inner.requests[0].messages
    assert isinstance(system, SystemMessage)
    assert system.content.startswith("You can use the tools below.")
    assert user == UserMessage(content="hi")


async def test_earlier_final_answers_are_shown_in_the_reply_format() -> None:
    inner = scripted('{"final": "ok"}')
    messages: tuple[Message, ...] = (
        UserMessage(content="hi"),
        AssistantMessage(content="hello"),
        UserMessage(content="again"),
    )
    await ReActModel(inner).request(ModelRequest(messages=messages, tools=TOOLS))
    shown = inner.requests[0].messages[2]
    assert isinstance(shown, AssistantMessage)
    assert json.loads(shown.content) == {"thought": "", "final": "hello"}


async def test_a_malformed_reply_is_corrected_in_a_local_context() -> None:
    inner = scripted("I think I will add them.", ADD_JSON)
    model = ReActModel(inner)
    request = task()
    response = await model.request(request)
    assert [c.name for c in response.tool_calls] == ["add"]
    assert "Your last reply" not in response.text
    first, second = inner.requests
    assert second.messages[: len(first.messages)] == first.messages
    bad, correction = second.messages[len(first.messages) :]
    assert bad == AssistantMessage(content="I think I will add them.")
    assert isinstance(correction, UserMessage)
    assert "Your last reply could not be used: the reply contains no JSON object" in (
        correction.content
    )
    assert '{"thought": "<your reasoning>", "final": "<your answer>"}' in correction.content
    # The caller's request is untouched, and the next request starts clean.
    assert request.messages == task().messages
    inner_again = scripted(ADD_JSON)
    await ReActModel(inner_again).request(request)
    assert inner_again.requests[0].messages == first.messages


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("{not json}", "the reply is not valid JSON"),
        ('{"thought": "hmm"}', 'neither "actions" nor "final"'),
        ('{"final": "5", "actions": []}', 'both "actions" and "final"'),
        ('{"actions": []}', '"actions" is empty'),
        (action("multiply", a=2, b=3), "unknown tool 'multiply'; the tools are: 'add', 'search'"),
        ('{"final": 5}', "does not have the expected shape: Expected `str | null`, got `int`"),
        ('{"actions": [{"tool": "add", "arguments": [2, 3]}]}', "Expected `object`, got `array`"),
    ],
)
async def test_corrections_say_precisely_what_was_wrong(bad: str, problem: str) -> None:
    inner = scripted(bad, '{"final": "5"}')
    response = await ReActModel(inner).request(task())
    assert response.text == "5"
    correction = inner.requests[1].messages[-1]
    assert isinstance(correction, UserMessage)
    assert problem in correction.content


async def test_malformed_beyond_max_corrections_raises() -> None:
    inner = scripted("no", "still no", '{"thought": "x"}', '{"final": "too late"}')
    model = ReActModel(inner, max_corrections=2, name="react-test")
    with pytest.raises(MalformedAction) as info:
        await model.request(task())
    error = info.value
    assert isinstance(error, FractorError)
    assert (error.model_name, error.attempts) == ("react-test", 3)
    assert 'neither "actions" nor "final"' in error.last_error
    assert "'react-test'" in str(error)
    assert "after 3 attempts (2 with a correction)" in str(error)
    assert error.usage.requests == 3
    assert len(inner.requests) == 3
    assert inner.remaining == 1


async def test_zero_corrections_fails_at_once() -> None:
    inner = scripted("nope", '{"final": "x"}')
    with pytest.raises(MalformedAction, match=r"after 1 attempt \(0 with a correction\)"):
        await ReActModel(inner, max_corrections=0).request(task())
    assert len(inner.requests) == 1


def test_max_corrections_is_validated() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        ReActModel(scripted(), max_corrections=-1)


async def test_usage_sums_every_inner_request() -> None:
    inner = ScriptedModel(
        [
            reply("bad", usage=Usage(input_tokens=100, output_tokens=5, cost=0.25)),
            reply(ADD_JSON, usage=Usage(input_tokens=130, output_tokens=20, cost=0.5)),
        ]
    )
    response = await ReActModel(inner).request(task())
    assert response.usage == Usage(input_tokens=230, output_tokens=25, requests=2, cost=0.75)


async def test_max_tokens_covers_all_attempts() -> None:
    inner = ScriptedModel(
        [
            reply("bad", usage=Usage(output_tokens=30)),
            reply("worse", usage=Usage(output_tokens=60)),
            reply('{"final": "x"}'),
        ]
    )
    request = msgspec.structs.replace(task(), max_tokens=100)
    response = await ReActModel(inner, max_corrections=5).request(request)
    assert response.text == "x"
    assert [r.max_tokens for r in inner.requests] == [100, 70, 10]
    assert response.usage.output_tokens <= 100


async def test_no_output_tokens_left_for_a_correction_raises() -> None:
    inner = ScriptedModel([reply("bad", usage=Usage(output_tokens=50)), reply('{"final": "x"}')])
    request = msgspec.structs.replace(task(), max_tokens=50)
    with pytest.raises(MalformedAction, match=r"no output tokens are left .*max_tokens=50"):
        await ReActModel(inner).request(request)


async def test_a_reply_cut_by_max_tokens_is_a_format_failure_not_an_answer() -> None:
    inner = scripted('{"thought": "a long thought that goes on", "final": "x"}', ADD_JSON)
    request = msgspec.structs.replace(task(), max_tokens=3)
    with pytest.raises(MalformedAction, match=r"cut at max_tokens=3") as caught:
        await ReActModel(inner).request(request)
    assert caught.value.usage.output_tokens == 3
    assert len(inner.requests) == 1  # no tokens left for a correction: no second request


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Just plain text.", "Just plain text."),
        ('{"thought": "t", "final": "from json"}', "from json"),
        ('{"answer": 42}', '{"answer": 42}'),
    ],
)
async def test_without_tools_plain_text_is_the_answer(text: str, answer: str) -> None:
    inner = scripted(text)
    response = await ReActModel(inner).request(task(tools=()))
    assert (response.text, response.finish_reason) == (answer, "stop")
    system = inner.requests[0].messages[0]
    assert isinstance(system, SystemMessage)
    assert "No tools are available" in system.content


async def test_without_tools_actions_are_corrected() -> None:
    inner = scripted(ADD_JSON, "Five.")
    response = await ReActModel(inner).request(task(tools=()))
    assert response.text == "Five."
    correction = inner.requests[1].messages[-1]
    assert 'no tools are available for this reply, so "actions" cannot be used' in (
        correction.content
    )


async def test_inner_errors_propagate() -> None:
    inner = ScriptedModel([fail(ConnectionError("down"))])
    with pytest.raises(ConnectionError, match="down"):
        await ReActModel(inner).request(task())


async def test_estimate_delegates_to_the_inner_model_on_the_rendered_request() -> None:
    inner = scripted(ADD_JSON)
    model = ReActModel(inner)
    request = task()
    estimate = model.estimate_tokens(request)
    await model.request(request)
    assert estimate == estimate_tokens(inner.requests[0])
    assert estimate > estimate_tokens(ModelRequest(messages=request.messages))


async def test_aclose_closes_the_inner_model() -> None:
    closed: list[str] = []

    class Inner(ScriptedModel):
        async def aclose(self) -> None:
            closed.append(self.name)

    model: Model = ReActModel(Inner([], name="inner"))
    await model.aclose()
    assert closed == ["inner"]


# -- round trip -------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
actions = st.lists(
    st.tuples(st.sampled_from(["search", "add"]), st.dictionaries(st.text(), json_values)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=50, deadline=None)
@given(steps=st.lists(st.tuples(actions, st.sampled_from(["bare", "fenced", "prose"])), max_size=5))
async def test_scripted_actions_round_trip(
    steps: list[tuple[list[tuple[str, dict[str, Any]]], str]],
) -> None:
    def speak(request: ModelRequest) -> Turn:
        wanted, style = steps[len(inner.requests) - 1]
        text = json.dumps(
            {"thought": "go", "actions": [{"tool": t, "arguments": a} for t, a in wanted]}
        )
        if style == "fenced":
            text = f"```json\n{text}\n```"
        elif style == "prose":
            text = f"Next I act.\n{text}\nWaiting for the observation."
        return reply(text)

    inner = FunctionModel(speak)
    model = ReActModel(inner)
    ids: list[str] = []
    for wanted, _ in steps:
        response = await model.request(task())
        assert [(c.name, decoded(c)) for c in response.tool_calls] == wanted
        ids.extend(c.id for c in response.tool_calls)
    assert len(ids) == len(set(ids))
    assert len(inner.requests) == len(steps)


def test_react_model_refuses_what_is_no_model() -> None:
    with pytest.raises(TypeError, match=r"ReActModel wraps a model .* got str"):
        ReActModel("openai:gpt-4.1-mini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ReActModel name must be a non-empty str or None"):
        ReActModel(ScriptedModel([]), name="")
