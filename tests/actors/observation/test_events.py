"""Every kind of event is one class, in one union (``Details``), and every consumer
reads that class: the bus (by name, by detail, and its log), a stream of one ask
(``AgentRef.stream`` yields the bus's own events, as each class's ``streamed`` says),
``fractor run``'s notes, the live view's lines, the web view's JSON, OpenTelemetry and
the wire from a host. One event of every kind of the union goes through each of
them, and a kind added without a decision where one is needed fails here: its class
outside the union (the wire could not decode it), or saying nothing of ``streamed``.
The others show a kind they have no words for as it is (a kind defined here, in a
test, goes through them all). The traces (``_traces.py``) read no event: they are the
execution's own records."""

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
    Task,
    ToolEnd,
    ToolProgress,
    ToolStart,
    call,
    reply,
    tool,
)
from fractor.actors._hosts._remote import Events, decode_up, encode
from fractor.actors._observation._events import DETAILS, Details, WireEvent, agent_event
from fractor.actors._observation._stream import AgentStream
from fractor.actors.cli._lines import LatestLines, ProgressLines, generic_line
from fractor.actors.cli._run import STREAM_IGNORED, stream_note
from fractor.actors.integrations import otel
from fractor.actors.ui import tree_view
from fractor.runtime import Event, EventDetail, NodeSnapshot, Runtime, TreeSnapshot, Usage
from fractor.runtime._events import ASKING, EventBus, Streamed, detail_classes, make_detail

from ..sample_tools import stepped

#: Every kind of event there is, from the one union: the kernel's and the agent
#: layer's (what the wire decodes; not the kinds the tests define).
KINDS: dict[str, type[EventDetail]] = {cls.kind: cls for cls in typing.get_args(Details)}
CLASSES = frozenset(KINDS.values())
#: The kinds a stream yields, at some depth.
STREAMED = frozenset(cls for cls in CLASSES if cls.streamed != "never")

#: What each consumer handles in words of its own and what it leaves out on purpose;
#: a kind in neither it shows as it is.
CONSUMERS: dict[str, tuple[frozenset[type[EventDetail]], frozenset[type[EventDetail]]]] = {
    "OpenTelemetry": (frozenset(otel.HANDLERS), otel.IGNORED),
    "live view and web view (LatestLines)": (LatestLines.SHOWN, LatestLines.IGNORED),
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


def test_every_kind_defined_is_in_the_one_union_once() -> None:
    defined = {
        kind: cls for kind, cls in detail_classes().items() if cls.__module__.startswith("fractor.")
    }
    assert defined == KINDS, "each kind in Details: the wire decodes it"
    assert DETAILS == KINDS
    assert len(typing.get_args(Details)) == len(KINDS), "a class twice, or two of one kind"
    assert KINDS["stop"].__module__ == "fractor.runtime._events"  # the kernel's own
    agent_kinds = {
        cls for cls in CLASSES if cls.__module__ == "fractor.actors._observation._events"
    }
    assert agent_kinds == CLASSES - {KINDS["stop"]}
    # Each is exported from fractor.actors (the kernel's from fractor.runtime).
    exported = {getattr(fractor.actors, cls.__name__, None) for cls in agent_kinds}
    assert exported == agent_kinds
    assert all(cls.__name__ in fractor.actors.__all__ for cls in agent_kinds)


def test_each_tag_names_one_class() -> None:
    """A kind's name is one class's, wherever events are tagged: the stream has no
    tags of its own any more (it yields the bus's events)."""
    tags = [cls.__struct_config__.tag for cls in CLASSES]
    assert len(tags) == len(set(tags)) == len(CLASSES)
    assert all(
        isinstance(tag, str) and tag == cls.kind for tag, cls in zip(tags, CLASSES, strict=True)
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_says_what_a_stream_does_with_it(kind: str) -> None:
    """A decision each kind makes in its class (its base says never): a kind added
    without one fails here."""
    cls = KINDS[kind]
    assert "streamed" in vars(cls), f"{cls.__qualname__} does not say whether it is streamed"
    assert cls.streamed in typing.get_args(Streamed)


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_every_consumer_says_what_it_does_with_a_kind_at_most_once(consumer: str) -> None:
    handled, ignored = CONSUMERS[consumer]
    assert not handled & ignored, "a kind both handled and ignored"
    assert handled | ignored <= CLASSES


def test_a_tools_progress_is_shown_everywhere_it_should_be() -> None:
    for consumer in CONSUMERS:
        assert ToolProgress in CONSUMERS[consumer][0], consumer
    assert ToolProgress in STREAMED
    assert stream_note(sample(ToolProgress)) is not None


def test_fractor_run_leaves_out_only_kinds_a_stream_yields() -> None:
    assert STREAM_IGNORED <= STREAMED


@pytest.mark.parametrize("kind", sorted(cls.kind for cls in STREAMED))
def test_one_event_of_every_streamed_kind_goes_through_fractor_runs_notes(kind: str) -> None:
    note = stream_note(sample(KINDS[kind]))
    assert (note is None) == (KINDS[kind] in STREAM_IGNORED)


@pytest.mark.parametrize("subagents", [False, True], ids=["edges", "subagents"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_event_of_every_kind_goes_through_the_stream(kind: str, subagents: bool) -> None:
    """Through the stream's watcher, as the tree reports it: the execution asked's
    (depth 1) and a subagent's (depth 2); what it yields is the event itself."""
    cls = KINDS[kind]
    stream = AgentStream(None, Task(text="go"), subagents=subagents, buffer=8)  # type: ignore[arg-type]
    stream._watch(event(ExecutionStart(task="go"), depth=1))  # the execution asked begins
    own = event(sample(cls), depth=1)
    below = msgspec.structs.replace(own, depth=2, execution_id="e2", parent_id="e")
    stream._watch(own)
    stream._watch(below)
    yielded = list(stream._events)
    expected = {
        "never": [],
        "asked": [own, below] if subagents else [own],
        "subagents": [below],
        "always": [own, below],
    }[cls.streamed]
    assert yielded == expected
    assert all(a is b for a, b in zip(yielded, expected, strict=True))  # the bus's own events


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


def web_view_line(latest: LatestLines) -> str:
    """The line the web view's JSON (``/api/tree``) gives the node ``e``."""
    node = NodeSnapshot(
        id="e", parent_id="root", depth=2, name="a", actor_id="a-1", status="running",
        stop_reason="", usage=Usage(), own_usage=Usage(), steps=1, agents=1, limits=None,
        started=0.0, seconds=1.0,
    )  # fmt: skip
    view = tree_view(TreeSnapshot(nodes=(node,)), lines=latest.line)
    (shown,) = msgspec.json.decode(msgspec.json.encode(view))["nodes"]
    return str(shown.get("line", ""))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_one_event_of_every_kind_goes_through_the_web_view(kind: str) -> None:
    cls = KINDS[kind]
    latest = LatestLines()
    latest.feed(event(ModelText(text="before")))
    latest.feed(event(sample(cls)))
    line = web_view_line(latest)
    assert line == latest.line("e")
    if cls in LatestLines.IGNORED:
        assert line == "before"
    elif cls not in LatestLines.SHOWN:
        assert line == generic_line(sample(cls))


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
    # ... its fields as the event's attributes.
    attributes = {e.name: dict(e.attributes or {}) for e in spans["invoke_agent a"].events}
    for cls in generic:
        fields = {f"fractor.{f.name}" for f in msgspec.structs.fields(cls) if f.required}
        assert fields <= set(attributes[f"fractor.{cls.kind}"]), cls


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

    streamed = "asked"

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


async def test_a_kind_defined_since_goes_through_every_consumer_as_it_is() -> None:
    """Streamed (its class says so), noted by ``fractor run``, the web view's line, an
    event of its execution's span: none of them has a line for it."""
    hit = CacheHit(tool="lookup", hits=2)
    shown = "test_cache_hit tool=lookup hits=2 topics=()"
    stream = AgentStream(None, Task(text="go"), subagents=False, buffer=8)  # type: ignore[arg-type]
    stream._watch(event(ExecutionStart(task="go"), depth=1))
    stream._watch(seen := event(hit, depth=1))
    assert list(stream._events) == [seen]
    assert stream_note(hit) == f"[{shown}]"
    latest = LatestLines()
    latest.feed(event(hit))
    assert web_view_line(latest) == shown
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            rt.event_bus.emit(ExecutionStart(task="go"), agent="a", execution_id="e")
            rt.event_bus.emit(hit, agent="a", execution_id="e")
            rt.event_bus.emit(
                ExecutionEnd(status="completed", reason="", steps=0, tokens=0),
                agent="a",
                execution_id="e",
            )
    provider.shutdown()
    (span,) = exporter.get_finished_spans()
    (marked,) = [e for e in span.events if e.name == "fractor.test_cache_hit"]
    assert dict(marked.attributes or {}) == {
        "fractor.tool": "lookup", "fractor.hits": 2, "fractor.topics": "[]",
    }  # fmt: skip
