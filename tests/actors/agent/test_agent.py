"""The agent actor: conversation vs execution buffer, the execution loop, tools."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from fractor.actors import (
    Agent,
    AssistantMessage,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    call,
    calls,
    fail,
    reply,
    tool,
)
from fractor.runtime import Budget, Runtime

from ..sample_tools import add, get_weather, hanging


def tool_messages(messages: tuple[object, ...]) -> list[object]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


async def test_single_tool_call_keeps_the_conversation_clean() -> None:
    model = ScriptedModel([call("get_weather", city="Paris"), reply("Sunny, 22°C in Paris.")])
    agent = Agent("assistant", model, tools=[get_weather], instructions="Be brief.")
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("What's the weather in Paris?")
        conversation = await ref.conversation()
        traces = await ref.trace()
    assert result.status == "completed"
    assert result.text == "Sunny, 22°C in Paris."
    assert result.stop_reason == "final answer"
    assert result.steps == 2
    assert result.usage.requests == 2
    assert result.usage.tool_calls == 1
    assert conversation.messages == (
        UserMessage(content="What's the weather in Paris?"),
        AssistantMessage(content="Sunny, 22°C in Paris."),
    )
    assert conversation.execution == ()
    # The model saw the call and its result during the execution, in order.
    second = model.requests[1].messages
    assert second[0].content == "Be brief."
    assistant, result_message = second[-2], second[-1]
    assert isinstance(assistant, AssistantMessage)
    assert isinstance(result_message, ToolResultMessage)
    assert result_message.call_id == assistant.tool_calls[0].id
    assert result_message.content == "22°C and sunny in Paris"
    assert not result_message.is_error
    (trace,) = traces
    assert trace.steps[0].tool_calls[0].name == "get_weather"
    assert trace.steps[0].outcomes[0].content == "22°C and sunny in Paris"
    assert trace.final_text == result.text


async def test_several_tools_in_one_step_results_in_call_order() -> None:
    second_done = anyio.Event()

    @tool
    async def first() -> str:
        """Finishes last."""
        await second_done.wait()
        return "first"

    @tool
    async def second() -> str:
        """Finishes first."""
        second_done.set()
        return "second"

    model = ScriptedModel(
        [calls(call("first"), call("second"), call("add", a=1, b=2)), reply("ok")]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[first, second, add]))
        with anyio.fail_after(5):
            result = await ref.ask("go")
    assert result.text == "ok"
    context = model.requests[1].messages
    results = tool_messages(context)
    assert [r.content for r in results] == ["first", "second", "3"]  # type: ignore[attr-defined]
    ids = [c.id for c in context[-4].tool_calls]  # type: ignore[union-attr]
    assert [r.call_id for r in results] == ids  # type: ignore[attr-defined]


async def test_no_tool_call() -> None:
    model = ScriptedModel([reply("Hello!")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model))
        result = await ref.ask("hi")
        conversation = await ref.conversation()
    assert (result.text, result.status, result.steps) == ("Hello!", "completed", 1)
    assert len(conversation.messages) == 2
    assert model.requests[0].tools == ()


async def test_stop_condition_ends_with_an_empty_buffer() -> None:
    model = ScriptedModel([call("add", a=1, b=1), call("add", a=2, b=2), reply("never")])
    agent = Agent("a", model, tools=[add], stop_when=lambda step: step.outcomes[0].content == "4")
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("count")
        conversation = await ref.conversation()
    assert result.status == "completed"
    assert result.stop_reason == "the agent's stop condition was met"
    assert result.steps == 2
    assert model.remaining == 1
    assert conversation.execution == ()
    assert conversation.messages[-1] == AssistantMessage(content=result.text)
    assert result.text.startswith(
        "[completed] The task ended without a final answer: the agent's stop condition was met."
    )
    assert "stopped before" not in result.text  # it completed: it did not stop short
    assert "2 tool call(s) (add)" in result.text


async def test_a_synthesized_answer_counts_tool_calls_and_subagent_calls_apart() -> None:
    helper = Agent("helper", ScriptedModel([reply("helped")] * 2))
    model = ScriptedModel(
        [calls(call("add", a=1, b=1), call("helper", task="x"), call("helper", task="y"))]
    )
    agent = Agent("a", model, tools=[add], subagents=[helper], stop_when=lambda step: True)
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go")
    assert result.status == "completed"
    assert "Done so far: 1 step(s), 1 tool call(s) (add), 2 subagent call(s) (helper)." in (
        result.text
    )
    assert result.usage.tool_calls == 1  # subagent calls are not tool calls: the text agrees


async def test_model_error_mid_execution_then_next_ask_starts_clean() -> None:
    model = ScriptedModel(
        [
            call("get_weather", city="Oslo"),
            fail(ConnectionError("provider went away")),
            reply("fresh start"),
        ]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[get_weather]))
        failed = await ref.ask("weather?")
        after_failure = await ref.conversation()
        ok = await ref.ask("again")
    assert failed.status == "failed"
    assert "ConnectionError: provider went away" in failed.stop_reason
    assert "get_weather" in failed.text
    assert after_failure.execution == ()
    assert len(after_failure.messages) == 2
    assert ok.text == "fresh start"
    # The next execution's context holds no tool trace of the failed one.
    third = model.requests[2].messages
    assert tool_messages(third) == []
    assert all(not getattr(m, "tool_calls", ()) for m in third)
    assert [type(m).__name__ for m in third] == [
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
    ]


async def test_text_with_tool_calls_is_not_the_answer() -> None:
    model = ScriptedModel([call("add", a=1, b=2, text="Let me add these.")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[add], budget=Budget(steps=1)))
        result = await ref.ask("1+2?")
    assert result.status == "budget_exceeded"
    assert result.stop_reason == f"steps limit of 1 reached (budget of a {result.execution_id!r})"
    assert result.text != "Let me add these."
    assert result.text.startswith("[budget_exceeded]")
    assert "Last text from the model: Let me add these." in result.text


async def test_parallel_tools_run_concurrently() -> None:
    n = 8
    started = 0
    all_started = anyio.Event()

    @tool
    async def rendezvous(i: int) -> int:
        """Waits until every call of the step has started."""
        nonlocal started
        started += 1
        if started == n:
            all_started.set()
        await all_started.wait()
        return i

    model = ScriptedModel([calls(*(call("rendezvous", i=i) for i in range(n))), reply("met")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[rendezvous]))
        with anyio.fail_after(5):  # one by one, this would deadlock
            result = await ref.ask("meet")
    assert result.text == "met"
    assert result.usage.tool_calls == n


async def test_tool_concurrency_limit_is_respected() -> None:
    running = peak = 0

    @tool
    async def busy() -> str:
        """Counts how many run at once."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1
        return "done"

    model = ScriptedModel([calls(*(call("busy") for _ in range(12))), reply("ok")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[busy], tool_concurrency=3))
        result = await ref.ask("go")
    assert result.text == "ok"
    assert peak == 3


async def test_tool_errors_become_results_the_agent_never_crashes() -> None:
    @tool
    async def broken() -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    model = ScriptedModel(
        [
            calls(call("broken"), call("nope"), call("add", a="x", b=1)),
            reply("handled"),
        ]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[broken, add]))
        result = await ref.ask("go")
    assert result.text == "handled"
    errors = tool_messages(model.requests[1].messages)
    assert all(e.is_error for e in errors)  # type: ignore[attr-defined]
    assert "disk on fire" in errors[0].content  # type: ignore[attr-defined]
    assert "unknown tool 'nope'" in errors[1].content  # type: ignore[attr-defined]
    assert "invalid arguments for tool 'add'" in errors[2].content  # type: ignore[attr-defined]


async def test_deadline_times_out_with_an_empty_buffer() -> None:
    @tool
    async def slow() -> str:
        """Sleeps a long time."""
        await anyio.sleep(30)
        return "late"

    model = ScriptedModel([call("slow")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[slow]))
        with anyio.fail_after(5):
            result = await ref.ask("wait", budget=Budget(seconds=0.05))
        conversation = await ref.conversation()
    assert result.status == "timed_out"
    assert "deadline of 0.05 s passed" in result.stop_reason
    assert conversation.execution == ()
    assert len(conversation.messages) == 2


async def test_cancellation_mid_execution_leaves_no_half_written_state() -> None:
    hang, entered = hanging()
    model = ScriptedModel([call("hang")])
    agent = Agent("a", model, tools=[hang])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        actor = rt._cells[ref.id].actor  # white box: the actor is gone after cancel
        await ref.tell("hang please")
        await entered.wait()
        assert len(actor.execution) == 1  # type: ignore[attr-defined]
        ref.cancel()
        await ref.actor.wait_stopped()
    assert actor.execution == []  # type: ignore[attr-defined]
    assert [type(m).__name__ for m in actor.messages] == [  # type: ignore[attr-defined]
        "UserMessage",
        "AssistantMessage",
    ]
    assert actor.messages[-1].content.startswith("[cancelled]")  # type: ignore[attr-defined]
    assert actor.traces[-1].status == "cancelled"  # type: ignore[attr-defined]


async def test_function_model_drives_nested_scripts() -> None:
    def script(request: ModelRequest) -> ModelResponse:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return reply(f"sum is {last.content}")
        return call("add", a=len(last.content), b=1)

    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", FunctionModel(script), tools=[add]))
        results = [await ref.ask(text) for text in ("ab", "abcd")]
    assert [r.text for r in results] == ["sum is 3", "sum is 5"]


async def test_tell_runs_the_task_and_keeps_only_the_answer() -> None:
    model = ScriptedModel([call("add", a=2, b=2), reply("four")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[add]))
        await ref.tell("2+2")
        conversation = await ref.conversation()  # queued behind the task
    assert conversation.messages[-1] == AssistantMessage(content="four")
    assert conversation.execution == ()


def test_agent_definition_errors_are_clear() -> None:
    model = ScriptedModel([])
    with pytest.raises(ValueError, match="Agent name must be"):
        Agent("has space", model)
    with pytest.raises(ValueError, match="Agent name must be"):
        Agent("name\n", model)  # a trailing newline is no letter either
    with pytest.raises(TypeError, match="Model protocol"):
        Agent("a", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_concurrency must be >= 1"):
        Agent("a", model, tool_concurrency=0)


async def test_ask_rejects_non_text() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", ScriptedModel([])))
        with pytest.raises(TypeError, match="a task is text"):
            await ref.ask(42)  # type: ignore[arg-type]


async def test_the_design_example_runs_as_written() -> None:
    # DESIGN.md section 2, with its main() awaited here.
    model = ScriptedModel([call("get_weather", city="Paris"), reply("Sunny, 22°C in Paris.")])
    assistant = Agent(name="assistant", model=model, tools=[get_weather])
    async with Runtime(budget=Budget(tokens=10_000, seconds=30, depth=3)) as rt:
        ref = await rt.spawn(assistant)
        result = await ref.ask("What's the weather in Paris?")
    assert (result.status, result.text) == ("completed", "Sunny, 22°C in Paris.")
    assert result.usage.total_tokens > 0


async def test_react_driver_under_the_same_conversation_and_buffer_rules() -> None:
    from fractor.actors import ReActModel

    text_only = ScriptedModel(
        [
            reply('{"thought": "add first", "actions": [{"tool": "add", "arguments": {"a": 2}}]}'),
            reply("I will now add."),  # malformed: corrected inside the driver
            reply(
                '{"thought": "retry", "actions": [{"tool": "add", "arguments": {"a": 2, "b": 3}}]}'
            ),
            reply('```json\n{"thought": "done", "final": "2 + 3 = 5"}\n```'),
        ]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("react", ReActModel(text_only), tools=[add]))
        result = await ref.ask("What is 2 + 3?")
        conversation = await ref.conversation()
        (trace,) = await ref.trace()
    assert (result.status, result.text) == ("completed", "2 + 3 = 5")
    assert conversation.messages == (
        UserMessage(content="What is 2 + 3?"),
        AssistantMessage(content="2 + 3 = 5"),
    )
    assert conversation.execution == ()
    # The first action had a bad argument: an error result the model read and fixed.
    assert [o.is_error for step in trace.steps for o in step.outcomes] == [True, False]
    assert trace.steps[1].outcomes[0].content == "5"
    assert result.usage.requests == 4  # every inner request, corrections included
    # The inner model never received native tools, only text.
    assert all(request.tools == () for request in text_only.requests)


@pytest.mark.parametrize("budget", [{"tokens": 10}, 10, "tokens=10"])
async def test_a_budget_that_is_not_a_budget_is_refused_before_the_agent_sees_it(
    budget: object,
) -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", ScriptedModel([reply("fine")])))
        with pytest.raises(TypeError, match=r"budget must be a fractor\.Budget or None, got"):
            await ref.ask("hi", budget=budget)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"budget must be a fractor\.Budget"):
            await ref.tell("hi", budget=budget)  # type: ignore[arg-type]
        conversation = await ref.conversation()
        result = await ref.ask("hi")
    assert conversation.messages == ()  # nothing half-written: no lone user turn
    assert result.text == "fine"


class Sloppy:
    """A model that repeats and leaves out tool call ids (no fake fills them in)."""

    name = "sloppy"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest) -> ModelResponse:
        await anyio.lowlevel.checkpoint()
        self.requests.append(request)
        step = len(self.requests)
        ids: tuple[str, ...]
        if step == 1:  # a repeated id and a missing one
            ids = ("x", "x", "")
        elif step == 2:  # the id of an earlier step again
            ids = ("x",)
        else:
            return ModelResponse(text="done", usage=Usage(input_tokens=1, output_tokens=1))
        tool_calls = tuple(
            ToolCall(id=i, name="add", arguments=f'{{"a": {n}, "b": {n}}}')
            for n, i in enumerate(ids)
        )
        usage = Usage(input_tokens=1, output_tokens=1, requests=1)
        return ModelResponse(tool_calls=tool_calls, usage=usage, finish_reason="tool_calls")

    def estimate_tokens(self, request: ModelRequest) -> int:
        return 1

    async def aclose(self) -> None:
        return None


async def test_repeated_or_missing_call_ids_from_a_model_are_made_unique() -> None:
    model = Sloppy()
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[add]))
        result = await ref.ask("add")
        (trace,) = await ref.trace()
    assert result.status == "completed"
    context = model.requests[-1].messages
    asked = [c.id for m in context if isinstance(m, AssistantMessage) for c in m.tool_calls]
    answered = [m.call_id for m in context if isinstance(m, ToolResultMessage)]
    assert len(set(asked)) == len(asked) == 4
    assert all(asked)
    assert answered == asked  # each result follows its own call, in order
    assert asked[0] == "x"  # the first use of an id is kept
    assert [c.id for step in trace.steps for c in step.tool_calls] == asked


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"instructions": 5}, TypeError, "instructions must be a str, got int"),
        ({"description": None}, TypeError, "description must be a str, got NoneType"),
        ({"stop_when": "done"}, TypeError, "stop_when must be a function"),
        ({"retry": 3}, TypeError, "retry must be a fractor.RetryPolicy, got int"),
        ({"restart": {}}, TypeError, "restart must be a fractor.RestartPolicy, got dict"),
        ({"escalate": "no"}, TypeError, "escalate must be a bool, got 'no'"),
        ({"max_tokens": True}, ValueError, "max_tokens must be >= 1, got True"),
        ({"tools": add}, TypeError, "tools must be a sequence (a list or a tuple), got Tool"),
        ({"tools": 3}, TypeError, "tools must be a sequence (a list or a tuple), got int"),
        (
            {"subagents": Agent("b", ScriptedModel([]))},
            TypeError,
            "subagents must be a sequence (a list or a tuple), got Agent",
        ),
    ],
)
def test_agent_options_of_the_wrong_kind_are_refused_at_definition(
    options: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as caught:
        Agent("a", ScriptedModel([]), **options)
    assert str(caught.value).startswith("Agent 'a': ")
    assert fragment in str(caught.value)
