"""Every kind of event is one class, and no consumer drops a kind silently: the stream
(its items are public types) and ``fractor run`` handle a kind or leave it out on
purpose, and a kind added without telling them fails here; OpenTelemetry and the live
view's lines handle some kinds in their own way, leave some out on purpose, and show
any other as it is (a kind defined here, in a test, goes through them). One event of
every kind goes through each of them, through the wire from a host, and through the
bus by name."""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from typing import Any

import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

import fractor.actors
from fractor.actors import (
    Agent,
    ApprovalAsked,
    ExecutionEnd,
    ExecutionStart,
    ModelText,
    RequestEnd,
    StepEnd,
    StreamEvent,
    ToolEnd,
    ToolProgress,
    ToolStart,
    call,
    reply,
    tool,
)
from fractor.actors._hosts._remote import Events, decode_up, encode
from fractor.actors._observation._events import DETAILS, WireEvent, agent_event
from fractor.actors._observation._stream import IGNORED as STREAM_IGNORED_DETAILS
from fractor.actors._observation._stream import SHOWN as STREAM_SHOWN
from fractor.actors._observation._stream import AgentStream
from fractor.actors.cli._lines import LatestLines, ProgressLines, generic_line
from fractor.actors.cli._run import STREAM_IGNORED, stream_note
from fractor.actors.integrations import otel
from fractor.runtime import Event, EventDetail, Runtime
from fractor.runtime._events import ASKING, EventBus, detail_classes, make_detail

from ..sample_tools import stepped

#: Every kind of event there is: the kernel's and the agent layer's (not the kinds
#: the tests define).
KINDS = {
    kind: cls for kind, cls in detail_classes().items() if cls.__module__.startswith("fractor.")
}
CLASSES = frozenset(KINDS.values())

#: What each consumer handles and what it leaves out on purpose: the stream must say
#: one or the other of every kind; the others show a kind in neither as it is.
EXPLICIT = "stream"
CONSUMERS: dict[str, tuple[frozenset[type[EventDetail]], frozenset[type[EventDetail]]]] = {
    EXPLICIT: (frozenset(STREAM_SHOWN), STREAM_IGNORED_DETAILS),
    "OpenTelemetry": (frozenset(otel.HANDLERS), otel.IGNORED),
    "live view (LatestLines)": (LatestLines.SHOWN, LatestLines.IGNORED),
    "progress lines (ProgressLines)": (ProgressLines.SHOWN, ProgressLines.IGNORED),
}


def _value(kind: Any) -> Any:
    """A value of the type ``kind`` (a field's), for a sample event."""
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return typing.get_args(kind)[0]
    if origin in (typing.Union, types.UnionType):
        return None if type(None) in typing.get_args(kind) else _value(typing.get_args(kind)[0])
    if origin is tuple:
        return ()
    return {str: "x", int: 1, float: 0.5, bool: True}[kind]


def sample(cls: type[EventDetail]) -> EventDetail:
    """One detail of the class ``cls``, every field it requires given a value."""
    fields = {
        field.name: _value(field.type) for field in msgspec.structs.fields(cls) if field.required
    }
    return cls(**fields)


def event(detail: EventDetail, depth: int = 2) -> Event:
    return Event(
        at=1.0,
        agent="a",
        agent_id="a-1",
        execution_id="e",
        parent_id="p",
        depth=depth,
        detail=detail,
    )


def test_the_agent_layer_defines_every_kind_of_an_agents_tree_once() -> None:
    assert set(DETAILS) == set(KINDS), "each kind in DETAILS: the wire decodes it"
    assert all(DETAILS[kind] is cls for kind, cls in KINDS.items())
    assert KINDS["stop"].__module__ == "fractor.runtime._events"  # the kernel's own
    agent_kinds = {
        cls for cls in CLASSES if cls.__module__ == "fractor.actors._observation._events"
    }
    assert agent_kinds == CLASSES - {KINDS["stop"]}
    # Each is exported from fractor.actors (the kernel's from fractor.runtime).
    exported = {getattr(fractor.actors, cls.__name__, None) for cls in agent_kinds}
    assert exported == agent_kinds
    assert all(cls.__name__ in fractor.actors.__all__ for cls in agent_kinds)


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_every_consumer_says_what_it_does_with_every_kind(consumer: str) -> None:
    handled, ignored = CONSUMERS[consumer]
    assert not handled & ignored, "a kind both handled and ignored"
    assert handled | ignored <= CLASSES
    if consumer == EXPLICIT:
        missing = CLASSES - handled - ignored
        assert not missing, f"{consumer} does not say what it does with {sorted(missing, key=str)}"
        assert handled | ignored == CLASSES


def test_a_tools_progress_is_shown_everywhere_it_should_be() -> None:
    for consumer in CONSUMERS:
        assert ToolProgress in CONSUMERS[consumer][0], consumer


def test_fractor_run_says_what_it_does_with_every_stream_event() -> None:
    kinds = typing.get_args(StreamEvent)
    assert {shown for shown, _ in STREAM_SHOWN.values() if shown is not None} <= set(kinds)
    for kind in kinds:
        fields = {
            field.name: _value(field.type)
            for field in msgspec.structs.fields(kind)
            if field.required
        }
        note = stream_note(kind(**fields))
        assert (note is None) == (kind in STREAM_IGNORED), kind


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_event_of_every_kind_goes_through_the_stream(kind: str) -> None:
    stream = AgentStream.__new__(AgentStream)
    stream._root_depth, stream._subagents = 1, True
    converted = stream._convert(event(sample(KINDS[kind])))  # a subagent's, depth 2
    assert (converted is not None) == (KINDS[kind] in STREAM_SHOWN)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_event_of_every_kind_goes_through_the_progress_lines(kind: str) -> None:
    cls = KINDS[kind]
    lines = ProgressLines(steps=True)
    line = lines.line(event(sample(cls)))
    # A tool call's start is kept for its step's line; a kind in neither set shows.
    known = ProgressLines.SHOWN | ProgressLines.IGNORED
    shown = cls in ProgressLines.SHOWN and cls is not ToolStart
    assert (line is not None) == (shown or cls not in known)
    latest = LatestLines()
    latest.feed(event(ModelText(text="before")))
    latest.feed(event(sample(cls)))
    if cls in LatestLines.IGNORED:
        assert latest.line("e") == "before"
    elif cls not in LatestLines.SHOWN:
        assert latest.line("e") == generic_line(sample(cls))


async def test_one_event_of_every_kind_goes_through_opentelemetry() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    first: list[type[EventDetail]] = [ExecutionStart, ToolStart]
    last: list[type[EventDetail]] = [ToolEnd, ExecutionEnd]
    order = first + [cls for cls in CLASSES if cls not in first + last] + last
    with capture_logs() as logs:
        async with Runtime() as rt:
            with otel.instrument(rt, tracer_provider=provider, capture_content=True):
                for cls in order:
                    detail = sample(cls)
                    if isinstance(detail, ToolStart | ToolProgress | ToolEnd):
                        detail = msgspec.structs.replace(detail, tool="slow", call_id="c1")
                    rt.event_bus.emit(detail, agent="a", agent_id="a-1", execution_id="e")
    provider.shutdown()
    assert not [entry for entry in logs if entry["event"] == "otel_span_failed"]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    tool = spans["execute_tool slow"]
    assert [e.name for e in tool.events] == ["fractor.tool_progress"]
    # Each kind it has no handler for and does not ignore: an event of the execution.
    marked = {e.name for e in spans["invoke_agent a"].events}
    generic = CLASSES - set(otel.HANDLERS) - otel.IGNORED
    assert {f"fractor.{cls.kind}" for cls in generic} <= marked


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_event_of_every_kind_crosses_the_wire_from_a_host(kind: str) -> None:
    sent = event(sample(KINDS[kind]))
    (received,) = decode_up(encode([Events(events=(sent,))]))
    assert isinstance(received, Events)
    assert received.events == (sent,)
    assert type(received.events[0].detail) is KINDS[kind]
    assert msgspec.json.decode(msgspec.json.encode(sent), type=WireEvent) == sent


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_one_event_of_every_kind_is_made_by_name(kind: str) -> None:
    detail = sample(KINDS[kind])
    fields = {name: getattr(detail, name) for name in detail.__struct_fields__}
    made = make_detail(kind, fields)
    assert made == detail
    assert made.kind == kind == type(detail).kind == detail.kind
    seen: list[Event] = []
    bus = EventBus(log_events=True)
    bus.listen(seen.append)
    with capture_logs() as logs:
        bus.emit(kind, agent="a", **fields)
        bus.emit(detail, agent="a")
    assert [e.detail for e in seen] == [detail, detail]
    assert [entry["event"] for entry in logs] == [kind, kind]


def test_an_agent_event_carries_its_detail_as_made() -> None:
    detail = ToolStart(tool="t", call_id="c")
    made = agent_event(
        detail, at=0.0, agent="a", agent_id="a", execution_id="e", parent_id="", depth=1
    )
    assert made.detail is detail
    assert (made.kind, made.agent, made.execution_id, made.depth) == ("tool_start", "a", "e", 1)


@pytest.mark.parametrize(
    ("kind", "fields", "error", "said"),
    [
        ("tool_begin", {}, ValueError, r"no event kind 'tool_begin': expected one of .*tool_start"),
        ("tool_start", {"tool": "t"}, TypeError, r"'tool_start' \(ToolStart\): Missing .*call_id"),
        (
            "tool_start",
            {"tool": "t", "call_id": "c", "name": "t"},
            TypeError,
            r"Unexpected keyword argument 'name'; its fields are host, tool, call_id, arguments",
        ),
    ],
)
async def test_an_unknown_kind_or_a_wrong_field_is_a_clear_error(
    kind: str, fields: dict[str, Any], error: type[Exception], said: str
) -> None:
    with pytest.raises(error, match=said):
        make_detail(kind, fields)
    with pytest.raises(error, match=said):
        EventBus(log_events=True).emit(kind, **fields)


def test_an_event_asks_when_its_class_says_so() -> None:
    assert ApprovalAsked.asks
    assert not ToolStart.asks
    assert {cls for cls in CLASSES if cls.asks} == {ApprovalAsked}
    assert set(ASKING) == {"approval_request"}
    assert "approval_request" in ASKING
    assert "tool_start" not in ASKING
    assert object() not in ASKING
    assert event(sample(ApprovalAsked)).asks
    assert not event(sample(ToolStart)).asks


def test_a_detail_reads_as_a_mapping_too() -> None:
    """Code written when details were dicts keeps working."""
    detail = ToolEnd(tool="t", call_id="c", is_error=True, result="no")
    assert detail["tool"] == detail.get("tool") == "t"
    assert detail.get("missing") is None
    assert detail.get("missing", 3) == 3
    assert "result" in detail
    assert "missing" not in detail
    assert dict(detail) == {**detail} == {
        "host": "", "tool": "t", "call_id": "c", "is_error": True, "seconds": 0.0,
        "result": "no", "reused": False, "parts": (),
    }  # fmt: skip
    assert list(detail) == list(detail.keys())
    assert len(detail) == 8
    with pytest.raises(KeyError):
        detail["missing"]


def test_importing_fractor_loads_no_rich() -> None:
    """``fractor.actors`` re-exports the live view's ``watch``; rich is loaded once a
    view is made, not with the package: ``import fractor`` works without rich, and
    loads no module of rich besides those structlog loads itself (it imports rich
    when it is installed, for its console renderer)."""
    without = "import sys; sys.modules['rich'] = None; import fractor, fractor.actors.cli._live"
    subprocess.run([sys.executable, "-c", without], check=True, timeout=60)
    loaded = (
        "import sys, structlog\n"
        "def rich(): return {m for m in sys.modules if m.partition('.')[0] == 'rich'}\n"
        "before = rich()\n"
        "import fractor, fractor.actors, fractor.actors.cli, fractor.actors.cli._live\n"
        "assert rich() == before, sorted(rich() - before)\n"
        "fractor.actors.watch(fractor.Runtime())\n"
        "assert 'rich.tree' in rich(), sorted(rich() - before)\n"
    )
    subprocess.run([sys.executable, "-c", loaded], check=True, timeout=60)


def test_a_sequence_given_as_a_list_is_kept_as_its_type_says() -> None:
    """Emit sites may pass lists: the details keep tuples, so an event compares equal
    to itself after the wire."""
    assert StepEnd(step=0, tool_calls=["a"]).tool_calls == ("a",)  # type: ignore[arg-type]
    end = RequestEnd(model="m", tool_calls=[["1", "a"]])  # type: ignore[arg-type]
    assert end.tool_calls == (("1", "a"),)
    asked = ApprovalAsked(id="i", tool="t", call_id="c", path=["lead", "mailer"])  # type: ignore[arg-type]
    assert asked.path == ("lead", "mailer")


class CacheHit(EventDetail, frozen=True, kw_only=True, tag="test_cache_hit"):
    """A kind no consumer knows: defined here, not in ``fractor.actors._observation._events``."""

    tool: str
    hits: int
    topics: tuple[str, ...] = ()
    note: str | None = None


async def test_a_kind_defined_since_shows_in_the_progress_and_latest_lines() -> None:
    """A new kind, emitted from a tool of a running execution, needs no line in the
    live view's code: it shows as it is, ``kind field=value ...``."""
    progress, latest = ProgressLines(), LatestLines()
    printed: list[str] = []
    latest_seen: list[str] = []
    started: list[Event] = []

    def listen(seen: Event) -> None:
        if isinstance(seen.detail, ToolStart):
            started.append(seen)
        line = progress.line(seen)
        if line is not None:
            printed.append(line)
        latest.feed(seen)
        if isinstance(seen.detail, CacheHit):
            latest_seen.append(latest.line(seen.execution_id))

    async with Runtime() as rt:
        rt.event_bus.listen(listen)

        @tool
        async def lookup(topic: str) -> str:
            """Look a topic up (in a cache, which says so)."""
            (start,) = started
            rt.event_bus.emit(
                CacheHit(tool="lookup", hits=2, topics=("k1", "k2"), note="  warm\n cache "),
                agent=start.agent,
                agent_id=start.agent_id,
                execution_id=start.execution_id,
                parent_id=start.parent_id,
                depth=start.depth,
            )
            return f"notes on {topic}"

        agent = Agent("a", stepped(call("lookup", topic="tides"), reply("done")), tools=[lookup])
        assert (await (await rt.spawn(agent)).ask("go")).ok
    shown = "test_cache_hit tool=lookup hits=2 topics=('k1', 'k2') note=warm cache"
    assert [line.partition("] ")[2] for line in printed if "cache" in line] == [f"a: {shown}"]
    assert latest_seen == [shown]
    long = CacheHit(tool="t" * 500, hits=1)
    assert len(generic_line(long)) == 120
    assert generic_line(long).endswith("...")
