"""Typed answers (``Agent(output_type=T)``) with scripted models: the three ways of
asking (native, tool, text), bad answers sent back within the retry limit and the
budget, typed subagents, resumed conversations, each kind of type, ReAct."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any, Literal, TypedDict

import msgspec
import pytest

from fractor.actors import (
    Agent,
    AnthropicModel,
    AssistantMessage,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    OpenAIModel,
    OutputSchema,
    ReActModel,
    Result,
    ScriptedModel,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    call,
    calls,
    reply,
    tool,
)
from fractor.actors._execution._output import inlined
from fractor.runtime import Budget, Event, Runtime, Store


class Weather(msgspec.Struct, frozen=True):
    city: str
    temp: int


@dataclasses.dataclass(frozen=True)
class Point:
    x: float
    y: float


class Person(TypedDict):
    name: str
    age: int


class Tree(msgspec.Struct):
    name: str
    children: list[Tree] = []


@tool
async def lookup(city: str) -> str:
    """Look a city's weather up."""
    return f"{city}: 22 degrees"


PARIS = '{"city": "Paris", "temp": 22}'
LOOKUP = '{"tool": "lookup", "arguments": {"city": "Paris"}}'


async def ask(agent: Agent, task: str = "Weather in Paris?", **options: Any) -> Result:
    async with Runtime(**options) as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask(task)
        conversation = await ref.conversation()
    # Invariant 2: only the task and one final response joined the conversation.
    assert conversation.execution == ()
    assert conversation.messages == (
        UserMessage(content=task),
        AssistantMessage(content=result.text),
    )
    return result


# -- definitions ------------------------------------------------------------------------


def test_auto_asks_each_model_the_best_way_it_has() -> None:
    scripted = Agent("a", ScriptedModel([]), output_type=Weather)
    assert scripted.output_spec is not None
    assert scripted.output_spec.mode == "native"
    react = Agent("a", ReActModel(ScriptedModel([])), output_type=Weather)
    assert react.output_spec is not None
    assert react.output_spec.mode == "text"
    claude = Agent("a", AnthropicModel("claude-test", api_key="k"), output_type=Weather)
    assert claude.output_spec is not None
    assert claude.output_spec.mode == "tool"
    gpt = Agent("a", OpenAIModel("gpt-test", api_key="k"), output_type=Weather)
    assert gpt.output_spec is not None
    assert gpt.output_spec.mode == "native"
    local = OpenAIModel("llama", base_url="http://localhost:1/v1", structured_output=False)
    tooled = Agent("a", local, output_type=Weather)
    assert tooled.output_spec is not None
    assert tooled.output_spec.mode == "tool"
    assert Agent("a", ScriptedModel([])).output_spec is None


def test_bad_options_are_refused_naming_the_agent() -> None:
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"Agent 'a': output_type must be a msgspec Struct"):
        Agent("a", ScriptedModel([]), output_type=Opaque)
    with pytest.raises(ValueError, match=r"Agent 'a': output_mode must be one of"):
        Agent("a", ScriptedModel([]), output_type=Weather, output_mode="json")  # type: ignore[arg-type]
    for retries in (-1, True, 1.5):
        with pytest.raises(ValueError, match=r"Agent 'a': output_retries must be an int >= 0"):
            Agent("a", ScriptedModel([]), output_type=Weather, output_retries=retries)  # type: ignore[arg-type]
    claude = AnthropicModel("claude-test", api_key="k")
    with pytest.raises(ValueError, match=r"output_mode='native' needs a model with native"):
        Agent("a", claude, output_type=Weather, output_mode="native")

    @tool
    async def final_answer(text: str) -> str:
        """Clashes."""
        return text

    with pytest.raises(ValueError, match=r"'final_answer' is its typed answer's tool"):
        Agent("a", ScriptedModel([]), tools=[final_answer], output_type=int, output_mode="tool")


def test_a_typed_agent_pickles_as_its_arguments() -> None:
    agent = Agent("a", ScriptedModel([]), output_type=Weather, output_mode="tool")
    again = pickle.loads(pickle.dumps(agent))
    assert again.output_type is Weather
    assert again.output_spec is not None
    assert again.output_spec.mode == "tool"


def test_schemas_are_inlined_except_where_a_type_refers_to_itself() -> None:
    weather = inlined(msgspec.json.schema(Weather))
    assert weather["type"] == "object"
    assert "$defs" not in weather
    tree = inlined(msgspec.json.schema(Tree))
    assert tree["type"] == "object"
    assert tree["properties"]["children"]["items"] == {"$ref": "#/$defs/Tree"}
    assert tree["$defs"]["Tree"]["title"] == "Tree"


# -- native (the model's structured output) ---------------------------------------------


async def test_a_valid_answer_is_the_typed_output_and_its_json_the_text() -> None:
    model = ScriptedModel([reply(PARIS)])
    result = await ask(Agent("weather", model, output_type=Weather))
    assert result.status == "completed", result.stop_reason
    assert result.output == Weather(city="Paris", temp=22)
    assert result.text == '{"city":"Paris","temp":22}'
    (request,) = model.requests
    assert request.output_schema == OutputSchema(
        name="Weather", schema=inlined(msgspec.json.schema(Weather)), native=True
    )
    assert request.tools == ()
    assert request.messages == (UserMessage(content="Weather in Paris?"),)  # no instructions


async def test_an_agent_without_output_type_asks_as_before() -> None:
    model = ScriptedModel([reply(PARIS)])
    result = await ask(Agent("plain", model))
    assert result.output is None
    assert result.text == PARIS
    assert model.requests[0].output_schema is None


async def test_a_bad_answer_goes_back_to_the_model_which_corrects_it() -> None:
    model = ScriptedModel([reply('{"city": "Paris"}'), reply(PARIS)])
    async with Runtime() as rt, rt.events() as subscription:
        ref = await rt.spawn(Agent("weather", model, output_type=Weather))
        result = await ref.ask("Weather in Paris?")
        (trace,) = await ref.trace()
        events: list[Event] = []
        while (event := subscription.receive_nowait()) is not None:
            events.append(event)
    assert result.output == Weather(city="Paris", temp=22)
    # What the model saw: its bad answer, then what was wrong with it.
    *_, said, told = model.requests[1].messages
    assert said == AssistantMessage(content='{"city": "Paris"}')
    assert isinstance(told, UserMessage)
    assert "Object missing required field `temp`" in told.content
    assert "Reply again with only the corrected JSON" in told.content
    # Traced: the bad answer is a step of its own, with what was wrong.
    assert [step.error for step in trace.steps] == ["Object missing required field `temp`", ""]
    assert result.usage.requests == 2
    assert result.steps == 2
    (retry,) = [event for event in events if event.kind == "retry"]
    assert retry.detail["attempt"] == 1
    assert "the answer did not match Weather" in retry.detail["error"]


async def test_bad_answers_past_the_retry_limit_fail_with_a_clear_reason() -> None:
    model = ScriptedModel([reply("It is sunny."), reply('{"city": 1}'), reply("unreached")])
    result = await ask(Agent("weather", model, output_type=Weather, output_retries=1))
    assert result.status == "failed"
    assert result.stop_reason == (
        "the answer did not match Weather: Expected `str`, got `int` - at `$.city`"
    )
    assert result.output is None
    assert result.text.startswith("[failed] The task stopped before a final answer")
    assert len(model.requests) == 2
    assert model.remaining == 1


async def test_no_retries_fail_at_the_first_bad_answer() -> None:
    model = ScriptedModel([reply("not json")])
    result = await ask(Agent("weather", model, output_type=Weather, output_retries=0))
    assert result.status == "failed"
    assert result.stop_reason.startswith("the answer did not match Weather: the answer is not JSON")


async def test_a_budget_spent_while_correcting_stops_the_execution() -> None:
    model = ScriptedModel([reply('{"city": "Paris"}'), reply(PARIS)])
    agent = Agent("weather", model, output_type=Weather, budget=Budget(requests=1))
    result = await ask(agent)
    assert result.status == "budget_exceeded"
    assert "requests limit of 1" in result.stop_reason
    assert result.output is None
    assert len(model.requests) == 1
    assert result.usage.requests == 1


async def test_an_answer_in_prose_or_a_fence_is_found() -> None:
    model = ScriptedModel([reply(f"Here it is:\n```json\n{PARIS}\n```\nEnjoy.")])
    result = await ask(Agent("weather", model, output_type=Weather))
    assert result.output == Weather(city="Paris", temp=22)


KINDS = [
    (Weather, PARIS, Weather(city="Paris", temp=22), '{"city":"Paris","temp":22}'),
    (Point, '{"x": 1, "y": 2.5}', Point(x=1.0, y=2.5), '{"x":1.0,"y":2.5}'),
    (Person, '{"name": "Ada", "age": 36}', {"name": "Ada", "age": 36}, '{"name":"Ada","age":36}'),
    (Tree, '{"name": "r", "children": [{"name": "c"}]}', Tree("r", [Tree("c")]), None),
    (int, "42", 42, "42"),
    (float, "2.5", 2.5, "2.5"),
    (bool, "true", True, "true"),
    (str, '"Paris"', "Paris", '"Paris"'),
    (list[str], '["a", "b"]', ["a", "b"], '["a","b"]'),
    (Literal["yes", "no"], '"no"', "no", '"no"'),
    (Weather | None, "null", None, "null"),
]
OBJECTS = (Weather, Point, Person, Tree)


@pytest.mark.parametrize(("output_type", "answer", "value", "text"), KINDS)
@pytest.mark.parametrize("mode", ["native", "text", "tool"])
async def test_each_kind_of_type(
    output_type: Any, answer: str, value: Any, text: str | None, mode: str
) -> None:
    """A Struct, a dataclass, a TypedDict, a recursive Struct, scalars, a list, a
    Literal, an optional: asked natively, in the text, or with the final-answer tool
    (whose arguments wrap any answer that is no object in ``{"value": ...}``)."""
    if mode == "tool":
        arguments = msgspec.json.decode(answer)
        turn = call("final_answer", arguments if output_type in OBJECTS else {"value": arguments})
    else:
        turn = reply(answer)
    model = ScriptedModel([turn])
    agent = Agent("typed", model, output_type=output_type, output_mode=mode)  # type: ignore[arg-type]
    result = await ask(agent)
    assert result.status == "completed", result.stop_reason
    assert result.output == value
    assert type(result.output) is type(value)
    assert result.text == (text or msgspec.json.encode(value).decode())
    if mode == "tool":
        parameters = model.requests[0].tools[-1].parameters
        assert parameters["type"] == "object"
        assert ("value" in parameters["properties"]) is (output_type not in OBJECTS)


async def test_a_str_answer_may_come_bare_in_the_text() -> None:
    result = await ask(Agent("city", ScriptedModel([reply(" Paris\n")]), output_type=str))
    assert result.output == "Paris"
    assert result.text == '"Paris"'


# -- text (instructions and a parse) ----------------------------------------------------


async def test_text_mode_appends_the_schema_to_the_system_prompt() -> None:
    model = ScriptedModel([reply("sunny"), reply(PARIS)])
    agent = Agent(
        "weather", model, instructions="Be brief.", output_type=Weather, output_mode="text"
    )
    result = await ask(agent)
    assert result.output == Weather(city="Paris", temp=22)
    system = model.requests[0].messages[0]
    assert isinstance(system, SystemMessage)
    assert system.content.startswith("Be brief.\n\nYour final answer must be JSON matching")
    assert '"required":["city","temp"]' in system.content
    schema = model.requests[0].output_schema
    assert schema is not None
    assert not schema.native
    told = model.requests[1].messages[-1]
    assert isinstance(told, UserMessage)
    assert "the answer is not JSON" in told.content


# -- tool (a final-answer tool) ---------------------------------------------------------


async def test_the_final_answer_tool_is_offered_next_to_the_agents_tools() -> None:
    model = ScriptedModel(
        [call("lookup", city="Paris"), call("final_answer", city="Paris", temp=22)]
    )
    agent = Agent("weather", model, tools=[lookup], output_type=Weather, output_mode="tool")
    result = await ask(agent)
    assert result.output == Weather(city="Paris", temp=22)
    assert [spec.name for spec in model.requests[0].tools] == ["lookup", "final_answer"]
    final = model.requests[0].tools[1]
    assert final.parameters == inlined(msgspec.json.schema(Weather))
    assert model.requests[0].output_schema is None


async def test_bad_arguments_are_a_tool_error_and_the_steps_other_calls_run() -> None:
    model = ScriptedModel(
        [
            calls(call("lookup", city="Paris"), call("final_answer", city="Paris")),
            call("final_answer", city="Paris", temp=22),
        ]
    )
    agent = Agent("weather", model, tools=[lookup], output_type=Weather, output_mode="tool")
    result = await ask(agent)
    assert result.output == Weather(city="Paris", temp=22)
    looked, answered = model.requests[1].messages[-2:]
    assert looked == ToolResultMessage(call_id="call_1", name="lookup", content="Paris: 22 degrees")
    assert isinstance(answered, ToolResultMessage)
    assert answered.is_error
    assert "Object missing required field `temp`" in answered.content
    assert "Call final_answer again" in answered.content


async def test_a_valid_final_answer_ends_the_step_and_its_other_calls_do_not_run() -> None:
    ran: list[str] = []

    @tool
    async def note(text: str) -> str:
        """Take a note."""
        ran.append(text)
        return "noted"

    model = ScriptedModel([calls(call("note", text="x"), call("final_answer", value=7))])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("n", model, tools=[note], output_type=int, output_mode="tool"))
        result = await ref.ask("Seven?")
        (trace,) = await ref.trace()
    assert result.output == 7
    assert ran == []
    (step,) = trace.steps
    assert [(o.call.name, o.content) for o in step.outcomes] == [
        ("note", "not run: the final answer was given in the same step"),
        ("final_answer", "accepted as the final answer"),
    ]
    assert result.usage.tool_calls == 0  # the answer is no tool call


async def test_in_tool_mode_a_text_answer_is_taken_if_it_matches_else_corrected() -> None:
    model = ScriptedModel([reply("It is sunny."), reply(PARIS)])
    agent = Agent("weather", model, output_type=Weather, output_mode="tool")
    result = await ask(agent)
    assert result.output == Weather(city="Paris", temp=22)
    told = model.requests[1].messages[-1]
    assert isinstance(told, UserMessage)
    assert "Give your final answer by calling the final_answer tool" in told.content


async def test_tool_mode_past_the_retry_limit_fails() -> None:
    model = ScriptedModel([call("final_answer", value="x"), call("final_answer", value="y")])
    agent = Agent("n", model, output_type=int, output_mode="tool", output_retries=1)
    result = await ask(agent)
    assert result.status == "failed"
    assert result.stop_reason == (
        "the answer did not match int: Expected `int`, got `str` - at `$.value`"
    )


# -- subagents and stored conversations -------------------------------------------------


async def test_a_typed_subagent_hands_its_parent_the_json_of_its_answer() -> None:
    child = Agent(
        "forecaster", ScriptedModel([reply(PARIS)]), description="Forecasts.", output_type=Weather
    )
    parent_model = ScriptedModel([call("forecaster", task="Paris?"), reply("22 in Paris.")])
    result = await ask(Agent("lead", parent_model, subagents=[child]))
    assert result.text == "22 in Paris."
    (spec,) = parent_model.requests[0].tools
    assert spec.description.startswith("Delegate a task to the forecaster subagent: Forecasts.")
    assert 'It answers with JSON matching this JSON schema: {"title":"Weather"' in spec.description
    handed = parent_model.requests[1].messages[-1]
    assert handed == ToolResultMessage(
        call_id="call_1", name="forecaster", content='{"city":"Paris","temp":22}'
    )


async def test_a_resumed_agent_gets_its_typed_answers_back(
    make_store: Callable[[], Store],
) -> None:
    store = make_store()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("w", ScriptedModel([reply(PARIS)]), output_type=Weather), id="w")
        first = await ref.ask("Paris?")
    assert first.output == Weather(city="Paris", temp=22)
    first_store, store = store, make_store()
    if store is not first_store:
        await first_store.aclose()
    model = ScriptedModel([reply('{"city": "Rome", "temp": 30}')])
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("w", model, output_type=Weather), id="w")
        resumed = await ref.conversation()
        second = await ref.ask("Rome?")
    await store.aclose()
    answered = AssistantMessage(content='{"city":"Paris","temp":22}')
    assert resumed.messages == (UserMessage(content="Paris?"), answered)
    assert model.requests[0].messages == (
        UserMessage(content="Paris?"),
        answered,
        UserMessage(content="Rome?"),
    )
    assert second.output == Weather(city="Rome", temp=30)


# -- ReAct ------------------------------------------------------------------------------


async def test_a_react_model_gives_typed_answers_in_its_final() -> None:
    inner = ScriptedModel(
        [
            reply(f'{{"thought": "look", "actions": [{LOOKUP}]}}'),
            reply('{"thought": "done", "final": {"city": "Paris"}}'),
            reply('{"thought": "fixed", "final": {"city": "Paris", "temp": 22}}'),
        ]
    )
    agent = Agent("weather", ReActModel(inner), tools=[lookup], output_type=Weather)
    result = await ask(agent)
    assert result.status == "completed", result.stop_reason
    assert result.output == Weather(city="Paris", temp=22)
    system = inner.requests[0].messages[0]
    assert isinstance(system, SystemMessage)
    assert "Your final answer must be JSON matching this JSON schema" in system.content
    assert 'Your "final" is your answer as the JSON' in system.content
    told = inner.requests[2].messages[-1]
    assert isinstance(told, UserMessage)
    assert "missing required field `temp`" in told.content
    assert result.usage.requests == 3  # the correction is a request like any other


async def test_a_react_model_without_tools_may_answer_bare_json() -> None:
    inner = ScriptedModel([reply(PARIS)])
    result = await ask(Agent("weather", ReActModel(inner), output_type=Weather))
    assert result.output == Weather(city="Paris", temp=22)


async def test_a_function_model_sees_the_schema_it_is_asked_for() -> None:
    def answer(request: ModelRequest) -> Any:
        schema = request.output_schema
        assert schema is not None
        assert schema.native
        properties = schema.schema["properties"]
        made = {k: "x" if v["type"] == "string" else 1 for k, v in properties.items()}
        return reply(msgspec.json.encode(made).decode())

    result = await ask(Agent("w", FunctionModel(answer), output_type=Weather))
    assert result.output == Weather(city="x", temp=1)


@pytest.mark.parametrize("mode", ["native", "text", "tool"])
async def test_an_answer_nested_too_deep_goes_back_like_any_unusable_answer(mode: str) -> None:
    # Issue 40 item 18: JSON nested 1,000 deep is more than the decoder reads; the
    # answer cannot be used, so it goes back to the model, which corrects it.
    deep = '{"name": "n", "children": [' * 1000 + "]}" * 1000
    good = '{"name": "root", "children": [{"name": "leaf"}]}'
    if mode == "tool":
        bad = ModelResponse(
            tool_calls=(ToolCall(id="deep", name="final_answer", arguments=deep),),
            finish_reason="tool_calls",
        )
        script = [bad, call("final_answer", name="root", children=[{"name": "leaf"}])]
    else:
        script = [reply(deep), reply(good)]
    model = ScriptedModel(script)
    agent = Agent("trees", model, output_type=Tree, output_mode=mode)  # type: ignore[arg-type]
    result = await ask(agent)
    assert result.status == "completed", result.stop_reason
    assert result.output == Tree(name="root", children=[Tree(name="leaf")])
    told = model.requests[1].messages[-1]
    assert isinstance(told, UserMessage | ToolResultMessage)
    assert "nested too deeply" in told.content


async def test_a_react_final_nested_too_deep_goes_back_to_the_model() -> None:
    deep = '{"name": "n", "children": [' * 1000 + "]}" * 1000
    inner = ScriptedModel(
        [
            reply(f'{{"thought": "deep", "final": {deep}}}'),
            reply('{"thought": "flat", "final": {"name": "root"}}'),
        ]
    )
    result = await ask(Agent("trees", ReActModel(inner), output_type=Tree))
    assert result.status == "completed", result.stop_reason
    assert result.output == Tree(name="root")
    told = inner.requests[1].messages[-1]
    assert isinstance(told, UserMessage)
    assert "nested too deeply" in told.content
