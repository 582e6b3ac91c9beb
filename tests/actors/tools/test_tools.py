"""Tools: schemas from signatures, validation, timeouts, retries, results, the toolbox."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, Literal

import anyio
import msgspec
import pytest
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st

from fractor.actors._messages import ToolCall, ToolOutcome, ToolSpec
from fractor.actors._tools._tool import Tool, ToolDefinitionError, tool
from fractor.actors._tools._toolbox import Toolbox
from fractor.runtime import FractorError


class Units(enum.Enum):
    METRIC = "metric"
    IMPERIAL = "imperial"


class Point(msgspec.Struct, frozen=True):
    lat: float
    lon: float


class Forecast(msgspec.Struct, frozen=True, kw_only=True):
    city: str
    temperatures: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Reading:
    sensor: str
    value: float


class Unsupported:
    """A plain class: msgspec has no JSON schema for it."""


class Circle(msgspec.Struct):
    radius: float


class Square(msgspec.Struct):
    side: float


def call(name: str, arguments: str = "{}", id: str = "call-1") -> ToolCall:
    return ToolCall(id=id, name=name, arguments=arguments)


@tool
async def get_weather(
    city: str,
    days: int = 1,
    units: Units = Units.METRIC,
    where: Point | None = None,
    tags: tuple[str, ...] = (),
    detail: Literal["short", "long"] = "short",
) -> str:
    """Weather forecast for a city,
    over the coming days.

    More details for the model.

    Args:
        city: The city, e.g.
            "Paris".
        days (int, optional): How many days ahead.
        units (Units): Metric or imperial.
        unknown: Not a parameter; ignored.

    Returns:
        A short text.

    Raises:
        ValueError: never.
    """
    return f"{city}: sunny for {days} day(s)"


# --- schema ---------------------------------------------------------------------------


def test_schema_comes_from_signature_and_docstring() -> None:
    spec = get_weather.spec
    assert isinstance(spec, ToolSpec)
    assert spec.name == "get_weather"
    assert spec.description == (
        "Weather forecast for a city, over the coming days. More details for the model."
    )
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "city": {"description": 'The city, e.g. "Paris".', "type": "string"},
            "days": {"description": "How many days ahead.", "type": "integer", "default": 1},
            "units": {
                "description": "Metric or imperial.",
                "$ref": "#/$defs/Units",
                "default": "metric",
            },
            "where": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}], "default": None},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
            "detail": {"enum": ["long", "short"], "default": "short"},
        },
        "required": ["city"],
        "additionalProperties": False,
        "$defs": {
            "Point": {
                "title": "Point",
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
            },
            "Units": {"title": "Units", "enum": ["imperial", "metric"]},
        },
    }
    # The spec is plain JSON data, as it goes over the wire.
    assert msgspec.json.decode(msgspec.json.encode(spec), type=ToolSpec) == spec


def test_schema_without_nested_types_has_no_defs_and_no_title() -> None:
    @tool
    def add(a: int, b: float = 0.5, *, label: str | None = None) -> float:
        """Add two numbers."""
        return a + b

    assert add.spec.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "number", "default": 0.5},
            "label": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    assert add.description == "Add two numbers."


def test_tool_without_parameters_or_docstring() -> None:
    @tool
    async def ping() -> str:
        return "pong"

    assert ping.description == ""
    assert ping.spec.parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


def test_annotated_description_and_constraints_win_over_the_docstring() -> None:
    @tool
    def pick(
        count: Annotated[int, msgspec.Meta(ge=1, le=10, description="From the type.")],
        word: Annotated[str, msgspec.Meta(min_length=2)],
    ) -> None:
        """Pick things.

        Arguments:
            count: From the docstring.
            word: A word
                of two letters or more.
        """

    assert pick.spec.parameters["properties"] == {
        "count": {"description": "From the type.", "type": "integer", "minimum": 1, "maximum": 10},
        "word": {"description": "A word of two letters or more.", "type": "string", "minLength": 2},
    }


def test_argument_type_named_like_the_tool_keeps_its_own_definition() -> None:
    @tool(name="Point")
    def locate(point: Point) -> None:
        """Locate a point."""

    parameters = locate.spec.parameters
    assert parameters["required"] == ["point"]
    ref = parameters["properties"]["point"]["$ref"]
    assert ref.startswith("#/$defs/")
    assert set(parameters["$defs"]) == {ref.removeprefix("#/$defs/")}


# --- the decorator --------------------------------------------------------------------


def test_bare_decorator_reads_everything_from_the_function() -> None:
    assert isinstance(get_weather, Tool)
    assert get_weather.name == "get_weather"
    assert get_weather.is_async
    assert get_weather.timeout is None
    assert get_weather.retries == 0
    assert get_weather.max_result_chars == 20_000
    assert "get_weather" in repr(get_weather)
    assert "async" in repr(get_weather)


def test_decorator_with_options() -> None:
    limiter = anyio.CapacityLimiter(2)

    @tool(
        name="lookup-v2",
        description="Look a word up.",
        timeout=2,
        retries=3,
        retry_delay=0.5,
        max_result_chars=500,
        limiter=limiter,
    )
    def lookup(word: str) -> str:
        """Ignored, since a description is given."""
        return word

    assert isinstance(lookup, Tool)
    assert (lookup.name, lookup.spec.name) == ("lookup-v2", "lookup-v2")
    assert (lookup.description, lookup.spec.description) == ("Look a word up.",) * 2
    assert (lookup.timeout, lookup.retries, lookup.retry_delay) == (2.0, 3, 0.5)
    assert (lookup.max_result_chars, lookup.limiter) == (500, limiter)
    assert not lookup.is_async
    assert "sync" in repr(lookup)

    @tool()
    def empty_parentheses(word: str) -> str:
        return word

    assert empty_parentheses.name == "empty_parentheses"


async def test_tool_stays_callable_like_the_function() -> None:
    assert await get_weather("Oslo", days=2) == "Oslo: sunny for 2 day(s)"

    @tool
    def shout(word: str) -> str:
        return word.upper()

    assert shout("hi") == "HI"
    assert shout.__wrapped__("ho") == "HO"


async def test_callable_object_and_partial_become_tools() -> None:
    import functools

    class Multiplier:
        """Multiply a number."""

        async def __call__(self, x: int) -> int:
            return x * 3

    def power(base: int, exponent: int) -> int:
        """Raise to a power."""
        return int(base**exponent)

    times = tool(Multiplier())
    assert (times.name, times.description, times.is_async) == (
        "Multiplier",
        "Multiply a number.",
        True,
    )
    assert (await times.invoke(call("Multiplier", '{"x": 4}'))).content == "12"

    square = tool(functools.partial(power, exponent=2), name="square")
    assert square.spec.parameters["properties"] == {
        "base": {"type": "integer"},
        "exponent": {"type": "integer", "default": 2},
    }
    assert (await square.invoke(call("square", '{"base": 7}'))).content == "49"


# --- definition errors ----------------------------------------------------------------


def no_annotation(city, days: int) -> str:  # type: ignore[no-untyped-def]
    return str(city)


def var_args(*cities: str) -> None: ...


def var_kwargs(city: str, **options: str) -> None: ...


def positional_only(city: str, /) -> None: ...


def unsupported_type(handler: Unsupported) -> None: ...


def untagged_union(shape: Circle | Square) -> None: ...


def mutable_default(tags: list[str] = ["a"]) -> None: ...  # noqa: B006


def unresolved(thing: Missing) -> None: ...  # type: ignore[name-defined]  # noqa: F821


def generator(n: int) -> Iterator[int]:
    yield n


def plain(city: str) -> str:
    return city


@pytest.mark.parametrize(
    ("target", "fragments"),
    [
        pytest.param(
            no_annotation,
            ["no_annotation", "parameter 'city' has no type annotation", "'city: str'"],
            id="no-annotation",
        ),
        pytest.param(var_args, ["var_args", "'*cities'", "named parameters"], id="var-args"),
        pytest.param(
            var_kwargs, ["var_kwargs", "'**options'", "named parameters"], id="var-kwargs"
        ),
        pytest.param(
            positional_only,
            ["positional_only", "'city' is positional-only", "remove the '/'"],
            id="positional-only",
        ),
        pytest.param(
            unsupported_type,
            ["unsupported_type", "parameter 'handler'", "Unsupported", "JSON-friendly types"],
            id="unsupported-type",
        ),
        pytest.param(
            untagged_union,
            ["untagged_union", "parameter 'shape'", "JSON-friendly types"],
            id="untagged-union",
        ),
        pytest.param(
            mutable_default, ["mutable_default", "default must be immutable"], id="mutable"
        ),
        pytest.param(unresolved, ["unresolved", "Missing", "cannot be resolved"], id="unresolved"),
        pytest.param(generator, ["generator", "generator function"], id="generator"),
        pytest.param(42, ["42", "not callable", "decorate a function"], id="not-callable"),
        pytest.param("weather", ["did you mean @tool(name='weather')"], id="string"),
        pytest.param(Unsupported, ["is a class", "decorate a function"], id="class"),
        pytest.param(get_weather, ["already the tool 'get_weather'"], id="already-a-tool"),
        pytest.param(lambda: None, ["'<lambda>' is not valid", "@tool(name=...)"], id="lambda"),
    ],
)
def test_definition_errors_name_the_function_and_the_problem(
    target: Any, fragments: list[str]
) -> None:
    with pytest.raises(ToolDefinitionError) as caught:
        tool(target)
    message = str(caught.value)
    assert message.startswith("cannot make a tool of ")
    for fragment in fragments:
        assert fragment in message
    assert isinstance(caught.value, FractorError)
    assert isinstance(caught.value, TypeError)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"timeout": 0}, "timeout=0 is not allowed"),
        ({"timeout": -1.5}, "timeout=-1.5 is not allowed"),
        ({"timeout": math.nan}, "timeout=nan is not allowed"),
        ({"timeout": "5"}, "timeout='5' is not allowed"),
        ({"retries": -1}, "retries=-1 is not allowed"),
        ({"retries": 1.5}, "retries=1.5 is not allowed"),
        ({"retries": True}, "retries=True is not allowed"),
        ({"retry_delay": -0.1}, "retry_delay=-0.1 is not allowed"),
        ({"retry_delay": math.inf}, "retry_delay=inf is not allowed"),
        ({"max_result_chars": 99}, "max_result_chars=99 is not allowed"),
        ({"name": ""}, "the name is empty"),
        ({"name": "get weather"}, "the name 'get weather' is not valid"),
        ({"name": "x" * 65}, "is not valid"),
        ({"name": "ok\n"}, "is not valid"),
        ({"name": "météo"}, "is not valid"),
        ({"limiter": 4}, "limiter=4 is not an anyio.CapacityLimiter"),
        ({"description": 3}, "description=3 is not text"),
    ],
)
def test_bad_options_are_refused_at_decoration(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ToolDefinitionError, match="cannot make a tool of function") as caught:
        tool(**options)(plain)
    assert fragment in str(caught.value)
    assert "plain" in str(caught.value)


def test_limits_of_options_are_accepted() -> None:
    edge = tool(name="a" * 64, timeout=0.001, retries=0, retry_delay=0, max_result_chars=100)(plain)
    assert (edge.name, edge.timeout, edge.max_result_chars) == ("a" * 64, 0.001, 100)


# --- invoking -------------------------------------------------------------------------


async def test_valid_call_of_an_async_tool() -> None:
    outcome = await get_weather.invoke(call("get_weather", '{"city": "Paris", "days": 3}'))
    assert outcome == ToolOutcome(
        call=call("get_weather", '{"city": "Paris", "days": 3}'),
        content="Paris: sunny for 3 day(s)",
        is_error=False,
        seconds=outcome.seconds,
        attempts=1,
    )
    assert outcome.seconds >= 0


async def test_async_tool_runs_in_the_callers_task_and_sync_tool_in_a_worker_thread() -> None:
    seen: dict[str, int] = {}

    @tool
    async def where_async() -> None:
        seen["async"] = threading.get_ident()

    @tool
    def where_sync() -> None:
        seen["sync"] = threading.get_ident()

    loop_thread = threading.get_ident()
    assert not (await where_async.invoke(call("where_async"))).is_error
    assert not (await where_sync.invoke(call("where_sync"))).is_error
    assert seen["async"] == loop_thread
    assert seen["sync"] != loop_thread


async def test_sync_tool_with_arguments_returns_its_value() -> None:
    @tool
    def repeat(word: str, times: int = 2) -> str:
        return word * times

    outcome = await repeat.invoke(call("repeat", '{"word": "ab", "times": 3}'))
    assert (outcome.content, outcome.is_error, outcome.attempts) == ("ababab", False, 1)


async def test_sync_tool_threads_are_bounded_by_its_limiter() -> None:
    limiter = anyio.CapacityLimiter(1)
    entered, release = threading.Event(), threading.Event()
    running: list[int] = []

    @tool(limiter=limiter)
    def blocking(n: int) -> int:
        running.append(n)
        entered.set()
        release.wait(10)
        return n

    outcomes: list[ToolOutcome] = []

    async def run(n: int) -> None:
        outcomes.append(await blocking.invoke(call("blocking", f'{{"n": {n}}}')))

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, 1)
                tg.start_soon(run, 2)
                await anyio.to_thread.run_sync(entered.wait)
                await wait_all_tasks_blocked()
                assert len(running) == 1
                assert limiter.borrowed_tokens == 1
                assert limiter.statistics().tasks_waiting == 1
                release.set()
    finally:
        release.set()
    assert sorted(outcome.content for outcome in outcomes) == ["1", "2"]


@pytest.mark.parametrize("arguments", ["", "   ", "{}"])
async def test_empty_arguments_count_as_an_empty_object(arguments: str) -> None:
    @tool
    async def defaults_only(n: int = 5) -> int:
        return n

    outcome = await defaults_only.invoke(call("defaults_only", arguments))
    assert (outcome.is_error, outcome.content, outcome.attempts) == (False, "5", 1)


async def test_empty_arguments_with_a_required_parameter_say_what_is_missing() -> None:
    outcome = await get_weather.invoke(call("get_weather", ""))
    assert outcome.is_error
    assert outcome.attempts == 0
    assert "invalid arguments for tool 'get_weather'" in outcome.content
    assert "missing required field `city`" in outcome.content


class Counted:
    """A tool body that counts its calls, to prove invalid arguments never reach it."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, days: int) -> int:
        self.calls += 1
        return days


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        pytest.param(
            "{days: 1}",
            ["the arguments are not valid JSON", "JSON is malformed"],
            id="bad-json",
        ),
        pytest.param('{"days": 1', ["not valid JSON", "truncated"], id="truncated-json"),
        pytest.param('{"days": "3"}', ["Expected `int`, got `str` - at `$.days`"], id="type"),
        pytest.param("{}", ["Object missing required field `days`"], id="missing"),
        pytest.param('{"days": 1, "city": "x"}', ["unknown field `city`"], id="extra"),
        pytest.param("[1]", ["Expected `object`, got `array`"], id="not-an-object"),
        pytest.param('{"days": true}', ["Expected `int`, got `bool`"], id="bool-for-int"),
    ],
)
async def test_invalid_arguments_become_an_error_that_shows_the_schema(
    arguments: str, fragments: list[str]
) -> None:
    body = Counted()
    counted = tool(body, name="counted", retries=3)
    outcome = await counted.invoke(call("counted", arguments))
    assert outcome.is_error
    assert outcome.attempts == 0
    assert body.calls == 0, "invalid arguments must never reach the tool, nor be retried"
    assert outcome.content.startswith("invalid arguments for tool 'counted': ")
    for fragment in fragments:
        assert fragment in outcome.content
    expected = outcome.content.split("Expected arguments: ", 1)[1]
    assert json.loads(expected) == counted.spec.parameters


async def test_raising_tool_becomes_an_error_outcome() -> None:
    @tool
    async def lookup(city: str) -> str:
        raise ValueError(f"no such city: {city}")

    @tool
    def quiet() -> None:
        raise KeyError

    outcome = await lookup.invoke(call("lookup", '{"city": "Atlantis"}'))
    assert outcome.is_error
    assert outcome.attempts == 1
    assert outcome.content == "tool 'lookup' failed: ValueError: no such city: Atlantis"
    quiet_outcome = await quiet.invoke(call("quiet"))
    assert (quiet_outcome.is_error, quiet_outcome.content) == (
        True,
        "tool 'quiet' failed: KeyError",
    )


async def test_retries_succeed_on_the_third_attempt() -> None:
    attempts: list[int] = []

    @tool(retries=3)
    async def flaky() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise ConnectionError(f"attempt {len(attempts)} failed")
        return "ok"

    outcome = await flaky.invoke(call("flaky"))
    assert (outcome.content, outcome.is_error, outcome.attempts) == ("ok", False, 3)
    assert attempts == [1, 2, 3]


async def test_retries_exhausted_report_the_last_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []

    async def fake_sleep(delay: float) -> None:
        pauses.append(delay)
        await checkpoint()

    monkeypatch.setattr(anyio, "sleep", fake_sleep)
    calls: list[int] = []

    @tool(retries=3, retry_delay=0.25)
    def always_fails() -> None:
        calls.append(1)
        raise RuntimeError(f"failure {len(calls)}")

    outcome = await always_fails.invoke(call("always_fails"))
    assert outcome.is_error
    assert outcome.attempts == 4
    assert len(calls) == 4
    assert outcome.content == (
        "tool 'always_fails' failed: RuntimeError: failure 4 (gave up after 4 attempts)"
    )
    assert pauses == [0.25, 0.5, 1.0]


async def test_timeout_with_retries_exhausted() -> None:
    started: list[int] = []

    @tool(timeout=0.02, retries=2)
    async def stuck() -> str:
        started.append(1)
        await anyio.sleep(10)
        return "never"

    with anyio.fail_after(5):
        outcome = await stuck.invoke(call("stuck"))
    assert outcome.is_error
    assert outcome.attempts == 3
    assert len(started) == 3
    assert outcome.content == "tool 'stuck' timed out after 0.02 s (gave up after 3 attempts)"
    assert outcome.seconds > 0


async def test_timeout_of_a_sync_tool_abandons_its_thread() -> None:
    release = threading.Event()

    @tool(timeout=0.05)
    def blocked() -> str:
        release.wait(10)
        return "late"

    try:
        with anyio.fail_after(5):
            outcome = await blocked.invoke(call("blocked"))
    finally:
        release.set()
    assert (outcome.is_error, outcome.attempts) == (True, 1)
    assert outcome.content == "tool 'blocked' timed out after 0.05 s"


async def test_a_timeout_error_raised_by_the_tool_is_a_failure_not_a_timeout() -> None:
    @tool(timeout=5)
    async def remote() -> None:
        raise TimeoutError("upstream did not answer")

    outcome = await remote.invoke(call("remote"))
    assert outcome.content == "tool 'remote' failed: TimeoutError: upstream did not answer"


async def test_outer_cancellation_is_never_swallowed() -> None:
    entered = anyio.Event()

    @tool(timeout=10, retries=5)
    async def forever() -> None:
        entered.set()
        await anyio.sleep_forever()

    outcomes: list[ToolOutcome] = []

    async def run() -> None:
        outcomes.append(await forever.invoke(call("forever")))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await entered.wait()
            tg.cancel_scope.cancel()
    assert outcomes == []

    with pytest.raises(TimeoutError), anyio.fail_after(0.05):
        await forever.invoke(call("forever"))


@pytest.mark.parametrize(
    ("value", "content"),
    [
        pytest.param({"temp": 21.5, "sky": ["clear"]}, '{"temp":21.5,"sky":["clear"]}', id="dict"),
        pytest.param(
            Forecast(city="Oslo", temperatures=(1.0, 2.5)),
            '{"city":"Oslo","temperatures":[1.0,2.5]}',
            id="struct",
        ),
        pytest.param(Reading("t1", 3.0), '{"sensor":"t1","value":3.0}', id="dataclass"),
        pytest.param(None, "", id="none"),
        pytest.param(42, "42", id="int"),
        pytest.param([1, "a", None], '[1,"a",null]', id="list"),
        pytest.param(True, "true", id="bool"),
        pytest.param("already text", "already text", id="str"),
        pytest.param(Unsupported, repr(Unsupported), id="unencodable"),
    ],
)
async def test_return_values_become_text(value: Any, content: str) -> None:
    @tool
    async def give() -> Any:
        return value

    @tool
    def give_sync() -> Any:
        return value

    for tool_, name in ((give, "give"), (give_sync, "give_sync")):
        outcome = await tool_.invoke(call(name))
        assert (outcome.content, outcome.is_error) == (content, False)


@pytest.mark.parametrize("length", [100, 101, 150, 999, 10_000, 1_234_567])
async def test_long_results_are_cut_with_a_visible_marker(length: int) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(length))

    @tool(max_result_chars=100)
    async def long_result() -> str:
        return text

    content = (await long_result.invoke(call("long_result"))).content
    assert len(content) <= 100
    if length <= 100:
        assert content == text
        return
    kept, marker = content.split("\n[... truncated ", 1)
    assert text.startswith(kept)
    assert marker == f"{length - len(kept):,} characters of {length:,}]"
    assert len(kept) >= 40


async def test_default_result_cap_and_error_messages_are_cut_too() -> None:
    @tool
    async def huge() -> str:
        return "x" * 32_345

    @tool(max_result_chars=200)
    async def loud() -> None:
        raise ValueError("y" * 5_000)

    content = (await huge.invoke(call("huge"))).content
    assert len(content) <= 20_000
    assert content.endswith(" characters of 32,345]")
    error = await loud.invoke(call("loud"))
    assert error.is_error
    assert len(error.content) <= 200
    assert error.content.startswith("tool 'loud' failed: ValueError: yyy")
    full = len("tool 'loud' failed: ValueError: ") + 5_000
    assert error.content.endswith(f"characters of {full:,}]")


# --- toolbox --------------------------------------------------------------------------


@tool
async def alpha(x: int) -> int:
    """First."""
    return x + 1


@tool
def beta(word: str) -> str:
    """Second."""
    return word[::-1]


def test_toolbox_keeps_the_order_and_answers_lookups() -> None:
    box = Toolbox([beta, alpha, get_weather])
    assert box.names == ("beta", "alpha", "get_weather")
    assert box.specs == (beta.spec, alpha.spec, get_weather.spec)
    assert len(box) == 3
    assert "alpha" in box
    assert "gamma" not in box
    assert box.get("beta") is beta
    assert box.get("gamma") is None
    assert list(box) == [beta, alpha, get_weather]
    assert len(Toolbox()) == 0


def test_toolbox_wraps_plain_functions() -> None:
    box = Toolbox([plain])
    found = box.get("plain")
    assert isinstance(found, Tool)
    assert found.fn is plain


def test_toolbox_refuses_duplicate_names() -> None:
    other_alpha = tool(name="alpha")(plain)
    with pytest.raises(ToolDefinitionError) as caught:
        Toolbox([alpha, beta, other_alpha, tool(name="beta")(plain), tool(name="beta")(plain)])
    message = str(caught.value)
    assert "'alpha' (2 times)" in message
    assert "'beta' (3 times)" in message
    assert "unique name" in message


async def test_toolbox_runs_calls_and_answers_unknown_tools() -> None:
    box = Toolbox([alpha, beta])
    assert (await box.run(call("alpha", '{"x": 1}'))).content == "2"
    assert (await box.run(call("beta", '{"word": "abc"}'))).content == "cba"
    unknown = await box.run(call("gamma", '{"x": 1}', id="call-9"))
    assert unknown == ToolOutcome(
        call=call("gamma", '{"x": 1}', id="call-9"),
        content="unknown tool 'gamma'; available tools: alpha, beta",
        is_error=True,
        seconds=0.0,
        attempts=0,
    )
    empty = await Toolbox().run(call("gamma"))
    assert (empty.content, empty.is_error) == (
        "unknown tool 'gamma'; this agent has no tools",
        True,
    )


# --- concurrency and properties -------------------------------------------------------


@tool
async def echo(a: int, b: str = "x", c: list[float] | None = None) -> dict[str, Any]:
    return {"a": a, "b": b, "c": c}


@tool(name="echo_sync")
def echo_sync(a: int, b: str = "x", c: list[float] | None = None) -> dict[str, Any]:
    return {"a": a, "b": b, "c": c}


def is_valid_echo_call(arguments: dict[str, Any]) -> bool:
    """What msgspec should accept for ``echo``, written out by hand."""
    if not set(arguments) <= {"a", "b", "c"} or type(arguments.get("a")) is not int:
        return False
    if "b" in arguments and type(arguments["b"]) is not str:
        return False
    c = arguments.get("c")
    return c is None or (isinstance(c, list) and all(type(item) in (int, float) for item in c))


text = st.text(st.characters(codec="utf-8"), max_size=4)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
valid_arguments = st.fixed_dictionaries(
    {"a": st.integers()},
    optional={
        "b": text,
        "c": st.none() | st.lists(st.integers(-(2**53), 2**53) | st.floats(-1e300, 1e300)),
    },
)
any_arguments = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]) | text, json_values)


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(valid_arguments | any_arguments, min_size=1, max_size=6))
async def test_invoke_never_raises_and_fails_exactly_on_invalid_arguments(
    batch: list[dict[str, Any]],
) -> None:
    outcomes: dict[str, ToolOutcome] = {}

    async def run(
        invoke: Callable[[ToolCall], Awaitable[ToolOutcome]], tool_call: ToolCall
    ) -> None:
        outcomes[tool_call.id] = await invoke(tool_call)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for index, arguments in enumerate(batch):
                payload = json.dumps(arguments)
                tg.start_soon(run, echo.invoke, call("echo", payload, id=f"async-{index}"))
                tg.start_soon(run, echo_sync.invoke, call("echo_sync", payload, id=f"sync-{index}"))

    assert len(outcomes) == 2 * len(batch)
    for index, arguments in enumerate(batch):
        valid = is_valid_echo_call(arguments)
        for kind in ("async", "sync"):
            outcome = outcomes[f"{kind}-{index}"]
            assert outcome.call.id == f"{kind}-{index}"
            assert outcome.is_error is not valid, (arguments, outcome.content)
            if valid:
                c = arguments.get("c")
                assert json.loads(outcome.content) == {
                    "a": arguments["a"],
                    "b": arguments.get("b", "x"),
                    "c": None if c is None else [float(item) for item in c],
                }
                assert outcome.attempts == 1
            else:
                assert outcome.attempts == 0
                assert outcome.content.startswith("invalid arguments for tool ")


async def test_many_concurrent_calls_each_get_their_own_outcome() -> None:
    box = Toolbox([echo, echo_sync])
    outcomes: list[ToolOutcome] = []

    async def run(tool_call: ToolCall) -> None:
        outcomes.append(await box.run(tool_call))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(300):
                name = "echo" if i % 3 else "echo_sync"
                tg.start_soon(run, call(name, f'{{"a": {i}, "b": "n{i}"}}', id=str(i)))
    assert len(outcomes) == 300
    for outcome in outcomes:
        i = int(outcome.call.id)
        assert not outcome.is_error
        assert json.loads(outcome.content) == {"a": i, "b": f"n{i}", "c": None}


async def test_with_function_keeps_every_option_around_another_function() -> None:
    limiter = anyio.CapacityLimiter(3)

    @tool(name="scaled", timeout=2, retries=1, retry_delay=0.5, max_result_chars=400)
    def scale(x: int) -> int:
        """Scales x."""
        return x * 2

    scale_with_limiter = tool(scale.fn, name="limited", limiter=limiter)
    calls: list[int] = []

    def counted(x: int) -> int:
        calls.append(x)
        return scale.fn(x)

    wrapped = scale.with_function(counted)
    assert (wrapped.name, wrapped.description, wrapped.timeout) == ("scaled", "Scales x.", 2.0)
    assert (wrapped.retries, wrapped.retry_delay, wrapped.max_result_chars) == (1, 0.5, 400)
    assert wrapped.spec == scale.spec
    assert scale_with_limiter.with_function(counted).limiter is limiter
    outcome = await wrapped.invoke(call("scaled", '{"x": 4}'))
    assert outcome.content == "8"
    assert calls == [4]


async def test_a_step_awaiting_a_tool_itself_answers_as_invoke_does() -> None:
    """A step with one call to an async tool without timeout or retries awaits the
    tool itself (``Tool.direct``) unless the tree is observed: both ways give the same
    outcomes, for a result, a cut result, an error and invalid arguments."""
    from fractor.actors import Agent, ScriptedModel, call, reply
    from fractor.runtime import Runtime

    @tool(max_result_chars=100)
    async def echo(words: str) -> str:
        """Repeats the words, or fails on "boom"."""
        if words == "boom":
            raise ValueError("boom \ud800")
        return words * 3

    assert echo.direct
    assert not tool(timeout=1)(echo.fn).direct
    turns = [
        call("echo", words="hi"),
        call("echo", words="x" * 200),
        call("echo", words="boom"),
        call("echo", wrong=1),
        reply("done"),
    ]

    async def outcomes(observed: bool) -> list[tuple[str, bool, int]]:
        async with Runtime() as rt:
            ref = await rt.spawn(Agent("a", ScriptedModel(turns), tools=[echo]))
            if observed:
                async with rt.events():
                    await ref.ask("go")
            else:
                await ref.ask("go")
            (trace,) = await ref.trace()
        return [(o.content, o.is_error, o.attempts) for step in trace.steps for o in step.outcomes]

    direct, invoked = await outcomes(False), await outcomes(True)
    assert direct == invoked
    assert [o[1] for o in direct] == [False, False, True, True]
    assert direct[0][0] == "hihihi"
    assert "boom \ufffd" in direct[2][0]
    assert direct[3][2] == 0  # invalid arguments: no attempt


async def test_a_step_awaiting_a_tool_itself_passes_its_arguments_as_invoke_does() -> None:
    """A tool the step awaits itself gets its arguments by position when every
    parameter may be given so (defaults and all, in the signature's order) and by
    keyword when one is keyword-only: either way what ``invoke`` gives it, invalid
    arguments answered with the same error."""
    from fractor.actors import Agent, ScriptedModel, call, reply
    from fractor.runtime import Runtime

    @tool
    async def place(first: str, second: int = 2, third: str = "c") -> str:
        """Says its arguments in order."""
        return f"{first}/{second}/{third}"

    @tool
    async def named(first: str, *, second: int = 2, third: str = "c") -> str:
        """Says its arguments in order; two of them by keyword only."""
        return f"{first}/{second}/{third}"

    @functools.wraps(place.fn)
    async def by_keyword(**kwargs: Any) -> str:  # shows place's signature, takes keywords
        return str(await place.fn(**kwargs))

    wrapped = tool(by_keyword, name="wrapped")
    turns = [
        call(name, **arguments)
        for name in ("place", "named", "wrapped")
        for arguments in (
            {"first": "a"},
            {"third": "z", "first": "a"},
            {"second": 7, "first": "a", "third": "y"},
            {"second": "not a number", "first": "a"},
            {"first": "a", "fourth": 1},
        )
    ]
    turns.append(reply("done"))

    async def outcomes(observed: bool) -> list[tuple[str, bool]]:
        async with Runtime() as rt:
            agent = Agent("a", ScriptedModel(turns), tools=[place, named, wrapped])
            ref = await rt.spawn(agent)
            if observed:
                async with rt.events():
                    await ref.ask("go")
            else:
                await ref.ask("go")
            (trace,) = await ref.trace()
        return [(o.content, o.is_error) for step in trace.steps for o in step.outcomes]

    assert place.direct
    assert named.direct
    assert wrapped.direct
    direct, invoked = await outcomes(False), await outcomes(True)
    assert direct == invoked
    expected = ["a/2/c", "a/2/z", "a/7/y"]
    for shown in (direct[:5], direct[5:10], direct[10:]):
        assert [content for content, _ in shown[:3]] == expected
        assert [error for _, error in shown] == [False, False, False, True, True]
        assert "invalid arguments for tool" in shown[3][0]


class Abort(BaseException):
    """A user's exception that is not an ``Exception``."""


async def test_which_base_exceptions_are_a_calls_own_failure() -> None:
    from fractor.actors._tools._tool import own_failure

    assert own_failure(ValueError("x"))
    assert own_failure(Abort("stop"))
    assert own_failure(BaseExceptionGroup("g", [Abort(), ValueError()]))
    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(exc)
            raise
    for ending in (KeyboardInterrupt(), SystemExit(1), GeneratorExit(), *caught):
        assert not own_failure(ending)
        assert not own_failure(BaseExceptionGroup("g", [Abort(), ending]))
    assert len(caught) == 1


async def test_a_tool_raising_a_base_exception_fails_its_call_and_the_tree_goes_on() -> None:
    # Issue 40 item 19: ``class Abort(BaseException)`` raised by a tool killed the
    # whole runtime; it is the tool's failure: that call fails, the step goes on.
    from fractor.actors import Agent, ScriptedModel, calls, reply
    from fractor.actors import call as step_call
    from fractor.runtime import Runtime

    @tool
    async def direct(why: str) -> str:
        """Awaited by the step itself."""
        raise Abort(why)

    @tool(timeout=5, retries=1)
    async def invoked(why: str) -> str:
        """Run through invoke (a timeout and retries)."""
        raise Abort(why)

    @tool
    def threaded(why: str) -> str:
        """Run in a worker thread."""
        raise Abort(why)

    assert direct.direct
    turns = [
        step_call("direct", why="one"),
        calls(step_call("invoked", why="two"), step_call("threaded", why="three")),
        reply("done"),
    ]
    for observed in (False, True):
        async with Runtime() as rt:
            ref = await rt.spawn(
                Agent("a", ScriptedModel(turns), tools=[direct, invoked, threaded])
            )
            with anyio.fail_after(10):
                if observed:
                    async with rt.events():
                        result = await ref.ask("go")
                else:
                    result = await ref.ask("go")
            (trace,) = await ref.trace()
        assert result.status == "completed", result.stop_reason
        contents = [o.content for step in trace.steps for o in step.outcomes]
        assert contents == [
            "tool 'direct' failed: Abort: one",
            "tool 'invoked' failed: Abort: two (gave up after 2 attempts)",
            "tool 'threaded' failed: Abort: three",
        ]
