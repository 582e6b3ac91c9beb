"""OpenTelemetry spans (``actors.integrations.otel``): the span tree is the agent tree.

Spans go to the SDK's in-memory exporter through a ``TracerProvider`` passed
explicitly (never the global one). A run with parallel subagents, two levels deep,
is checked node for node against ``rt.tree()``; then the attributes, the contents
(absent unless asked for), a canary API key (absent always) and the default (off:
no listener, no spans).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import pathlib
import re
import time
import tomllib
from collections.abc import Iterator
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from structlog.testing import capture_logs

from fractor.actors import (
    Agent,
    Compaction,
    RequestStart,
    RestartPolicy,
    RetryPolicy,
    ScriptedModel,
    call,
    calls,
    fail,
    reply,
    tool,
)
from fractor.actors._execution._calling import progress_reporter
from fractor.actors.integrations import otel
from fractor.actors.providers import OpenAIModel
from fractor.runtime import Budget, Event, EventBus, EventDetail, Runtime, TreeSnapshot

from ..loopback import LoopbackServer, json_reply
from ..providers.wires import completion
from ..sample_tools import stepped

CANARY = "sk-canary-0tel-9d41c7e2a6b3"
ROOT = pathlib.Path(__file__).parents[3]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def team() -> Agent:
    """A lead with three subagent calls in one step (two researchers and an editor,
    run in parallel), the editor with a checker of its own: three levels."""
    researcher = Agent(
        "researcher",
        stepped(call("lookup", topic="tides"), reply("the moon drives tides")),
        tools=[lookup],
        description="Researches one topic.",
        budget=Budget(steps=5, tool_calls=3),
    )
    checker = Agent("checker", stepped(reply("checked")), description="Checks a claim.")
    editor = Agent(
        "editor",
        stepped(call("checker", task="check the claim"), reply("edited")),
        subagents=[checker],
        description="Edits a text.",
    )
    return Agent(
        "lead",
        ScriptedModel(
            [
                calls(
                    call("researcher", task="research tides", id="c-r1"),
                    call("researcher", task="research waves", id="c-r2"),
                    call("editor", task="edit the report", id="c-e"),
                ),
                reply("the report is done"),
            ]
        ),
        subagents=[researcher, editor],
        budget=Budget(tokens=100_000, tool_calls=20),
    )


def operation(span: ReadableSpan) -> object:
    return (span.attributes or {}).get("gen_ai.operation.name")


def by_operation(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if operation(span) == name]


def every_value(spans: tuple[ReadableSpan, ...]) -> list[str]:
    """Every attribute value, event attribute and status text of ``spans``, as text."""
    seen: list[str] = []
    for span in spans:
        seen.append(span.name)
        seen.extend(str(value) for value in (span.attributes or {}).values())
        seen.append(span.status.description or "")
        for event in span.events:
            seen.append(event.name)
            seen.extend(str(value) for value in (event.attributes or {}).values())
    return seen


async def run_team(
    provider: TracerProvider, *, capture_content: bool = False
) -> tuple[TreeSnapshot, int]:
    """Run the team under a caller's span; the tree and the caller's span id."""
    tracer = provider.get_tracer("the caller")
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider, capture_content=capture_content):
            ref = await rt.spawn(team())
            with tracer.start_as_current_span("the caller's request") as caller:
                result = await ref.ask("write a report on the sea")
            tree = rt.tree()
    assert result.status == "completed", result.stop_reason
    return tree, caller.get_span_context().span_id


async def test_the_span_tree_is_the_agent_tree(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tree, caller_id = await run_team(provider)
    spans = exporter.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans if span.context is not None}
    executions = {
        str((span.attributes or {})["fractor.node_id"]): span
        for span in by_operation(spans, "invoke_agent")
    }
    nodes = {node.id: node for node in tree.nodes if node.id != "root"}
    assert len(nodes) == 5  # the lead, two researchers, the editor, its checker
    assert set(executions) == set(nodes)  # node for node
    assert len(by_operation(spans, "invoke_agent")) == 5
    for node_id, node in nodes.items():
        span = executions[node_id]
        attributes = span.attributes or {}
        assert span.name == f"invoke_agent {node.name}"
        assert attributes["gen_ai.agent.name"] == node.name
        assert attributes["fractor.depth"] == node.depth
        assert attributes["fractor.agent_id"] == node.actor_id
        assert attributes["fractor.status"] == "completed"
        assert attributes["fractor.stop_reason"] == "final answer"
        assert span.parent is not None
        if node.parent_id == "root":  # the caller's span is the root execution's parent
            assert span.parent.span_id == caller_id
            assert span.context is not None
            assert span.parent.trace_id == span.context.trace_id
            continue
        # A subagent's execution hangs under the tool call that spawned it, which
        # hangs under its parent's execution.
        call_span = by_id[span.parent.span_id]
        call_attributes = call_span.attributes or {}
        assert call_attributes["gen_ai.operation.name"] == "execute_tool"
        assert call_attributes["gen_ai.tool.name"] == node.name
        assert call_attributes["fractor.child_node_id"] == node_id
        assert call_span.parent is not None
        assert call_span.parent.span_id == executions[str(node.parent_id)].context.span_id
    # The lead's three subagent calls keep the ids the model gave them.
    lead = next(node for node in nodes.values() if node.name == "lead")
    lead_calls = [
        span
        for span in by_operation(spans, "execute_tool")
        if (span.attributes or {})["fractor.node_id"] == lead.id
    ]
    assert sorted(str((s.attributes or {})["gen_ai.tool.call.id"]) for s in lead_calls) == [
        "c-e",
        "c-r1",
        "c-r2",
    ]
    # The two researchers ran in parallel: their calls overlap in time.
    first, second = sorted(
        (s for s in lead_calls if (s.attributes or {})["gen_ai.tool.name"] == "researcher"),
        key=lambda s: s.start_time or 0,
    )
    assert (first.end_time or 0) > (second.start_time or 0)


async def test_spans_carry_the_documented_attributes(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await run_team(provider)
    spans = exporter.get_finished_spans()
    chats = by_operation(spans, "chat")
    # Two requests per execution, except the checker's one: 2 + 2 + 2 + 2 + 1.
    assert len(chats) == 9
    for chat in chats:
        attributes = chat.attributes or {}
        assert chat.kind is SpanKind.CLIENT
        assert chat.name == f"chat {attributes['gen_ai.request.model']!s}"
        assert attributes["gen_ai.response.model"]
        assert attributes["gen_ai.usage.input_tokens"] > 0  # type: ignore[operator]
        assert "gen_ai.usage.output_tokens" in attributes
        assert attributes["gen_ai.response.finish_reasons"] in (("stop",), ("tool_calls",))
        assert chat.parent is not None
        assert chat.start_time is not None
        assert chat.end_time is not None
        assert chat.start_time <= chat.end_time
    lookups = [s for s in by_operation(spans, "execute_tool") if s.name == "execute_tool lookup"]
    assert len(lookups) == 2
    for span in lookups:
        attributes = span.attributes or {}
        assert attributes["gen_ai.tool.name"] == "lookup"
        assert attributes["gen_ai.tool.call.id"]
        assert span.status.status_code is not StatusCode.ERROR
    lead = next(s for s in by_operation(spans, "invoke_agent") if s.name == "invoke_agent lead")
    assert (lead.attributes or {})["fractor.budget.tokens"] == 100_000
    assert (lead.attributes or {})["fractor.budget.tool_calls"] == 20
    researcher = next(
        s for s in by_operation(spans, "invoke_agent") if s.name == "invoke_agent researcher"
    )
    assert (researcher.attributes or {})["fractor.budget.steps"] == 5
    assert (researcher.attributes or {})["gen_ai.agent.id"]
    # Every execution span starts before and ends after the spans below it.
    by_id = {span.context.span_id: span for span in spans if span.context is not None}
    for span in spans:
        if span.parent is not None and span.parent.span_id in by_id:
            above = by_id[span.parent.span_id]
            assert (above.start_time or 0) <= (span.start_time or 0)
            assert (span.end_time or 0) <= (above.end_time or 0)


CONTENT_KEYS = (
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "input.value",
    "output.value",
)


async def test_contents_only_when_asked_for(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await run_team(provider)
    spans = exporter.get_finished_spans()
    for span in spans:
        assert not set(CONTENT_KEYS) & set(span.attributes or {}), span.name
        assert not [event for event in span.events if event.name == "gen_ai.assistant.message"]
    values = every_value(spans)
    for said in ("write a report", "research tides", "notes on tides", "the moon drives"):
        assert not any(said in value for value in values), said
    exporter.clear()

    await run_team(provider, capture_content=True)
    spans = exporter.get_finished_spans()
    lead = next(s for s in spans if s.name == "invoke_agent lead")
    asked = json.loads(str((lead.attributes or {})["gen_ai.input.messages"]))
    assert asked == [
        {"role": "user", "parts": [{"type": "text", "content": "write a report on the sea"}]}
    ]
    texts = [str((e.attributes or {})["content"]) for e in lead.events]
    assert "the report is done" in texts
    lookups = [s for s in spans if s.name == "execute_tool lookup"]
    assert {(s.attributes or {})["gen_ai.tool.call.result"] for s in lookups} == {"notes on tides"}
    assert all((s.attributes or {})["gen_ai.tool.call.arguments"] for s in lookups)
    delegated = [s for s in spans if s.name == "execute_tool editor"]
    assert json.loads(str((delegated[0].attributes or {})["gen_ai.tool.call.arguments"])) == {
        "task": "edit the report"
    }
    # A subagent call's result is the subagent's answer.
    assert (delegated[0].attributes or {})["gen_ai.tool.call.result"] == "edited"
    assert (delegated[0].attributes or {})["output.value"] == "edited"


async def test_a_canary_key_reaches_no_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    said = f"Incorrect API key provided: {CANARY}. Your key {CANARY} is not valid."
    with LoopbackServer() as server:
        server.queue(
            json_reply({"error": {"message": said, "type": "server_error"}}, status=500),
            json_reply({"error": {"message": said, "type": "invalid", "code": "401"}}, status=401),
        )
        model = OpenAIModel("test-model", api_key=CANARY, base_url=f"{server.url}/v1")
        agent = Agent("keyed", model, retry=RetryPolicy(retries=1, initial_delay=0.0, jitter=0.0))
        async with model, Runtime() as rt:
            with otel.instrument(rt, tracer_provider=provider, capture_content=True):
                result = await (await rt.spawn(agent)).ask("hello")
    assert result.status == "failed"
    spans = exporter.get_finished_spans()
    chats = by_operation(spans, "chat")
    assert len(chats) == 2  # the attempt that failed and its retry
    assert all(chat.status.status_code is StatusCode.ERROR for chat in chats)
    (execution,) = by_operation(spans, "invoke_agent")
    assert [event.name for event in execution.events].count("fractor.retry") == 1
    assert execution.status.status_code is StatusCode.ERROR
    # Its answer out is the one synthesized for its caller, redacted too.
    assert str((execution.attributes or {})["output.value"]).startswith("[failed]")
    values = every_value(spans)
    assert any("401" in value for value in values)  # the error is there, redacted
    assert not any(CANARY in value for value in values)


async def test_a_restarted_execution_keeps_its_parent(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel([fail(ValueError("boom")), reply("fine")])
    agent = Agent("a", model, restart=RestartPolicy(max_restarts=1))
    tracer = provider.get_tracer("the caller")
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            ref = await rt.spawn(agent)
            with tracer.start_as_current_span("caller") as caller:
                result = await ref.ask("go")
            with tracer.start_as_current_span("another caller") as other:
                await ref.ask("again")
    assert result.status == "completed"
    first, second, third = by_operation(exporter.get_finished_spans(), "invoke_agent")
    caller_id = caller.get_span_context().span_id
    assert first.parent is not None
    assert second.parent is not None
    assert third.parent is not None
    assert first.parent.span_id == second.parent.span_id == caller_id
    assert third.parent.span_id == other.get_span_context().span_id
    assert (first.attributes or {})["fractor.status"] == "failed"
    assert first.status.status_code is StatusCode.ERROR
    assert (second.attributes or {})["fractor.status"] == "completed"


async def test_without_a_caller_span_each_execution_is_a_trace_of_its_own(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = Agent("solo", ScriptedModel([reply("hi"), reply("hi again")]))
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            ref = await rt.spawn(agent)
            await ref.ask("hello")
            await ref.ask("hello again")
    first, second = by_operation(exporter.get_finished_spans(), "invoke_agent")
    assert first.parent is None
    assert second.parent is None
    assert first.context is not None
    assert second.context is not None
    assert first.context.trace_id != second.context.trace_id


async def test_spans_are_stamped_in_epoch_time_even_if_instrumented_before_the_start(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = Agent("solo", ScriptedModel([reply("hi")]))
    rt = Runtime()
    began = time.time_ns()
    with otel.instrument(rt, tracer_provider=provider):
        async with rt:
            await (await rt.spawn(agent)).ask("hello")
    ended = time.time_ns()
    spans = exporter.get_finished_spans()
    assert len(spans) == 2  # the execution and its request
    for span in spans:
        assert span.start_time is not None
        assert span.end_time is not None
        assert began - 50_000_000 <= span.start_time <= span.end_time <= ended + 50_000_000


def listened(bus: EventBus) -> bool:
    """Whether events are built and delivered (a call: mypy narrows attributes)."""
    return bus.active


async def test_off_by_default_and_after_close(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = Agent("solo", ScriptedModel([reply("hi"), reply("hi again")]))
    async with Runtime() as rt:
        bus = rt.event_bus
        ref = await rt.spawn(agent)
        await ref.ask("hello")  # never instrumented: nothing listens
        assert not listened(bus)
        assert bus.on_task is None
        instrumentation = otel.instrument(rt, tracer_provider=provider)
        assert listened(bus)
        instrumentation.close()
        instrumentation.close()  # twice is harmless
        assert not listened(bus)
        assert bus.on_task is None
        await ref.ask("hello again")
    assert exporter.get_finished_spans() == ()


async def test_a_streamed_ask_hangs_under_the_callers_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("the caller")
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            ref = await rt.spawn(team())
            with tracer.start_as_current_span("caller") as caller:
                async with ref.stream("write a report", subagents=True) as run:
                    async for _ in run:
                        pass
    assert run.result.status == "completed"
    spans = exporter.get_finished_spans()
    (lead,) = [s for s in spans if s.name == "invoke_agent lead"]
    assert lead.parent is not None
    assert lead.parent.span_id == caller.get_span_context().span_id
    assert len(by_operation(spans, "invoke_agent")) == 5


async def test_a_failing_span_never_fails_the_agent(
    provider: TracerProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: otel.Instrumentation, event: Event, detail: RequestStart) -> None:
        raise RuntimeError("a broken exporter")

    kind: type[EventDetail] = RequestStart
    monkeypatch.setitem(otel.HANDLERS, kind, broken)
    agent = Agent("solo", ScriptedModel([reply("hi")]))
    with capture_logs() as logs:
        async with Runtime() as rt:
            with otel.instrument(rt, tracer_provider=provider):
                result = await (await rt.spawn(agent)).ask("hello")
    assert result.text == "hi"
    assert [entry["kind"] for entry in logs if entry["event"] == "otel_span_failed"] == [
        "request_start"
    ]


async def test_instrument_takes_a_runtime() -> None:
    assert otel.__all__ == ["Instrumentation", "instrument"]
    with pytest.raises(TypeError, match=r"fractor\.Runtime"):
        otel.instrument("not a runtime")  # type: ignore[arg-type]


async def test_a_refused_task_leaves_no_caller_behind(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A task refused before it starts (the runtime's agents limit) drops its caller's
    context: none is left to be taken by the agent's next execution."""
    tracer = provider.get_tracer("the caller")
    async with Runtime(budget=Budget(agents=1)) as rt:
        with otel.instrument(rt, tracer_provider=provider) as instrumentation:
            ref = await rt.spawn(Agent("a", ScriptedModel([reply("fine")])))
            with tracer.start_as_current_span("first caller") as first:
                result = await ref.ask("go")
            with tracer.start_as_current_span("refused caller"):
                refused = await ref.ask("one too many")
            assert not instrumentation._callers  # the refused task's context was dropped
    assert result.status == "completed"
    assert refused.status == "budget_exceeded"
    (span,) = by_operation(exporter.get_finished_spans(), "invoke_agent")
    assert span.parent is not None
    assert span.parent.span_id == first.get_span_context().span_id


async def test_a_summarization_is_a_chat_span_of_its_execution(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel([reply("one " * 20), reply("two " * 20), reply("gist"), reply("three")])
    agent = Agent("a", model, memory=Compaction(threshold=10, keep=1))
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            ref = await rt.spawn(agent)
            for task in ("first", "second", "third"):
                await ref.ask(task)
    spans = exporter.get_finished_spans()
    *_, last = by_operation(spans, "invoke_agent")
    chats = [
        s
        for s in by_operation(spans, "chat")
        if s.parent and last.context and (s.parent.span_id == last.context.span_id)
    ]
    assert [(s.attributes or {})["fractor.purpose"] for s in chats] == ["summary", "step"]
    (folded,) = [e for e in last.events if e.name == "fractor.compaction"]
    assert (folded.attributes or {})["fractor.ok"] is True
    assert (folded.attributes or {})["fractor.turns"] == 1


async def test_a_task_that_fails_before_it_starts_leaves_no_parent_for_the_next(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A cost limit over a model with no price fails the ask before its execution
    starts (no refusal event): the next ask's execution still hangs from its caller."""
    agent = Agent("a", ScriptedModel([reply("fine")]))
    tracer = provider.get_tracer("the caller")
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            ref = await rt.spawn(agent)
            with (
                tracer.start_as_current_span("first caller"),
                pytest.raises(ValueError, match="no price is known"),
            ):
                await ref.ask("go", budget=Budget(cost=1.0))
            with tracer.start_as_current_span("second caller") as second:
                assert (await ref.ask("go")).ok
    (span,) = by_operation(exporter.get_finished_spans(), "invoke_agent")
    assert span.parent is not None
    assert span.parent.span_id == second.get_span_context().span_id


def test_the_readme_example_needs_only_what_the_otel_extra_installs() -> None:
    """``pip install fractor[otel]`` gives every module the README's OpenTelemetry
    example imports: each comes from fractor, a dependency of fractor, or a
    distribution the extra names."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## OpenTelemetry traces\n", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {
        canonical(re.split(r"[\s\[<>=!~;]", line, maxsplit=1)[0])
        for line in (*project["dependencies"], *project["optional-dependencies"]["otel"])
    }
    modules = {
        node.module
        for node in ast.walk(ast.parse(example))
        if isinstance(node, ast.ImportFrom) and node.module
    } | {
        alias.name
        for node in ast.walk(ast.parse(example))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    owners = importlib.metadata.packages_distributions()
    needed: dict[str, set[str]] = {}
    for module in sorted(modules):
        top = module.partition(".")[0]
        if top == "fractor":
            continue  # fractor's own
        spec = importlib.util.find_spec(module)
        assert spec is not None, module
        assert spec.origin is not None, module
        origin = pathlib.Path(spec.origin).resolve()
        needed[module] = {
            canonical(name)
            for name in owners.get(top, ())
            if any(
                pathlib.Path(str(importlib.metadata.distribution(name).locate_file(path))).resolve()
                == origin
                for path in importlib.metadata.distribution(name).files or ()
            )
        }
    assert needed["opentelemetry.sdk.trace"] == {"opentelemetry-sdk"}
    missing = {module: dists for module, dists in needed.items() if not dists & installed}
    assert not missing, f"the otel extra does not install what these need: {missing}"


def canonical(name: str) -> str:
    """A distribution's name as the packaging specs compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def attributes_of(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def decoded(span: ReadableSpan, key: str) -> object:
    return json.loads(str(attributes_of(span)[key]))


async def test_contents_follow_the_genai_conventions_and_show_in_phoenix(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """With contents captured: an execution's task in and answer out, each request's
    system instructions, messages and response (GenAI ``gen_ai.*`` JSON), and the same
    as OpenInference's ``input.value`` / ``output.value``, which Phoenix shows."""
    model = ScriptedModel([call("lookup", topic="tides", id="c1"), reply("The moon.")])
    agent = Agent("solver", model, tools=[lookup], instructions="Be brief.")
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider, capture_content=True):
            result = await (await rt.spawn(agent)).ask("Why tides?")
    assert result.text == "The moon."
    spans = exporter.get_finished_spans()
    (execution,) = by_operation(spans, "invoke_agent")
    attributes = attributes_of(execution)
    assert attributes["openinference.span.kind"] == "AGENT"
    assert (attributes["input.value"], attributes["output.value"]) == ("Why tides?", "The moon.")
    assert decoded(execution, "gen_ai.output.messages") == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "The moon."}],
            "finish_reason": "stop",
        }
    ]
    first, second = sorted(by_operation(spans, "chat"), key=lambda s: s.start_time or 0)
    system = model.requests[0].messages[0]
    asked = {"role": "user", "parts": [{"type": "text", "content": "Why tides?"}]}
    for chat in (first, second):
        attributes = attributes_of(chat)
        assert attributes["openinference.span.kind"] == "LLM"
        assert attributes["gen_ai.provider.name"] == "fractor"
        assert decoded(chat, "gen_ai.system_instructions") == [
            {"type": "text", "content": system.content}
        ]
        assert "Be brief." in system.content
        assert attributes["input.mime_type"] == "application/json"
        assert decoded(chat, "input.value") == decoded(chat, "gen_ai.input.messages")
        assert attributes["output.mime_type"] == "application/json"
        assert decoded(chat, "output.value") == decoded(chat, "gen_ai.output.messages")
    assert decoded(first, "gen_ai.input.messages") == [asked]
    (asking,) = cast("list[dict[str, Any]]", decoded(first, "gen_ai.output.messages"))
    assert asking["finish_reason"] == "tool_call"
    (part,) = asking["parts"]
    assert (part["type"], part["id"], part["name"]) == ("tool_call", "c1", "lookup")
    assert json.loads(part["arguments"]) == {"topic": "tides"}
    assert decoded(second, "gen_ai.input.messages") == [
        asked,
        {"role": "assistant", "parts": [part]},
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "c1", "response": "notes on tides"}],
        },
    ]
    assert decoded(second, "gen_ai.output.messages") == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "The moon."}],
            "finish_reason": "stop",
        }
    ]
    (tool_span,) = by_operation(spans, "execute_tool")
    attributes = attributes_of(tool_span)
    assert attributes["openinference.span.kind"] == "TOOL"
    assert json.loads(str(attributes["input.value"])) == {"topic": "tides"}
    assert attributes["output.value"] == "notes on tides"


async def test_the_provider_of_each_request(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """``gen_ai.provider.name`` on every chat span, contents or not: the provider of a
    real model ("openai", with the model's own name as ``gen_ai.request.model``),
    "fractor" for its scripted ones."""
    with LoopbackServer() as server:
        server.queue(json_reply(completion("hello")))
        model = OpenAIModel("test-model", api_key=CANARY, base_url=f"{server.url}/v1", stream=False)
        async with model, Runtime() as rt:
            with otel.instrument(rt, tracer_provider=provider):
                assert (await (await rt.spawn(Agent("real", model))).ask("hi")).ok
                scripted = Agent("fake", ScriptedModel([reply("hi")]))
                assert (await (await rt.spawn(scripted)).ask("hi")).ok
    real, fake = by_operation(exporter.get_finished_spans(), "chat")
    assert attributes_of(real)["gen_ai.provider.name"] == "openai"
    assert attributes_of(real)["gen_ai.request.model"] == "test-model"
    assert real.name == "chat test-model"
    assert attributes_of(fake)["gen_ai.provider.name"] == "fractor"
    assert attributes_of(fake)["gen_ai.request.model"] == "scripted"
    assert not set(CONTENT_KEYS) & set(attributes_of(real))


async def test_request_events_carry_contents_only_while_someone_records_them(
    provider: TracerProvider,
) -> None:
    """Messages and responses ride on the request events (as references) only while an
    instrumentation records contents; a log or a stream never gets them otherwise."""
    agent = Agent("a", ScriptedModel([reply("one"), reply("two"), reply("three")]))
    async with Runtime() as rt, rt.events() as events:
        ref = await rt.spawn(agent)
        with otel.instrument(rt, tracer_provider=provider):
            await ref.ask("first")
        with otel.instrument(rt, tracer_provider=provider, capture_content=True):
            assert rt.event_bus.contents == 1
            await ref.ask("second")
        assert rt.event_bus.contents == 0
        await ref.ask("third")
        seen = []
        while (event := events.receive_nowait()) is not None:
            if event.kind in ("request_start", "request_end"):
                detail = event.detail
                seen.append(
                    (detail.get("messages") is not None, detail.get("response") is not None)
                )
    assert (
        seen
        == [(False, False), (False, False), (True, False), (False, True)] + [(False, False)] * 2
    )


@tool
async def reporting() -> str:
    """Reports its progress twice."""
    report = progress_reporter()
    assert report is not None
    report(1, 2, "half")
    report(2, 2, "all")
    return "done"


async def test_a_tools_progress_is_an_event_of_its_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    agent = Agent("a", ScriptedModel([call("reporting"), reply("ok")]), tools=[reporting])
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            assert (await (await rt.spawn(agent)).ask("go")).ok
    (span,) = by_operation(exporter.get_finished_spans(), "execute_tool")
    progress = [dict(e.attributes or {}) for e in span.events if e.name == "fractor.tool_progress"]
    assert progress == [
        {"fractor.progress": 1, "fractor.total": 2},
        {"fractor.progress": 2, "fractor.total": 2},
    ]


class Cached(EventDetail, frozen=True, kw_only=True, tag="test_cached"):
    """A kind the integration has no handler for: defined here, in a test."""

    tool: str
    hits: int
    ratio: float
    fresh: bool
    topics: tuple[str, ...] = ()
    missing: str | None = None
    #: A content: recorded only with ``capture_content``.
    text: str = ""


@pytest.mark.parametrize("capture_content", [False, True])
async def test_a_kind_it_has_no_handler_for_is_an_event_of_its_execution(
    provider: TracerProvider, exporter: InMemorySpanExporter, capture_content: bool
) -> None:
    """A kind defined since, emitted from a tool of a running execution: an event of
    the execution's span named after the kind, its fields as attributes (OTel's
    types as they are, others as short text, contents only when asked for)."""
    started: list[Event] = []

    def listen(seen: Event) -> None:
        if seen.kind == "tool_start":
            started.append(seen)

    async with Runtime() as rt:
        rt.event_bus.listen(listen)

        @tool
        async def cache(topic: str) -> str:
            """Look a topic up in the cache."""
            (start,) = started
            detail = Cached(
                tool="cache", hits=2, ratio=0.5, fresh=True, topics=("k1", "k2"), text="x" * 500
            )
            rt.event_bus.emit(
                detail,
                agent=start.agent,
                agent_id=start.agent_id,
                execution_id=start.execution_id,
                parent_id=start.parent_id,
                depth=start.depth,
            )
            return f"notes on {topic}"

        agent = Agent("a", stepped(call("cache", topic="tides"), reply("done")), tools=[cache])
        with otel.instrument(rt, tracer_provider=provider, capture_content=capture_content):
            assert (await (await rt.spawn(agent)).ask("go")).ok
    (execution,) = by_operation(exporter.get_finished_spans(), "invoke_agent")
    (cached,) = [e for e in execution.events if e.name == "fractor.test_cached"]
    expected: dict[str, object] = {
        "fractor.tool": "cache",
        "fractor.hits": 2,
        "fractor.ratio": 0.5,
        "fractor.fresh": True,
        "fractor.topics": '["k1","k2"]',
    }
    if capture_content:
        expected["fractor.text"] = "x" * otel.CONTENT_CHARS
    assert dict(cached.attributes or {}) == expected
