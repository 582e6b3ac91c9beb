"""The scripted fakes: turns in order, ids, usage, max_tokens, failures, concurrency."""

from __future__ import annotations

import math

import anyio
import anyio.lowlevel
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fractor.actors._messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
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
    ScriptExhausted,
    Turn,
    call,
    calls,
    estimate_tokens,
    fail,
    reply,
)
from fractor.runtime import FractorError


def ask(text: str = "hi", *, max_tokens: int | None = None) -> ModelRequest:
    return ModelRequest(messages=(UserMessage(content=text),), max_tokens=max_tokens)


def arguments(tool_call: ToolCall) -> object:
    return msgspec.json.decode(tool_call.arguments)


# -- turn builders ----------------------------------------------------------------------


def test_reply_and_call_build_turns() -> None:
    answer = reply("done")
    assert (answer.text, answer.tool_calls, answer.finish_reason) == ("done", (), "stop")
    turn = call("get_weather", text="let me look", city="Paris", days=2)
    assert turn.finish_reason == "tool_calls"
    assert turn.text == "let me look"
    (tool_call,) = turn.tool_calls
    assert tool_call.name == "get_weather"
    assert tool_call.id == ""  # assigned when served
    assert arguments(tool_call) == {"city": "Paris", "days": 2}


def test_call_takes_reserved_argument_names_in_a_mapping() -> None:
    (tool_call,) = call("summarize", {"text": "long", "id": 3}, id="c9", limit=5).tool_calls
    assert tool_call.id == "c9"
    assert arguments(tool_call) == {"text": "long", "id": 3, "limit": 5}


def test_call_with_unencodable_arguments_names_the_tool() -> None:
    with pytest.raises(TypeError, match="arguments of call 'f' are not JSON-encodable"):
        call("f", when=object())


def test_calls_merges_several_calls_into_one_turn() -> None:
    turn = calls(call("a", x=1, text="first"), call("b", y=2, id="mine"), call("a", x=3))
    assert turn.finish_reason == "tool_calls"
    assert [(c.name, c.id, arguments(c)) for c in turn.tool_calls] == [
        ("a", "", {"x": 1}),
        ("b", "mine", {"y": 2}),
        ("a", "", {"x": 3}),
    ]
    assert turn.text == "first"
    assert calls(call("a"), call("b"), text="both").text == "both"


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        ((call("a"), reply("no calls here")), r"turn 1 .* has none; build each turn with call"),
        ((), "needs at least one"),
        ((call("a", id="x"), call("b", id="x")), "id 'x' twice"),
    ],
)
def test_calls_rejects_bad_turns(turns: tuple[ModelResponse, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        calls(*turns)


def test_fail_takes_an_exception_instance() -> None:
    with pytest.raises(TypeError, match="exception instance"):
        fail(ValueError)  # type: ignore[arg-type]


# -- ScriptedModel ----------------------------------------------------------------------


async def test_turns_are_served_in_order_and_requests_recorded() -> None:
    model = ScriptedModel([call("search", q="x"), reply("one"), reply("two")])
    assert model.remaining == 3
    requests = [ask("a"), ask("b"), ask("c")]
    responses = [await model.request(r) for r in requests]
    assert [r.text for r in responses] == ["", "one", "two"]
    assert responses[0].tool_calls[0].name == "search"
    assert all(r.model == "scripted" for r in responses)
    assert list(model.requests) == requests
    assert model.remaining == 0


async def test_missing_ids_are_assigned_unique_and_explicit_ids_kept() -> None:
    model = ScriptedModel(
        [
            calls(call("a"), call("b")),
            call("c", id="call_2"),  # an explicit id of the generated form
            calls(call("d"), call("e", id="own")),
        ]
    )
    ids = [c.id for _ in range(3) for c in (await model.request(ask())).tool_calls]
    assert ids == ["call_1", "call_3", "call_2", "call_4", "own"]
    assert len(set(ids)) == len(ids)


async def test_ids_are_per_model_instance() -> None:
    first, second = ScriptedModel([call("a")]), ScriptedModel([call("a")])
    assert (await first.request(ask())).tool_calls[0].id == "call_1"
    assert (await second.request(ask())).tool_calls[0].id == "call_1"


async def test_fail_raises_the_scripted_error_and_the_script_goes_on() -> None:
    error = ConnectionError("provider down")
    model = ScriptedModel([fail(error), reply("recovered")])
    with pytest.raises(ConnectionError) as info:
        await model.request(ask())
    assert info.value is error
    assert (await model.request(ask())).text == "recovered"


async def test_exhausted_script_raises_a_clear_error() -> None:
    model = ScriptedModel([reply("only")], name="weather-bot")
    await model.request(ask())
    with pytest.raises(ScriptExhausted) as info:
        await model.request(ask())
    assert isinstance(info.value, FractorError)
    message = str(info.value)
    assert "'weather-bot'" in message
    assert "all 1 turns" in message
    assert "a test or demo asked for one more" in message
    assert (info.value.model_name, info.value.turns) == ("weather-bot", 1)
    assert len(model.requests) == 2  # every request received is recorded


def test_script_rejects_what_is_not_a_turn() -> None:
    with pytest.raises(TypeError, match="turn 1 of the script of 'scripted' is 'oops'"):
        ScriptedModel([reply("ok"), "oops"])  # type: ignore[list-item]


async def test_usage_is_estimated_when_the_turn_gives_none() -> None:
    model = ScriptedModel([reply("x" * 41), call("tool", q="abc"), reply("")])
    request = ask("hello there, model")
    usage = (await model.request(request)).usage
    assert usage == Usage(input_tokens=estimate_tokens(request), output_tokens=11, requests=1)
    turn = await model.request(request)
    (tool_call,) = turn.tool_calls
    assert turn.usage.output_tokens == math.ceil((len("tool") + len(tool_call.arguments)) / 4)
    # At least one output token, even for an empty reply.
    assert (await model.request(request)).usage.output_tokens == 1


async def test_given_usage_is_kept_with_requests_forced_to_one() -> None:
    given_usage = Usage(input_tokens=7, output_tokens=3, cached_tokens=2, requests=5, cost=0.5)
    model = ScriptedModel([reply("hi", usage=given_usage)])
    usage = (await model.request(ask())).usage
    assert usage == msgspec.structs.replace(given_usage, requests=1)


async def test_max_tokens_truncates_text_and_drops_calls() -> None:
    long = "word " * 100  # 500 characters, 125 tokens
    model = ScriptedModel([calls(call("a", q="x"), call("b"), text=long), reply(long)])
    cut = await model.request(ask(max_tokens=10))
    assert cut.finish_reason == "length"
    assert cut.tool_calls == ()
    assert cut.usage.output_tokens == 10
    assert cut.text == long[:40]
    # Within the cap nothing changes.
    whole = await model.request(ask(max_tokens=125))
    assert (whole.text, whole.finish_reason, whole.usage.output_tokens) == (long, "stop", 125)


async def test_max_tokens_applies_to_given_usage_and_to_zero() -> None:
    model = ScriptedModel(
        [reply("abcdefgh", usage=Usage(input_tokens=1, output_tokens=50)), reply("abc")]
    )
    cut = await model.request(ask(max_tokens=1))
    assert (cut.text, cut.finish_reason, cut.usage.output_tokens) == ("abcd", "length", 1)
    assert cut.usage.input_tokens == 1
    empty = await model.request(ask(max_tokens=0))
    assert (empty.text, empty.finish_reason, empty.usage.output_tokens) == ("", "length", 0)


async def test_truncated_calls_do_not_use_up_ids() -> None:
    model = ScriptedModel([call("a", q="x" * 100), call("a")])
    await model.request(ask(max_tokens=2))
    assert (await model.request(ask())).tool_calls[0].id == "call_1"


async def test_fakes_satisfy_the_model_protocol() -> None:
    models: list[Model] = [ScriptedModel([]), FunctionModel(lambda request: reply("x"))]
    for model in models:
        assert model.estimate_tokens(ask("abcd")) == estimate_tokens(ask("abcd"))
        await model.aclose()
    assert [m.name for m in models] == ["scripted", "function"]


# -- FunctionModel ----------------------------------------------------------------------


async def test_sync_function_receives_the_request() -> None:
    seen: list[ModelRequest] = []

    def echo(request: ModelRequest) -> Turn:
        seen.append(request)
        last = request.messages[-1]
        if last.content == "tool please":
            return calls(call("t", n=1), call("t", n=2))
        return reply(f"echo: {last.content}")

    model = FunctionModel(echo, name="echo")
    first = ask("hello")
    assert (await model.request(first)).text == "echo: hello"
    turn = await model.request(ask("tool please"))
    assert [c.id for c in turn.tool_calls] == ["call_1", "call_2"]
    assert turn.usage.requests == 1
    assert turn.model == "echo"
    assert seen[0] is first
    assert list(model.requests) == seen


async def test_async_function_is_awaited_and_can_fail() -> None:
    async def think(request: ModelRequest) -> Turn:
        await anyio.lowlevel.checkpoint()
        if request.max_tokens == 0:
            return fail(TimeoutError("scripted timeout"))
        return reply("x" * 80)

    model = FunctionModel(think)
    response = await model.request(ask(max_tokens=5))
    assert (response.finish_reason, response.usage.output_tokens, len(response.text)) == (
        "length",
        5,
        20,
    )
    with pytest.raises(TimeoutError, match="scripted timeout"):
        await model.request(ask(max_tokens=0))


async def test_async_callable_object_is_detected() -> None:
    class Replier:
        async def __call__(self, request: ModelRequest) -> Turn:
            await anyio.lowlevel.checkpoint()
            return reply("from object")

    assert (await FunctionModel(Replier()).request(ask())).text == "from object"


async def test_function_returning_a_wrong_value_is_a_clear_error() -> None:
    model = FunctionModel(lambda request: "plain text", name="f")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"model 'f' was given 'plain text' as a turn"):
        await model.request(ask())


async def test_sync_function_returning_an_awaitable_is_awaited() -> None:
    async def later(text: str) -> Turn:
        await anyio.lowlevel.checkpoint()
        return reply(text)

    model = FunctionModel(lambda request: later(request.messages[-1].content))
    assert (await model.request(ask("from a lambda"))).text == "from a lambda"


async def test_function_model_never_generates_an_explicit_id() -> None:
    turns = iter([call("a", id="call_1"), call("b")])
    model = FunctionModel(lambda request: next(turns))
    assert (await model.request(ask())).tool_calls[0].id == "call_1"
    assert (await model.request(ask())).tool_calls[0].id == "call_2"


# -- concurrency ------------------------------------------------------------------------

scripts = st.lists(
    st.one_of(
        st.builds(lambda n: ("reply", n), st.integers(0, 3)),
        st.builds(lambda n: ("calls", n), st.integers(1, 4)),
        st.just(("fail", 0)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(script=scripts, extra=st.integers(0, 3))
async def test_concurrent_requests_get_every_turn_exactly_once(
    script: list[tuple[str, int]], extra: int
) -> None:
    turns: list[Turn] = []
    for index, (kind, n) in enumerate(script):
        if kind == "reply":
            turns.append(reply(f"turn {index}" + "!" * n))
        elif kind == "calls":
            turns.append(calls(*(call("t", turn=index, k=k) for k in range(n))))
        else:
            turns.append(fail(RuntimeError(f"turn {index}")))
    model = ScriptedModel(turns)
    served: list[int] = []
    exhausted: list[ScriptExhausted] = []

    async def one() -> None:
        try:
            response = await model.request(ask())
        except ScriptExhausted as exc:
            exhausted.append(exc)
        except RuntimeError as exc:
            served.append(int(str(exc).split()[1]))
        else:
            if response.tool_calls:
                served.append(arguments(response.tool_calls[0])["turn"])  # type: ignore[index]
            else:
                served.append(int(response.text.split()[1].rstrip("!")))
            all_ids.extend(c.id for c in response.tool_calls)

    all_ids: list[str] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(len(turns) + extra):
                tg.start_soon(one)
    assert sorted(served) == list(range(len(turns)))
    assert len(exhausted) == extra
    assert len(all_ids) == len(set(all_ids)) == sum(n for kind, n in script if kind == "calls")
    assert model.remaining == 0
    assert len(model.requests) == len(turns) + extra


# -- estimate_tokens --------------------------------------------------------------------


def test_estimate_counts_every_text_field_and_each_message() -> None:
    spec = ToolSpec(name="search", description="Find things.", parameters={"type": "object"})
    request = ModelRequest(
        messages=(
            SystemMessage(content="s" * 8),
            AssistantMessage(content="a" * 4, tool_calls=(ToolCall(id="1", name="search"),)),
            ToolResultMessage(call_id="1", name="search", content="r" * 6),
        ),
        tools=(spec,),
    )
    chars = 8 + 4 + len("search") + len("{}") + 6
    chars += len("search") + len("Find things.") + len('{"type":"object"}')
    assert estimate_tokens(request) == math.ceil(chars / 4) + 3 * 4
    assert estimate_tokens(ModelRequest(messages=())) == 0


message_texts = st.text(max_size=60)


@given(
    texts=st.lists(message_texts, min_size=1, max_size=8),
    which=st.integers(0, 7),
    more=st.text(min_size=1, max_size=40),
)
def test_estimate_is_monotonic_in_content_length(texts: list[str], which: int, more: str) -> None:
    def build(contents: list[str]) -> ModelRequest:
        messages: list[Message] = []
        for i, content in enumerate(contents):
            if i % 3 == 0:
                messages.append(UserMessage(content=content))
            elif i % 3 == 1:
                messages.append(AssistantMessage(tool_calls=(ToolCall(id=str(i), name=content),)))
            else:
                messages.append(ToolResultMessage(call_id=str(i), name="t", content=content))
        return ModelRequest(messages=tuple(messages))

    index = which % len(texts)
    longer = [*texts]
    longer[index] += more
    smaller, bigger = estimate_tokens(build(texts)), estimate_tokens(build(longer))
    assert smaller <= bigger
    assert bigger - smaller <= math.ceil(len(more) / 4) + 1
    assert estimate_tokens(build(texts)) == smaller  # deterministic
    # One more message always costs more.
    assert estimate_tokens(build([*texts, ""])) > smaller


async def test_the_fakes_keep_only_the_last_requests_they_served() -> None:
    model = ScriptedModel([reply(str(i)) for i in range(5)], record=2)
    for i in range(5):
        await model.request(ModelRequest(messages=(UserMessage(content=f"q{i}"),)))
    assert [r.messages[0].content for r in model.requests] == ["q3", "q4"]
    function = FunctionModel(lambda request: reply("ok"), record=0)
    await function.request(ModelRequest(messages=(UserMessage(content="q"),)))
    assert len(function.requests) == 0
    unbounded = FunctionModel(lambda request: reply("ok"), record=None)
    for _ in range(1_500):
        await unbounded.request(ModelRequest(messages=()))
    assert len(unbounded.requests) == 1_500
    assert ScriptedModel([]).requests.maxlen == 1_000  # the default


@pytest.mark.parametrize("record", [-1, 1.5, True, "10"])
def test_record_must_be_a_whole_number_or_none(record: object) -> None:
    with pytest.raises(ValueError, match="record must be a whole number >= 0 or None"):
        ScriptedModel([], record=record)  # type: ignore[arg-type]
