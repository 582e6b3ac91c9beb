"""The page's data, as pure values: ``tree_view`` and its budget bars."""

from __future__ import annotations

import msgspec

from fractor.actors import ModelText, StepStart
from fractor.actors._observation._lines import LatestLines
from fractor.actors.ui import Held, TreeView, bars, tree_view
from fractor.actors.ui._view import SPENT
from fractor.runtime import Budget, Event, EventDetail, NodeSnapshot, TreeSnapshot, Usage


def node(**changes: object) -> NodeSnapshot:
    base = NodeSnapshot(
        id="n1",
        parent_id="root",
        depth=1,
        name="lead",
        actor_id="a1",
        status="running",
        stop_reason="",
        usage=Usage(input_tokens=300, output_tokens=100, requests=2, tool_calls=3, cost=0.5),
        own_usage=Usage(),
        steps=4,
        agents=2,
        limits=None,
        started=0.0,
        seconds=2.0,
    )
    return msgspec.structs.replace(base, **changes)


def test_every_budget_field_is_measured_or_said_not_to_be() -> None:
    assert set(SPENT) == set(Budget.__struct_fields__)


def test_a_bar_per_limit_with_spent_reserved_and_left() -> None:
    limits = Budget(depth=3, tokens=1_000, requests=5, tool_calls=3, steps=10, seconds=4, cost=1.0)
    held = Held(input_tokens=200, output_tokens=50, cost=0.25, requests=1)
    shown = {bar.field: bar for bar in bars(node(limits=limits), held)}
    assert list(shown) == ["tokens", "requests", "tool_calls", "steps", "seconds", "cost"]
    tokens, requests = shown["tokens"], shown["requests"]
    assert (tokens.spent, tokens.reserved, tokens.left) == (400, 250, 350)
    assert (requests.spent, requests.reserved, requests.left) == (2, 1, 2)
    assert (shown["tool_calls"].spent, shown["tool_calls"].left) == (3, 0)  # never below 0
    assert (shown["steps"].spent, shown["seconds"].spent, shown["seconds"].left) == (4, 2.0, 2.0)
    assert (shown["cost"].spent, shown["cost"].reserved, shown["cost"].left) == (0.5, 0.25, 0.25)
    assert bars(node()) == ()  # no budget of its own


def test_the_view_keeps_the_tree_order_lines_and_waits() -> None:
    snapshot = TreeSnapshot(
        nodes=(
            node(id="root", parent_id=None, depth=0, name="", limits=Budget(tokens=10)),
            node(waiting="tokens: 400 of 10 used"),
        )
    )
    view = tree_view(snapshot, version=7, lines=lambda i: {"n1": "thinking..."}.get(i, ""))
    assert view.version == 7
    assert [(n.id, n.line, n.waiting) for n in view.nodes] == [
        ("root", "", ""),
        ("n1", "thinking...", "tokens: 400 of 10 used"),
    ]


def test_the_latest_streamed_line_of_each_execution() -> None:
    lines = LatestLines(width=10)

    def feed(execution_id: str, detail: EventDetail) -> None:
        lines.feed(Event(at=0.0, execution_id=execution_id, detail=detail))

    feed("e1", ModelText(text="first line\nsec"))
    feed("e1", ModelText(text="ond one is long"))
    feed("e2", ModelText(text="other"))
    assert lines.line("e1") == "…e is long"
    assert lines.line("e2") == "other"
    feed("e1", StepStart(step=2))
    assert lines.line("e1") == ""
    assert lines.line("e3") == ""


def test_a_node_changes_its_rev_when_what_the_page_shows_changes() -> None:
    def view(*nodes: NodeSnapshot, version: int = 1) -> TreeView:
        return tree_view(TreeSnapshot(nodes=nodes), version=version)

    running = view(node(seconds=1.0))
    later = view(node(seconds=1.25), version=2)  # a running node's clock ticks
    assert running.nodes[0].rev == later.nodes[0].rev
    assert running.digest == later.digest  # the page does nothing
    assert running.nodes[0].seconds != later.nodes[0].seconds  # still in the JSON
    for changed in [
        node(status="completed", seconds=1.0),
        node(usage=Usage(input_tokens=301, output_tokens=100, requests=2, tool_calls=3, cost=0.5)),
        node(waiting="tokens"),
        node(steps=5),
        node(limits=Budget(tokens=1_000)),
    ]:
        other = view(changed)
        assert other.nodes[0].rev != running.nodes[0].rev, changed
        assert other.digest != running.digest
    ended = view(node(status="completed", seconds=1.0))
    assert view(node(status="completed", seconds=2.0)).nodes[0].rev != ended.nodes[0].rev
    assert view(node(), node(id="n2")).digest != running.digest  # a node more
    assert 0 <= running.digest < 2**53  # exact numbers in JavaScript
    assert 0 <= running.nodes[0].rev < 2**53


def test_the_json_leaves_empty_fields_out_and_reads_back_the_same() -> None:
    snapshot = TreeSnapshot(nodes=(node(), node(id="n2", waiting="tokens", host="h1")))
    view = tree_view(snapshot, version=3, lines=lambda i: "hi" if i == "n2" else "")
    data = msgspec.json.encode(view)
    plain = msgspec.json.decode(data)
    assert set(plain["nodes"][0]) == {
        "id", "parent_id", "depth", "agent", "actor_id", "status", "steps", "agents",
        "seconds", "usage", "rev",
    }  # fmt: skip
    assert (plain["nodes"][1]["waiting"], plain["nodes"][1]["line"]) == ("tokens", "hi")
    assert msgspec.json.decode(data, type=TreeView) == view
