"""The supervisor used directly: the tree, counters, reservations, deadlines, snapshots.

Every test is async because the supervisor reads ``anyio.current_time()``; each one
starts the clock with ``sup.start()`` as the runtime does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fractor.runtime import (
    Budget,
    BudgetExceeded,
    Caps,
    InvalidUsage,
    Node,
    OutputSharing,
    Price,
    Reservation,
    Supervisor,
    TreeSnapshot,
    Usage,
    decode_json,
    encode_json,
)

#: One currency unit per input token, two per output token.
PRICE = Price(input_per_million=1_000_000, output_per_million=2_000_000)
#: The same, with cached input tokens at half a unit.
CACHED_PRICE = Price(
    input_per_million=1_000_000, output_per_million=2_000_000, cached_input_per_million=500_000
)


def started(
    budget: Budget | None = None,
    prices: dict[str, Price] | None = None,
    *,
    min_output_tokens: int = 256,
) -> Supervisor:
    sup = Supervisor(budget, prices, min_output_tokens=min_output_tokens)
    sup.start()
    return sup


def scoped(*nodes: Node) -> None:
    """Give nodes cancel scopes, as running executions have."""
    for node in nodes:
        node.scope = anyio.CancelScope()


def cancel_called(node: Node) -> bool:
    """Whether the supervisor cancelled the scope ``scoped`` gave ``node``."""
    assert isinstance(node.scope, anyio.CancelScope)
    return node.scope.cancel_called


def own(sup: Supervisor, node: Node) -> Usage:
    """What ``node`` itself consumed, as the supervisor's snapshot shows it."""
    return sup.snapshot().node(node.id).own_usage


def stop_statuses(sup: Supervisor) -> dict[str, str | None]:
    return {node_id: node.stop_status for node_id, node in sup.nodes.items()}


# -- open: depth and agents -----------------------------------------------------------


async def test_runtime_depth_one_allows_top_level_nodes_but_not_their_children() -> None:
    sup = started(Budget(depth=1))
    assert sup.root.depth == 0
    top = sup.open(sup.root, name="top", limits=None)
    assert top.depth == 1
    assert top.parent is sup.root
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(top, name="child", limits=None)
    assert caught.value.limit == "depth"
    assert caught.value.allowed == 1
    assert caught.value.node_id == "root"
    assert caught.value.node_name == "runtime"
    assert "depth limit of 1 reached (budget of runtime 'root')" in str(caught.value)


async def test_runtime_depth_zero_refuses_every_node() -> None:
    sup = started(Budget(depth=0))
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(sup.root, name="top", limits=None)
    assert (caught.value.limit, caught.value.node_id) == ("depth", "root")
    assert set(sup.nodes) == {"root"}


async def test_depth_counts_from_the_node_that_carries_the_limit() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    limited = sup.open(top, name="limited", limits=Budget(depth=1))
    assert limited.depth == 2
    child = sup.open(limited, name="child", limits=None)
    assert child.depth == 3
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(child, name="grandchild", limits=None)
    assert caught.value.limit == "depth"
    assert caught.value.node_id == limited.id
    assert caught.value.node_name == "limited"
    # The limit only covers the subtree of the node that carries it.
    sibling = sup.open(top, name="sibling", limits=None)
    deeper = sup.open(sibling, name="deeper", limits=None)
    assert sup.open(deeper, name="deepest", limits=None).depth == 4


async def test_the_tightest_depth_limit_of_the_chain_wins() -> None:
    sup = started(Budget(depth=5))
    top = sup.open(sup.root, name="top", limits=Budget(depth=3))
    middle = sup.open(top, name="middle", limits=Budget(depth=1))
    leaf = sup.open(middle, name="leaf", limits=None)
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(leaf, name="below", limits=None)
    assert caught.value.node_id == middle.id  # the nearest limit, not the root's


async def test_agents_limit_counts_every_node_opened_under_the_carrier() -> None:
    sup = started(Budget(agents=3))
    top = sup.open(sup.root, name="top", limits=Budget(agents=1))
    child = sup.open(top, name="child", limits=None)
    assert (sup.root.agents, top.agents, child.agents) == (2, 1, 0)
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(top, name="second", limits=None)
    assert (caught.value.limit, caught.value.allowed, caught.value.node_id) == (
        "agents",
        1,
        top.id,
    )
    # A grandchild would be a second agent under ``top`` as well.
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(child, name="grandchild", limits=None)
    assert caught.value.node_id == top.id
    # Refused opens are not counted.
    assert (sup.root.agents, top.agents) == (2, 1)
    sup.open(sup.root, name="other", limits=None)
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(sup.root, name="fourth", limits=None)
    assert (caught.value.limit, caught.value.node_id) == ("agents", "root")


async def test_closing_a_node_does_not_give_its_agent_back() -> None:
    sup = started(Budget(agents=1))
    top = sup.open(sup.root, name="top", limits=None)
    sup.close(top, "completed")
    with pytest.raises(BudgetExceeded):
        sup.open(sup.root, name="again", limits=None)


async def test_a_refused_open_stops_nothing() -> None:
    sup = started(Budget(agents=2))
    top = sup.open(sup.root, name="top", limits=Budget(depth=1))
    child = sup.open(top, name="child", limits=None)
    scoped(top, child)
    before = set(sup.nodes)
    for parent in (child, top):
        with pytest.raises(BudgetExceeded):
            sup.open(parent, name="refused", limits=None)
    assert set(sup.nodes) == before
    assert sup.root.stop_status is None
    assert all(status is None for status in stop_statuses(sup).values())
    assert not cancel_called(top)
    assert not cancel_called(child)
    assert top.children == {child}


async def test_a_child_of_a_stopped_node_starts_stopped() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    sup.stop_subtree(top, "budget_exceeded", "steps limit of 1 reached")
    child = sup.open(top, name="child", limits=None)
    assert child.stop_status == "budget_exceeded"
    assert child.stop_reason == "steps limit of 1 reached"


# -- charge: counters -------------------------------------------------------------------


async def test_charge_counts_on_every_ancestor_and_own_only_on_the_node() -> None:
    sup = started(Budget(steps=10))
    top = sup.open(sup.root, name="top", limits=Budget(tool_calls=5))
    child = sup.open(top, name="child", limits=None)
    sup.charge(child, steps=2, tool_calls=3)
    sup.charge(top, steps=1)
    assert [(n.steps, n.tool_calls) for n in (sup.root, top, child)] == [(3, 3), (3, 3), (2, 3)]
    assert own(sup, child) == Usage(tool_calls=3)
    assert own(sup, top) == Usage()
    assert own(sup, sup.root) == Usage()
    assert top.usage().tool_calls == 3


async def test_a_refused_charge_names_the_limit_and_stops_that_subtree() -> None:
    sup = started(Budget(steps=100))
    top = sup.open(sup.root, name="top", limits=Budget(tool_calls=3))
    child = sup.open(top, name="child", limits=Budget(tool_calls=10))
    grandchild = sup.open(child, name="grandchild", limits=None)
    sibling = sup.open(sup.root, name="sibling", limits=None)
    nephew = sup.open(sibling, name="nephew", limits=None)
    scoped(top, child, grandchild, sibling, nephew)
    sup.charge(grandchild, tool_calls=2)
    with pytest.raises(BudgetExceeded) as caught:
        sup.charge(grandchild, steps=1, tool_calls=2)
    error = caught.value
    assert (error.limit, error.allowed, error.node_id, error.node_name) == (
        "tool_calls",
        3,
        top.id,
        "top",
    )
    # Nothing of the refused charge was counted, anywhere on the chain.
    assert [(n.steps, n.tool_calls) for n in (sup.root, top, child, grandchild)] == [
        (0, 2),
        (0, 2),
        (0, 2),
        (0, 2),
    ]
    assert own(sup, grandchild) == Usage(tool_calls=2)
    # The subtree of the node whose limit it is stops; nothing outside it does.
    for node in (top, child):
        assert node.stop_status == "budget_exceeded"
        assert node.stop_reason == str(error)
    assert cancel_called(top)
    for node in (sibling, nephew):
        assert node.stop_status is None
        assert not cancel_called(node)
    assert sup.root.stop_status is None


async def test_a_stop_marks_the_whole_subtree_at_once() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    child = sup.open(top, name="child", limits=None)
    grandchild = sup.open(child, name="grandchild", limits=None)
    great = sup.open(grandchild, name="great", limits=None)
    scoped(top, child, grandchild, great)
    sup.stop_subtree(top, "budget_exceeded", "steps limit of 3 reached")
    assert cancel_called(top)
    for node in (top, child, grandchild, great):
        assert (node.stop_status, node.stop_reason) == (
            "budget_exceeded",
            "steps limit of 3 reached",
        ), node
    # A node opened under the stopped subtree now starts stopped, at any depth.
    assert sup.open(great, name="late", limits=None).stop_status == "budget_exceeded"


async def test_a_stopped_node_takes_no_new_work() -> None:
    sup = started(Budget(requests=10))
    top = sup.open(sup.root, name="top", limits=Budget(tool_calls=1))
    worker = sup.open(top, name="worker", limits=None)
    sup.charge(worker, steps=1, tool_calls=1)
    with pytest.raises(BudgetExceeded):
        sup.charge(worker, tool_calls=1)  # top's limit: top and worker are stopped
    assert worker.stop_status == "budget_exceeded"
    # The stopped execution must not start another step nor count another request.
    with pytest.raises(BudgetExceeded):
        sup.charge(worker, steps=1)
    with pytest.raises(BudgetExceeded):
        sup.reserve_nowait(worker, input_estimate=10, max_tokens=None)
    assert (worker.steps, top.steps, sup.root.steps) == (1, 1, 1)
    assert (worker.requests, top.requests, sup.root.requests) == (0, 0, 0)


async def test_a_refused_charge_on_the_nodes_own_limit_stops_only_it() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    worker = sup.open(top, name="worker", limits=Budget(steps=1))
    scoped(top, worker)
    sup.charge(worker, steps=1)
    with pytest.raises(BudgetExceeded) as caught:
        sup.charge(worker, steps=1)
    assert (caught.value.limit, caught.value.node_id) == ("steps", worker.id)
    assert worker.stop_status == "budget_exceeded"
    assert top.stop_status is None
    assert not cancel_called(top)
    assert (top.steps, worker.steps) == (1, 1)


async def test_a_runtime_limit_stops_the_whole_tree() -> None:
    sup = started(Budget(tool_calls=1))
    first = sup.open(sup.root, name="first", limits=None)
    second = sup.open(sup.root, name="second", limits=None)
    scoped(first, second)
    sup.charge(first, tool_calls=1)
    with pytest.raises(BudgetExceeded) as caught:
        sup.charge(second, tool_calls=1)
    assert caught.value.node_id == "root"
    assert {sup.root.stop_status, first.stop_status, second.stop_status} == {"budget_exceeded"}
    # The root runs no execution: the stop reaches the executions under it.
    assert cancel_called(first)
    assert cancel_called(second)


async def test_a_stop_reaches_running_executions_under_a_node_without_one() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)  # its execution has not started
    child = sup.open(top, name="child", limits=None)
    grandchild = sup.open(child, name="grandchild", limits=None)
    scoped(child)
    sup.stop_subtree(top, "timed_out", "deadline of 1 s passed")
    assert cancel_called(child)
    for node in (top, child, grandchild):
        assert (node.stop_status, node.stop_reason) == ("timed_out", "deadline of 1 s passed")


async def test_an_earlier_stop_is_not_overwritten() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=Budget(steps=0))
    sup.cancel(top.id)
    with pytest.raises(BudgetExceeded):
        sup.charge(top, steps=1)
    assert top.stop_status == "cancelled"
    assert top.stop_reason == f"cancelled (top {top.id!r})"


# -- reserve: the honest admission rule ------------------------------------------------------


async def test_a_lone_request_may_take_all_the_free_headroom_up_to_what_it_wants() -> None:
    sup = started(Budget(output_tokens=1000))
    top = sup.open(sup.root, name="top", limits=Budget(tokens=1000))
    child = sup.open(top, name="child", limits=None)
    # root: 1,000 output tokens; top: 1,000 tokens - 10 input = 990; it wants 2,000.
    first = sup.reserve_nowait(child, input_estimate=10, max_tokens=2000)
    assert (first.max_tokens, first.input, first.output) == (990, 10, 990)
    assert (first.limited_by, first.limit, first.wanted) == (top, "tokens", 2000)
    # What it wants, when it fits, is not "limited": a reply cut there is its own cut.
    sup2 = started(Budget(tokens=10_000))
    assert sup2.reserve_nowait(sup2.root, input_estimate=1, max_tokens=64).limited_by is None


async def test_a_reply_cut_at_the_default_of_a_request_with_no_cap_is_asked_again_larger() -> None:
    # Without a budget a request that names no max_tokens goes uncapped; under one it
    # starts at the default (4,096): a reply cut there is the budget's cut, asked
    # again with room for twice as much, each time, as far as settled usage leaves.
    sup = started(Budget(tokens=20_000))
    first = sup.reserve_nowait(sup.root, input_estimate=100, max_tokens=None)
    assert (first.max_tokens, first.limited_by) == (4_096, None)
    assert first.again(4_096, own=False) == 8_192
    sup.settle(sup.root, first, Usage(input_tokens=100, output_tokens=4_096, requests=1))
    second = sup.reserve_nowait(sup.root, input_estimate=100, max_tokens=None, at_least=8_192)
    assert (second.max_tokens, second.wanted, second.limited_by) == (8_192, 8_192, None)
    assert second.again(8_192, own=False) == 16_384
    sup.settle(sup.root, second, Usage(input_tokens=100, output_tokens=8_192, requests=1))
    # 20,000 - 12,488 settled - 100 input leaves 7,412: what is left, and limited.
    third = sup.reserve_nowait(sup.root, input_estimate=100, max_tokens=None, at_least=16_384)
    assert (third.max_tokens, third.limited_by, third.limit) == (7_412, sup.root, "tokens")
    # Not the budget's cut: a request's own cap, a model that stopped short of the cap
    # (its own output limit), a request with no budget on its chain.
    assert first.again(4_000, own=False) is None
    other = started(Budget(tokens=20_000))
    own = other.reserve_nowait(other.root, input_estimate=100, max_tokens=500)
    assert own.again(500, own=True) is None
    plain = started()
    free = plain.reserve_nowait(plain.root, input_estimate=1, max_tokens=None)
    assert free.max_tokens is None
    assert free.again(100_000, own=False) is None


async def test_concurrent_requests_share_the_headroom_instead_of_stopping() -> None:
    # The case: five concurrent children under 10,000 tokens, 4,096 each by
    # default. Each request takes one part of what is free for each running
    # execution under the budget that holds none of it yet: 5, then 4, 3, 2, 1.
    sup = started(Budget(tokens=10_000))
    nodes = [sup.open(sup.root, name=f"child{i}", limits=None) for i in range(5)]
    caps = [sup.reserve_nowait(n, input_estimate=100, max_tokens=None).max_tokens for n in nodes]
    assert caps == [1980, 1955, 1921, 1872, 1772]
    assert sup.root.stop_status is None
    assert sup.root.input_tokens + sup.root.reserved_input + sup.root.reserved_output <= 10_000


async def test_the_share_counts_the_executions_that_may_ask_next() -> None:
    sup = started(Budget(tokens=10_000))
    lead = sup.open(sup.root, name="lead", limits=None)
    assert sup.root.leaves == lead.leaves == 1
    children = [sup.open(lead, name=f"c{i}", limits=None) for i in range(4)]
    # The lead waits for its children: four executions may ask next, not five.
    assert (sup.root.leaves, lead.leaves) == (4, 4)
    first = sup.reserve_nowait(children[0], input_estimate=100, max_tokens=None)
    assert first.max_tokens == (10_000 - 100) // 4
    for child in children:
        sup.close(child, "completed")
    assert (sup.root.leaves, lead.leaves) == (1, 1)  # the lead's step goes on
    sup.close(lead, "completed")
    assert sup.root.leaves == 0
    sup.settle(children[0], first, None)


async def test_a_request_waits_for_headroom_that_others_hold_and_is_never_refused_for_it() -> None:
    sup = started(Budget(tokens=1000), min_output_tokens=100)
    top = sup.open(sup.root, name="top", limits=None)
    scoped(top)
    held = sup.reserve_nowait(top, input_estimate=100, max_tokens=None)
    assert held.max_tokens == 900
    with pytest.raises(anyio.WouldBlock):
        sup.reserve_nowait(top, input_estimate=100, max_tokens=None)
    assert top.stop_status is None  # waiting, not stopped
    assert not cancel_called(top)
    assert top.requests == 1  # the request that must wait is not counted yet
    got: list[Reservation] = []
    whys: list[str] = []

    async def wait() -> None:
        got.append(await sup.reserve(top, input_estimate=100, max_tokens=None, on_wait=whys.append))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await wait_all_tasks_blocked()
        assert (sup.waiting, sup.waits) == (1, 1)
        assert whys == [top.waiting]
        assert top.waiting.startswith("waiting for budget: tokens of runtime")
        assert sup.snapshot().node(top.id).waiting == top.waiting
        sup.settle(top, held, Usage(input_tokens=100, output_tokens=50, requests=1))
    (reservation,) = got
    # 1,000 - 150 settled - 100 input: all 750 free, nothing else in flight.
    assert reservation.max_tokens == 750
    assert (sup.waiting, top.waiting, top.requests) == (0, "", 2)
    assert sup.wait_seconds >= 0


async def test_a_refusal_comes_only_from_settled_usage_and_says_need_and_left() -> None:
    sup = started(min_output_tokens=256)
    worker = sup.open(sup.root, name="worker", limits=Budget(tokens=4000))
    scoped(worker)
    first = sup.reserve_nowait(worker, input_estimate=1000, max_tokens=None)
    sup.settle(worker, first, Usage(input_tokens=1000, output_tokens=1393, requests=1))
    with pytest.raises(BudgetExceeded) as caught:
        sup.reserve_nowait(worker, input_estimate=1450, max_tokens=None)
    error = caught.value
    assert (error.limit, error.need, error.left) == ("tokens", 1706, 1607)
    assert str(error) == (
        "tokens limit of 4,000 reached: the next request needs about 1,706 "
        f"(1,450 input + 256 output), 1,607 left (budget of worker {worker.id!r})"
    )
    assert worker.stop_status == "budget_exceeded"
    assert worker.stop_reason == str(error)
    assert cancel_called(worker)
    assert worker.requests == 1  # the refused request was not counted


async def test_the_minimum_output_is_capped_by_the_requests_own_max_tokens() -> None:
    sup = started(Budget(output_tokens=100), min_output_tokens=256)
    assert sup.reserve_nowait(sup.root, input_estimate=1, max_tokens=40).max_tokens == 40
    with pytest.raises(BudgetExceeded) as caught:  # 256 needed, 100 - 40 held... settled: 100
        sup.reserve_nowait(sup.root, input_estimate=1, max_tokens=None)
    assert (caught.value.need, caught.value.left) == (256, 100)


async def test_waiters_are_served_first_come_first_served() -> None:
    sup = started(Budget(tokens=1000), min_output_tokens=10)
    nodes = [sup.open(sup.root, name=f"n{i}", limits=None) for i in range(3)]
    held = sup.reserve_nowait(nodes[0], input_estimate=500, max_tokens=480, at_least=480)
    order: list[str] = []

    async def ask(node: Node, estimate: int) -> None:
        reservation = await sup.reserve(node, input_estimate=estimate, max_tokens=20)
        order.append(node.name)
        sup.settle(node, reservation, Usage(input_tokens=estimate, output_tokens=1, requests=1))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, nodes[1], 15)  # 1,000 - 980 held: 20 free, 25 needed: waits
        await wait_all_tasks_blocked()
        tg.start_soon(ask, nodes[2], 1)  # would fit (11), but comes second: waits too
        await wait_all_tasks_blocked()
        assert (sup.waiting, order) == (2, [])
        assert nodes[2].waiting.startswith("waiting for budget: behind earlier requests")
        sup.settle(nodes[0], held, Usage(input_tokens=500, output_tokens=100, requests=1))
        # Both fit now: served in one pass, in their order.
        assert (nodes[1].requests, nodes[2].requests, sup.waiting) == (1, 1, 0)
    assert sorted(order) == ["n1", "n2"]
    assert sup.root.requests == 3


async def test_a_stop_ends_a_wait_at_once_and_lets_the_next_waiter_in() -> None:
    sup = started(Budget(tokens=1000), min_output_tokens=10)
    blocked = sup.open(sup.root, name="blocked", limits=None)
    behind = sup.open(sup.root, name="behind", limits=None)
    held = sup.reserve_nowait(sup.root, input_estimate=500, max_tokens=490)
    outcome: dict[str, object] = {}

    async def ask(node: Node, estimate: int) -> None:
        with anyio.CancelScope() as scope:
            node.scope = scope
            outcome[node.name] = await sup.reserve(node, input_estimate=estimate, max_tokens=5)
        if scope.cancelled_caught:
            outcome[node.name] = "cancelled"

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, blocked, 400)  # 10 free: waits for a lot
        await wait_all_tasks_blocked()
        tg.start_soon(ask, behind, 1)  # fits in the 10 free, but waits behind it
        await wait_all_tasks_blocked()
        sup.stop_subtree(blocked, "cancelled", "cancelled (test)")
    assert outcome["blocked"] == "cancelled"
    assert isinstance(outcome["behind"], Reservation)  # served as the first one left
    assert (sup.waiting, blocked.requests, behind.requests) == (0, 0, 1)
    sup.settle(sup.root, held, None)


async def test_a_waiter_is_refused_once_settled_usage_leaves_it_no_room() -> None:
    sup = started(min_output_tokens=100)
    top = sup.open(sup.root, name="top", limits=Budget(tokens=1000))
    child = sup.open(top, name="child", limits=None)
    scoped(top)
    held = sup.reserve_nowait(top, input_estimate=300, max_tokens=600)
    caught: list[BudgetExceeded] = []

    async def ask() -> None:
        try:
            await sup.reserve(child, input_estimate=200, max_tokens=None)
        except BudgetExceeded as exc:
            caught.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        await wait_all_tasks_blocked()
        # 900 settled: the 300 needed no longer fit even with nothing in flight.
        sup.settle(top, held, Usage(input_tokens=300, output_tokens=600, requests=1))
    (error,) = caught
    assert (error.limit, error.node_id, error.need, error.left) == ("tokens", top.id, 300, 100)
    assert top.stop_status == child.stop_status == "budget_exceeded"
    assert cancel_called(top)


async def test_a_request_admitted_and_then_cancelled_gives_its_reservation_back() -> None:
    sup = started(Budget(tokens=1000), min_output_tokens=10)
    top = sup.open(sup.root, name="top", limits=None)
    held = sup.reserve_nowait(top, input_estimate=500, max_tokens=495)

    async def ask(scope: anyio.CancelScope) -> None:
        with scope:
            await sup.reserve(top, input_estimate=100, max_tokens=None)

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, scope)
        await wait_all_tasks_blocked()
        scope.cancel()  # cancelled, and before it runs again...
        sup.settle(top, held, Usage(input_tokens=500, output_tokens=5, requests=1))
        assert top.requests == 2  # ...admitted by the settle
    assert (top.requests, top.reserved_input, top.reserved_output) == (1, 0, 0)
    assert sup.waiting == 0


async def test_at_least_raises_the_minimum_of_a_request_asked_again() -> None:
    sup = started(Budget(output_tokens=1000), min_output_tokens=10)
    reservation = sup.reserve_nowait(sup.root, input_estimate=1, max_tokens=None, at_least=600)
    assert reservation.max_tokens == 1000


@pytest.mark.parametrize(
    ("budget", "fits"),
    [
        (Budget(output_tokens=1_000), 1_000),
        (Budget(tokens=1_100), 1_000),  # 100 of input
        (Budget(cost=0.011), 1_000),  # $0.001 of input at $1/M, $10/M of output
    ],
)
async def test_a_request_asked_again_is_never_refused_while_its_minimum_fits(
    budget: Budget, fits: int
) -> None:
    # Once failed: a reply cut by the budget's sharing was asked again with room for
    # twice its length, and refused for that ("needs about 1,024, 935 left") though
    # the request's minimum fitted and its real reply might: what the settled usage
    # leaves is what it gets.
    price = Price(input_per_million=10, output_per_million=10)
    sup = started(budget, min_output_tokens=10, prices={"m": price})
    reservation = sup.reserve_nowait(
        sup.root, input_estimate=100, max_tokens=4_096, model="m", at_least=2_048
    )
    assert reservation.max_tokens == fits
    assert sup.root.stop_status is None
    # Spent past its minimum, it is refused saying what its minimum needs.
    sup = started(budget, min_output_tokens=10, prices={"m": price})
    first = sup.reserve_nowait(sup.root, input_estimate=100, max_tokens=fits - 5, model="m")
    sup.settle(sup.root, first, Usage(input_tokens=100, output_tokens=fits - 5, requests=1))
    with pytest.raises(BudgetExceeded) as caught:
        sup.reserve_nowait(sup.root, input_estimate=0, max_tokens=4_096, model="m", at_least=2_048)
    assert "10 output" in caught.value.need_detail or caught.value.need == 10


async def test_input_estimates_held_by_others_make_a_request_wait() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=Budget(input_tokens=100))
    scoped(top)
    first = sup.reserve_nowait(top, input_estimate=60, max_tokens=None)
    with pytest.raises(anyio.WouldBlock):
        sup.reserve_nowait(top, input_estimate=41, max_tokens=None)  # 60 held + 41 > 100
    assert top.stop_status is None
    sup.settle(top, first, Usage(input_tokens=60, output_tokens=1, requests=1))
    with pytest.raises(BudgetExceeded) as caught:  # now 60 settled: it can never fit
        sup.reserve_nowait(top, input_estimate=41, max_tokens=None)
    assert (caught.value.limit, caught.value.need, caught.value.left) == ("input_tokens", 41, 40)
    assert top.stop_status == "budget_exceeded"


async def test_reserve_without_limits_keeps_the_requested_cap() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    assert sup.reserve_nowait(top, input_estimate=5, max_tokens=None).max_tokens is None
    assert sup.reserve_nowait(top, input_estimate=5, max_tokens=64).max_tokens == 64
    assert top.requests == 2


async def test_reserve_refuses_input_estimates_over_input_tokens() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=Budget(input_tokens=100))
    scoped(top)
    with pytest.raises(BudgetExceeded) as caught:
        sup.reserve_nowait(top, input_estimate=101, max_tokens=None)
    assert (caught.value.limit, caught.value.node_id) == ("input_tokens", top.id)
    assert (top.requests, top.reserved_input) == (0, 0)
    assert top.stop_status == "budget_exceeded"


async def test_reserve_counts_requests_on_the_whole_chain() -> None:
    sup = started(Budget(requests=2))
    top = sup.open(sup.root, name="top", limits=Budget(requests=5))
    other = sup.open(sup.root, name="other", limits=None)
    sup.reserve_nowait(top, input_estimate=0, max_tokens=None)
    sup.reserve_nowait(other, input_estimate=0, max_tokens=None)
    with pytest.raises(BudgetExceeded) as caught:
        sup.reserve_nowait(top, input_estimate=0, max_tokens=None)
    assert (caught.value.limit, caught.value.node_id) == ("requests", "root")
    assert (sup.root.requests, top.requests, other.requests) == (2, 1, 1)


async def test_reserve_caps_output_to_the_cost_left() -> None:
    sup = started(prices={"m": PRICE}, min_output_tokens=10)
    top = sup.open(sup.root, name="top", limits=Budget(cost=50))
    scoped(top)
    first = sup.reserve_nowait(top, input_estimate=10, max_tokens=None, model="m")
    # 50 - 10 for the input leaves 40, that is 20 output tokens at 2 each.
    assert first.max_tokens == 20
    assert first.cost == pytest.approx(50.0)
    assert first.price == PRICE
    assert top.reserved_cost == pytest.approx(50.0)
    with pytest.raises(anyio.WouldBlock):  # all of it held, none of it spent
        sup.reserve_nowait(top, input_estimate=0, max_tokens=None, model="m")
    sup.settle(top, first, Usage(input_tokens=10, output_tokens=18, requests=1))
    with pytest.raises(BudgetExceeded) as caught:  # 46 spent: 4 left, 20 needed
        sup.reserve_nowait(top, input_estimate=0, max_tokens=None, model="m")
    assert (caught.value.limit, caught.value.node_id) == ("cost", top.id)
    assert caught.value.need == pytest.approx(20.0)
    assert caught.value.left == pytest.approx(4.0)


async def test_a_cost_limit_without_a_price_is_a_clear_error() -> None:
    sup = started(Budget(cost=1.0), prices={"known": PRICE})
    top = sup.open(sup.root, name="top", limits=None)
    with pytest.raises(ValueError, match="no price is known for model 'mystery'") as caught:
        sup.reserve_nowait(top, input_estimate=1, max_tokens=None, model="mystery")
    assert "Budget.cost is set (budget of runtime 'root')" in str(caught.value)
    assert "Runtime(prices=" in str(caught.value)
    assert (sup.root.requests, top.requests, sup.root.reserved_input) == (0, 0, 0)
    assert sup.root.stop_status is None


async def test_a_price_without_a_cost_limit_still_prices_the_reservation() -> None:
    sup = started(Budget(output_tokens=300), prices={"m": PRICE})
    reservation = sup.reserve_nowait(sup.root, input_estimate=4, max_tokens=None, model="m")
    assert reservation.max_tokens == 300
    assert reservation.cost == pytest.approx(PRICE.cost(4, 300))


@pytest.mark.parametrize(
    ("option", "value"),
    [("min_output_tokens", 0), ("default_max_tokens", -1), ("min_output_tokens", 1.5)],
)
async def test_supervisor_options_are_checked(option: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{option} must be a whole number >= 1"):
        Supervisor(None, **{option: value})  # type: ignore[arg-type]


# -- settle: exact usage, never a refund ---------------------------------------------------


async def test_settle_releases_the_reservation_and_charges_exact_usage_and_cost() -> None:
    sup = started(Budget(tokens=1000), prices={"m": CACHED_PRICE})
    top = sup.open(sup.root, name="top", limits=Budget(cost=500))
    child = sup.open(top, name="child", limits=None)
    reservation = sup.reserve_nowait(child, input_estimate=40, max_tokens=100, model="m")
    assert reservation.max_tokens == 100
    reported = Usage(input_tokens=30, output_tokens=12, cached_tokens=10, requests=1, cost=999.0)
    charged = sup.settle(child, reservation, reported)
    cost = CACHED_PRICE.cost(30, 12, 10)
    assert cost == pytest.approx(20 + 5 + 24)  # the price's cost, not the reported one
    assert charged == Usage(
        input_tokens=30, output_tokens=12, cached_tokens=10, requests=1, cost=cost
    )
    for node in (sup.root, top, child):
        assert (node.reserved_input, node.reserved_output) == (0, 0)
        assert node.reserved_cost == pytest.approx(0.0)
        assert node.usage() == charged
    assert own(sup, child) == charged
    assert own(sup, top) == Usage()
    assert own(sup, sup.root) == Usage()


async def test_settle_without_a_price_keeps_the_reported_cost() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    reservation = sup.reserve_nowait(top, input_estimate=3, max_tokens=None)
    charged = sup.settle(top, reservation, Usage(input_tokens=3, output_tokens=1, cost=0.25))
    assert charged.cost == 0.25
    assert top.cost == sup.root.cost == 0.25


async def test_settle_counts_the_extra_requests_a_model_reports() -> None:
    sup = started(Budget(requests=10))
    top = sup.open(sup.root, name="top", limits=None)
    reservation = sup.reserve_nowait(top, input_estimate=5, max_tokens=None)
    charged = sup.settle(top, reservation, Usage(input_tokens=5, output_tokens=2, requests=3))
    assert charged.requests == 3
    assert top.requests == sup.root.requests == 3
    assert own(sup, top).requests == 3


async def test_extra_requests_a_model_reports_past_a_requests_limit_are_refused() -> None:
    """The requests a model reports beyond those admitted (a retry loop of its own)
    are counters: checked and charged at once, never past a limit; the node whose
    limit they would pass stops with its subtree, saying so."""
    sup = started(Budget(requests=10))
    top = sup.open(sup.root, name="top", limits=Budget(requests=3))
    child = sup.open(top, name="child", limits=None)
    sibling = sup.open(top, name="sibling", limits=None)
    scoped(top, child, sibling)
    other = sup.reserve_nowait(sibling, input_estimate=5, max_tokens=None)  # in flight
    reservation = sup.reserve_nowait(child, input_estimate=5, max_tokens=None)
    charged = sup.settle(child, reservation, Usage(input_tokens=5, output_tokens=2, requests=4))
    assert charged.requests == 2  # its own and the one the in-flight request leaves
    assert (child.requests, top.requests, sup.root.requests) == (2, 3, 3)
    assert own(sup, child).requests == 2
    for node in (top, child, sibling):
        assert node.stop_status == "budget_exceeded"
        assert node.stop_reason == (
            "requests limit of 3 reached: the model reported 4 requests for one call, 2 more "
            f"than the budget had room for (budget of top {top.id!r})"
        )
    assert cancel_called(top)
    assert sup.root.stop_status is None
    sup.settle(sibling, other, Usage(input_tokens=5, output_tokens=2, requests=1))
    assert top.requests == 3


async def test_requests_admitted_during_a_call_are_counters_and_settle_counts_them_once() -> None:
    """A model built on another asks for each of its requests after the first while
    the call runs (``charge(requests=1)``): refused with no room, and not counted
    again when the call settles with all of them in its usage."""
    sup = started()
    top = sup.open(sup.root, name="top", limits=Budget(requests=2))
    scoped(top)
    reservation = sup.reserve_nowait(top, input_estimate=5, max_tokens=None)
    sup.charge(top, requests=1)
    reservation.requests += 1
    with pytest.raises(BudgetExceeded, match="requests limit of 2 reached"):
        sup.charge(top, requests=1)
    assert top.stop_status == "budget_exceeded"
    charged = sup.settle(top, reservation, Usage(input_tokens=5, output_tokens=2, requests=2))
    assert charged.requests == 2
    assert top.requests == own(sup, top).requests == 2
    assert top.stop_reason == f"requests limit of 2 reached (budget of top {top.id!r})"


async def test_settle_with_nothing_reported_charges_the_input_estimate() -> None:
    sup = started(Budget(tokens=1000, output_tokens=500), prices={"m": PRICE})
    top = sup.open(sup.root, name="top", limits=None)
    reservation = sup.reserve_nowait(top, input_estimate=20, max_tokens=None, model="m")
    assert reservation.max_tokens == 500
    charged = sup.settle(top, reservation, None)
    assert charged == Usage(input_tokens=20, requests=1, cost=PRICE.cost(20, 0))
    for node in (sup.root, top):
        assert (node.reserved_input, node.reserved_output, node.reserved_cost) == (0, 0, 0.0)
        assert (node.input_tokens, node.output_tokens, node.requests) == (20, 0, 1)
    # The rest of the headroom is back.
    assert sup.reserve_nowait(top, input_estimate=20, max_tokens=None, model="m").max_tokens == 500


@pytest.mark.parametrize(
    ("usage", "problem"),
    [
        (Usage(input_tokens=-5, output_tokens=3, requests=1), "input_tokens=-5 is negative"),
        (Usage(input_tokens=5, output_tokens=-300, requests=1), "output_tokens=-300 is negative"),
        (Usage(input_tokens=5, output_tokens=1, requests=-1), "requests=-1 is negative"),
        (Usage(input_tokens=5, output_tokens=1, cost=-1.0), "cost=-1.0 is not a finite number"),
        (Usage(input_tokens=5, output_tokens=1, cost=math.nan), "cost=nan is not a finite"),
        (Usage(input_tokens=5, output_tokens=41, requests=1), "41 output tokens for a request"),
        (Usage(input_tokens=10**12, requests=1), "input_tokens=1,000,000,000,000 for one"),
    ],
)
async def test_impossible_usage_is_refused_and_charged_never_refunded(
    usage: Usage, problem: str
) -> None:
    sup = started(Budget(tokens=1000))
    top = sup.open(sup.root, name="top", limits=None)
    spent = sup.reserve_nowait(top, input_estimate=10, max_tokens=40)
    sup.settle(top, spent, Usage(input_tokens=10, output_tokens=40, requests=1))
    reservation = sup.reserve_nowait(top, input_estimate=10, max_tokens=40)
    with pytest.raises(InvalidUsage, match=problem) as caught:
        sup.settle(top, reservation, usage, model="liar")
    assert str(caught.value).startswith("model 'liar' reported impossible usage: ")
    # The whole reservation is charged: what the model may at most have used.
    assert caught.value.charged == Usage(input_tokens=10, output_tokens=40, requests=1)
    assert (top.input_tokens, top.output_tokens) == (20, 80)
    assert (top.reserved_input, top.reserved_output) == (0, 0)


async def test_settle_past_a_limit_stops_that_subtree() -> None:
    sup = started(min_output_tokens=5)
    top = sup.open(sup.root, name="top", limits=None)
    worker = sup.open(top, name="worker", limits=Budget(tokens=30))
    helper = sup.open(worker, name="helper", limits=None)
    sibling = sup.open(top, name="sibling", limits=None)
    scoped(top, worker, helper, sibling)
    reservation = sup.reserve_nowait(helper, input_estimate=5, max_tokens=None)
    assert reservation.max_tokens == 25
    # The input was longer than its estimate: the usage is charged all the same.
    charged = sup.settle(helper, reservation, Usage(input_tokens=25, output_tokens=15))
    assert charged.input_tokens == 25
    assert worker.input_tokens == top.input_tokens == 25
    for node in (worker, helper):
        assert node.stop_status == "budget_exceeded"
        assert node.stop_reason == (
            "tokens limit of 30 reached: 40 used: a request used more than its estimate "
            f"(budget of worker {worker.id!r})"
        )
    assert cancel_called(worker)
    for node in (top, sibling):
        assert node.stop_status is None
        assert not cancel_called(node)


async def test_settle_past_an_ancestors_limit_stops_the_ancestors_subtree() -> None:
    sup = started(Budget(input_tokens=10), min_output_tokens=5)
    worker = sup.open(sup.root, name="worker", limits=Budget(input_tokens=10))
    sibling = sup.open(sup.root, name="sibling", limits=None)
    scoped(worker, sibling)
    reservation = sup.reserve_nowait(worker, input_estimate=1, max_tokens=None)
    sup.settle(worker, reservation, Usage(input_tokens=20, output_tokens=1))
    assert worker.stop_status == "budget_exceeded"
    # The runtime's limit is past as well: everything under it stops, not just worker.
    assert sup.root.stop_status == "budget_exceeded"
    assert sibling.stop_status == "budget_exceeded"
    assert cancel_called(sibling)


async def test_settle_within_limits_stops_nothing() -> None:
    sup = started(Budget(tokens=300, output_tokens=256, requests=1))
    top = sup.open(sup.root, name="top", limits=None)
    reservation = sup.reserve_nowait(top, input_estimate=20, max_tokens=None)
    assert reservation.max_tokens == 256
    sup.settle(top, reservation, Usage(input_tokens=20, output_tokens=256, requests=1))
    assert sup.root.stop_status is None
    assert top.stop_status is None


# -- deadlines and stops ----------------------------------------------------------------


async def test_deadlines_are_the_earlier_of_the_own_and_the_parents() -> None:
    before = anyio.current_time()
    sup = started(Budget(seconds=10))
    assert sup.root.deadline_owner is sup.root
    assert before + 10 <= sup.root.deadline <= anyio.current_time() + 10
    loose = sup.open(sup.root, name="loose", limits=Budget(seconds=100))
    assert loose.deadline == sup.root.deadline
    assert loose.deadline_owner is sup.root
    before = anyio.current_time()
    tight = sup.open(loose, name="tight", limits=Budget(seconds=1))
    assert before + 1 <= tight.deadline <= anyio.current_time() + 1
    assert tight.deadline_owner is tight
    inner = sup.open(tight, name="inner", limits=Budget(tokens=5))
    assert inner.deadline == tight.deadline
    assert inner.deadline_owner is tight


async def test_without_any_seconds_there_is_no_deadline() -> None:
    sup = started(Budget(tokens=5))
    top = sup.open(sup.root, name="top", limits=None)
    assert sup.root.deadline == top.deadline == math.inf
    assert sup.root.deadline_owner is None
    assert top.deadline_owner is None


async def test_why_stopped_prefers_the_supervisors_stop() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=Budget(seconds=0.001))
    sup.stop_subtree(top, "budget_exceeded", "requests limit of 1 reached")
    with anyio.CancelScope(deadline=top.deadline):
        await anyio.sleep_forever()
    assert anyio.current_time() >= top.deadline
    assert sup.why_stopped(top) == ("budget_exceeded", "requests limit of 1 reached")


async def test_why_stopped_after_the_deadline_names_the_budget_that_set_it() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=Budget(seconds=0.01))
    child = sup.open(top, name="child", limits=None)
    assert sup.why_stopped(child) == ("cancelled", "cancelled")
    with anyio.CancelScope(deadline=child.deadline):
        await anyio.sleep_forever()
    expected = ("timed_out", f"deadline of 0.01 s passed (budget of top {top.id!r})")
    assert sup.why_stopped(child) == expected
    assert sup.why_stopped(top) == expected


async def test_why_stopped_for_a_plain_cancellation() -> None:
    sup = started(Budget(seconds=60))
    top = sup.open(sup.root, name="top", limits=None)
    assert sup.why_stopped(top) == ("cancelled", "cancelled")
    sup.cancel(top.id)
    assert sup.why_stopped(top) == ("cancelled", f"cancelled (top {top.id!r})")


async def test_cancel_stops_the_subtree_and_unknown_ids_are_a_key_error() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    child = sup.open(top, name="child", limits=None)
    other = sup.open(sup.root, name="other", limits=None)
    scoped(top, child, other)
    sup.cancel(top.id)
    assert top.stop_status == child.stop_status == "cancelled"
    assert other.stop_status is None
    assert cancel_called(top)
    assert not cancel_called(other)
    with pytest.raises(KeyError, match="no running node 'nope#9'"):
        sup.cancel("nope#9")


async def test_abandon_ends_the_child_for_the_parents_reason() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(steps=1))
    child = sup.open(parent, name="child", limits=None)
    grandchild = sup.open(child, name="grandchild", limits=None)
    scoped(parent, child, grandchild)
    sup.charge(parent, steps=1)
    with pytest.raises(BudgetExceeded) as caught:
        sup.charge(parent, steps=1)
    reason = str(caught.value)
    # The child was stopped with its parent already; abandoning it closes it.
    sup.abandon(child, parent)
    assert child.status == "budget_exceeded"
    assert child.stop_reason == reason
    assert child.id not in sup.nodes
    assert child not in parent.children
    assert grandchild.stop_status == "budget_exceeded"
    assert grandchild.status == "running"  # it closes itself when it has answered


async def test_abandon_after_a_plain_cancellation_cancels_the_child() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=None)
    child = sup.open(parent, name="child", limits=None)
    scoped(child)
    sup.abandon(child, parent)
    assert (child.status, child.stop_reason) == ("cancelled", "cancelled")
    assert child.stop_status == "cancelled"
    assert child.scope is None  # closed: the scope is dropped


async def test_abandon_leaves_an_answered_child_alone() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=None)
    child = sup.open(parent, name="child", limits=None)
    sup.close(child, "completed", "final answer")
    sup.cancel(parent.id)
    sup.abandon(child, parent)
    assert (child.status, child.stop_reason) == ("completed", "final answer")
    assert child.stop_status is None


async def test_close_first_wins_and_removes_the_node_from_the_live_tree() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    child = sup.open(top, name="child", limits=None)
    sup.close(child, "completed", "final answer")
    sup.close(child, "failed", "too late")
    assert (child.status, child.stop_reason) == ("completed", "final answer")
    assert child.ended is not None
    assert child.id not in sup.nodes
    assert top.children == set()
    with pytest.raises(KeyError, match=child.id):
        sup.get(child.id)
    assert sup.get(top.id) is top


async def test_close_keeps_the_stop_reason_when_given_none() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    sup.stop_subtree(top, "timed_out", "deadline of 1 s passed")
    sup.close(top, "timed_out")
    assert (top.status, top.stop_reason) == ("timed_out", "deadline of 1 s passed")


async def test_the_root_is_never_closed() -> None:
    sup = started()
    sup.close(sup.root, "failed", "no")
    assert sup.root.status == "running"
    assert sup.get("root") is sup.root


# -- snapshot ---------------------------------------------------------------------------


async def test_snapshot_lists_live_then_finished_nodes_and_round_trips() -> None:
    budget = Budget(tokens=1000, steps=20)
    sup = started(budget, prices={"m": PRICE})
    top = sup.open(sup.root, name="top", limits=Budget(requests=5))
    child = sup.open(top, name="child", limits=None)
    done = sup.open(top, name="done", limits=None)
    sup.charge(child, steps=2, tool_calls=1)
    reservation = sup.reserve_nowait(child, input_estimate=10, max_tokens=5, model="m")
    sup.settle(child, reservation, Usage(input_tokens=10, output_tokens=5))
    sup.charge(top, steps=1)
    sup.close(done, "failed", "it broke")

    tree = sup.snapshot()
    assert [node.id for node in tree.nodes] == ["root", top.id, child.id, done.id]
    assert [node.parent_id for node in tree.nodes] == [None, "root", top.id, top.id]
    assert [node.status for node in tree.nodes] == ["running", "running", "running", "failed"]
    assert [node.depth for node in tree.nodes] == [0, 1, 2, 2]
    root_view, top_view, child_view, done_view = tree.nodes
    assert root_view.limits == budget
    assert top_view.limits == Budget(requests=5)
    assert child_view.limits is None
    cost = PRICE.cost(10, 5)
    expected = Usage(input_tokens=10, output_tokens=5, requests=1, tool_calls=1, cost=cost)
    assert child_view.usage == child_view.own_usage == expected
    assert top_view.usage == root_view.usage == expected
    assert top_view.own_usage == root_view.own_usage == Usage()
    assert (top_view.steps, child_view.steps, top_view.agents, root_view.agents) == (3, 2, 2, 3)
    assert done_view.stop_reason == "it broke"
    assert (child_view.name, child_view.depth) == ("child", 2)
    assert tree.children(top.id) == (child_view, done_view)
    assert tree.node(child.id) is child_view
    with pytest.raises(KeyError, match="no node 'ghost'"):
        tree.node("ghost")
    assert all(node.seconds >= 0 and node.started >= 0 for node in tree.nodes)
    assert decode_json(encode_json(tree), TreeSnapshot) == tree


async def test_a_snapshot_lists_parents_before_children() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=None)
    child = sup.open(parent, name="child", limits=None)
    sup.close(child, "completed")
    sup.close(parent, "completed")
    order = [node.id for node in sup.snapshot().nodes]
    assert order.index(parent.id) < order.index(child.id)  # as TreeSnapshot promises


async def test_a_snapshot_is_a_copy() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    before = sup.snapshot()
    sup.charge(top, tool_calls=1)
    sup.close(top, "completed")
    assert before.node(top.id).status == "running"
    assert before.node(top.id).usage == Usage()
    assert sup.snapshot().node(top.id).usage == Usage(tool_calls=1)


# -- property: random operations never overshoot, totals add up -------------------------------

LIMITS: dict[str, st.SearchStrategy[int] | st.SearchStrategy[float]] = {
    "tokens": st.integers(0, 400),
    "input_tokens": st.integers(0, 400),
    "output_tokens": st.integers(0, 400),
    "requests": st.integers(0, 12),
    "tool_calls": st.integers(0, 12),
    "steps": st.integers(0, 12),
    "cost": st.floats(0.001, 0.5),
}


@st.composite
def budgets(draw: st.DrawFn) -> Budget | None:
    """No budget (one time in three), or one to three limits (more refuse nearly all)."""
    if draw(st.integers(0, 2)) == 0:
        return None
    names = draw(st.sets(st.sampled_from(sorted(LIMITS)), min_size=1, max_size=3))
    limits: dict[str, Any] = {name: draw(LIMITS[name]) for name in sorted(names)}
    return Budget(**limits)


#: Each new node's parent, as an index into the nodes made before it (0 is the root).
tree_shapes = st.lists(st.integers(0, 10), max_size=6).map(
    lambda raw: [index % (position + 1) for position, index in enumerate(raw)]
)
fractions = st.one_of(st.sampled_from([1.0, 0.5, 0.0]), st.floats(0, 1))
reserve_ops = st.tuples(
    st.just("reserve"),
    st.integers(0, 10),
    st.integers(0, 60),
    st.one_of(st.none(), st.none(), st.integers(1, 200)),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("charge"), st.integers(0, 10), st.integers(0, 3), st.integers(0, 3)),
        reserve_ops,
        reserve_ops,
        st.tuples(st.just("settle"), st.integers(0, 10), fractions, fractions),
        st.tuples(st.just("settle"), st.integers(0, 10), fractions, fractions),
        st.tuples(st.just("release"), st.integers(0, 10), st.just(0), st.just(0)),
    ),
    min_size=10,
    max_size=60,
)


#: A thousandth of a unit per input token, two per output token: costs of 0.001 to 0.5.
CHEAP = Price(input_per_million=1_000, output_per_million=2_000)


@dataclass
class Expected:
    """What the test expects of the tree, kept on the side."""

    nodes: list[Node]
    own_steps: dict[str, int] = field(default_factory=dict)
    held: list[tuple[Node, Reservation]] = field(default_factory=list)


def check_tree(sup: Supervisor, model: Expected) -> None:
    tree = sup.snapshot()
    for node in model.nodes:
        budget = node.limits
        if budget is not None:
            within(node.requests, budget.requests)
            within(node.tool_calls, budget.tool_calls)
            within(node.steps, budget.steps)
            within(node.input_tokens + node.reserved_input, budget.input_tokens)
            within(node.output_tokens + node.reserved_output, budget.output_tokens)
            total = node.input_tokens + node.reserved_input
            within(total + node.output_tokens + node.reserved_output, budget.tokens)
            if budget.cost is not None:
                spent = node.cost + node.reserved_cost
                assert spent <= budget.cost * (1 + 1e-9), (node, spent, budget.cost)
        children = [child for child in model.nodes if child.parent is node]
        expected = sum((child.usage() for child in children), tree.node(node.id).own_usage)
        usage = node.usage()
        for name in ("input_tokens", "output_tokens", "cached_tokens", "requests", "tool_calls"):
            assert getattr(usage, name) == getattr(expected, name), (node, name)
        assert usage.cost == pytest.approx(expected.cost, rel=1e-9, abs=1e-12)
        own_steps = model.own_steps.get(node.id, 0)
        assert node.steps == own_steps + sum(child.steps for child in children)
        assert node.reserved_input >= 0
        assert node.reserved_output >= 0
        assert node.reserved_cost >= -1e-12


def check_honest(sup: Supervisor, error: BudgetExceeded) -> None:
    """A refusal of tokens or cost: settled usage left less than what was needed."""
    if error.need is None:
        return
    assert error.left is not None
    assert error.need > error.left, error
    owner = sup.nodes.get(error.node_id) or sup.root
    assert owner.id == error.node_id
    settled = {
        "tokens": owner.input_tokens + owner.output_tokens,
        "input_tokens": owner.input_tokens,
        "output_tokens": owner.output_tokens,
        "cost": owner.cost,
    }[error.limit]
    assert error.left == pytest.approx(error.allowed - settled), error


def within(value: int, limit: int | None) -> None:
    assert limit is None or value <= limit, (value, limit)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    root_budget=budgets(),
    shape=tree_shapes,
    node_budgets=st.lists(budgets(), min_size=6, max_size=6),
    ops=operations,
)
async def test_random_operations_never_overshoot_and_totals_add_up(
    root_budget: Budget | None,
    shape: list[int],
    node_budgets: list[Budget | None],
    ops: list[tuple[str, int, float, float | None]],
) -> None:
    sup = started(root_budget, prices={"m": CHEAP}, min_output_tokens=8)
    model = Expected(nodes=[sup.root])
    for position, parent_index in enumerate(shape):
        parent = model.nodes[parent_index]
        try:
            node = sup.open(parent, name=f"n{position}", limits=node_budgets[position])
        except BudgetExceeded:
            continue  # depth and agents limits are not drawn: this never happens
        model.nodes.append(node)
    check_tree(sup, model)
    for kind, index, first, second in ops:
        if kind == "charge":
            node = model.nodes[index % len(model.nodes)]
            try:
                sup.charge(node, steps=int(first), tool_calls=int(second or 0))
            except BudgetExceeded:
                pass
            else:
                model.own_steps[node.id] = model.own_steps.get(node.id, 0) + int(first)
        elif kind == "reserve":
            node = model.nodes[index % len(model.nodes)]
            max_tokens = None if second is None else int(second)
            try:
                reservation = sup.reserve_nowait(
                    node, input_estimate=int(first), max_tokens=max_tokens, model="m"
                )
            except anyio.WouldBlock:
                assert node.stop_status is None  # held headroom never stops anyone
            except BudgetExceeded as exc:
                check_honest(sup, exc)
            else:
                if max_tokens is not None:
                    assert reservation.max_tokens is not None
                    assert reservation.max_tokens <= max_tokens
                model.held.append((node, reservation))
        elif model.held:
            node, reservation = model.held.pop(index % len(model.held))
            if kind == "release":
                sup.settle(node, reservation, None)
            else:
                # Real usage within what was reserved: at most the estimate and the cap.
                assert second is not None
                cap = reservation.max_tokens if reservation.max_tokens is not None else 50
                usage = Usage(
                    input_tokens=math.floor(reservation.input * first),
                    output_tokens=math.floor(cap * second),
                    requests=1,
                )
                charged = sup.settle(node, reservation, usage)
                assert charged.cost == pytest.approx(
                    CHEAP.cost(usage.input_tokens, usage.output_tokens)
                )
        check_tree(sup, model)
    for node, reservation in model.held:
        sup.settle(node, reservation, None)
    check_tree(sup, model)
    for node in model.nodes:
        assert (node.reserved_input, node.reserved_output) == (0, 0)
        assert node.reserved_cost == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(("gap", "admitted"), [(1e-10, True), (0.0, True), (1e-6, False)])
async def test_a_cost_at_the_edge_is_admitted_or_refused_never_left_waiting(
    gap: float, admitted: bool
) -> None:
    # Found by the property test: the refusal and the wait used different slack for
    # sums of floats, and a request between the two waited with nothing in flight.
    sup = started(prices={"m": PRICE}, min_output_tokens=64)
    top = sup.open(sup.root, name="top", limits=Budget(cost=PRICE.cost(12, 64) - gap))
    if admitted:
        reservation = sup.reserve_nowait(top, input_estimate=12, max_tokens=None, model="m")
        assert reservation.max_tokens == 64
    else:
        with pytest.raises(BudgetExceeded) as caught:
            sup.reserve_nowait(top, input_estimate=12, max_tokens=None, model="m")
        assert caught.value.limit == "cost"


async def test_a_request_never_waits_when_nothing_is_in_flight() -> None:
    # Whatever the arithmetic says, a wait needs a reservation that can come back.
    sup = started(min_output_tokens=10)
    top = sup.open(sup.root, name="top", limits=Budget(input_tokens=100))
    first = sup.reserve_nowait(top, input_estimate=60, max_tokens=None)
    sup.release(top, first)  # given back: nothing in flight, nothing spent
    assert (top.in_flight, top.requests) == (0, 0)
    assert sup.reserve_nowait(top, input_estimate=100, max_tokens=None).input == 100


def opened(name: str) -> str:
    """The id of a first node ``name`` in a new supervisor's tree."""
    supervisor = Supervisor(None)
    return supervisor.open(supervisor.root, name=name, limits=None).id


async def test_execution_ids_carry_64_random_bits_so_runtimes_sharing_a_store_never_meet() -> None:
    # A stored record with the same id would replace another runtime's trace.
    ids = {opened("lead") for _ in range(1_000)}
    assert len(ids) == 1_000
    name, rest = next(iter(ids)).split("#")
    number, token = rest.split(".")
    assert (name, number, len(token)) == ("lead", "1", 16)
    assert int(token, 16) >= 0  # hex


async def test_a_closed_node_keeps_its_end_when_its_subtree_is_stopped_after() -> None:
    # A remote child's stand-in closed its node with the host's answer; the parent's
    # interrupted delegation then stops what it still counted as running (fuzz seed 93,
    # trio, hosts: the node said completed, 'cancelled', its trace the host's reason).
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    child = sup.open(top, name="child", limits=None)
    grandchild = sup.open(child, name="grandchild", limits=None)
    sup.close(child, "completed", "the agent's stop condition was met")
    sup.stop_subtree(child, "cancelled", "cancelled", cancel=False)
    assert (child.status, child.stop_reason) == ("completed", "the agent's stop condition was met")
    assert child.stop_status is None
    # What still runs below it is stopped all the same.
    assert grandchild.stop_status == "cancelled"


@pytest.mark.parametrize("sharing", ["fair", "whole"])
async def test_output_sharing_decides_between_a_fair_share_and_all_it_wants(
    sharing: OutputSharing,
) -> None:
    sup = Supervisor(Budget(output_tokens=1_000), min_output_tokens=10, output_sharing=sharing)
    sup.start()
    first, second = (sup.open(sup.root, name=name, limits=None) for name in ("a", "b"))
    held = sup.reserve_nowait(first, input_estimate=10, max_tokens=800)
    if sharing == "fair":  # a share each: they run together, cut at 500
        assert held.max_tokens == 500
        assert sup.reserve_nowait(second, input_estimate=10, max_tokens=800).max_tokens == 500
        return
    # All it wants; the second waits for the first to settle rather than be cut.
    assert held.max_tokens == 800
    with pytest.raises(anyio.WouldBlock):
        sup.reserve_nowait(second, input_estimate=10, max_tokens=800)
    sup.settle(first, held, Usage(input_tokens=10, output_tokens=700, requests=1))
    assert sup.reserve_nowait(second, input_estimate=10, max_tokens=800).max_tokens == 300
    assert sup.output_sharing == "whole"


def test_output_sharing_is_fair_or_whole() -> None:
    with pytest.raises(ValueError, match='output_sharing must be "fair" or "whole"'):
        Supervisor(None, output_sharing="greedy")  # type: ignore[arg-type]


# -- the one-counter fast paths give what the general charge gives ---------------------

one_counter_ops = st.lists(
    st.tuples(st.sampled_from(["step", "tool_call", "stop"]), st.integers(0, 10)),
    min_size=1,
    max_size=40,
)


def _charged(sup: Supervisor, node: Node, kind: str, fast: bool) -> object:
    """What one step or tool call charged on ``node`` gives: True, False (held up) or
    the refusal's limit and node."""
    try:
        if kind == "step":
            return sup.try_step(node) if fast else sup.try_charge(node, steps=1)
        return sup.try_tool_call(node) if fast else sup.try_charge(node, tool_calls=1)
    except BudgetExceeded as exc:
        return (exc.limit, exc.allowed, exc.node_name)


def _tree_state(nodes: list[Node]) -> list[tuple[Usage, Usage, str | None, str]]:
    return [(n.usage(), n.own_usage(), n.stop_status, n.stop_reason.split(" (")[0]) for n in nodes]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    root_budget=budgets(),
    shape=tree_shapes,
    node_budgets=st.lists(budgets(), min_size=6, max_size=6),
    cap=st.one_of(st.none(), st.integers(1, 3)),
    ops=one_counter_ops,
)
async def test_try_step_and_try_tool_call_give_what_try_charge_gives(
    root_budget: Budget | None,
    shape: list[int],
    node_budgets: list[Budget | None],
    cap: int | None,
    ops: list[tuple[str, int]],
) -> None:
    # The same tree twice: one charged by the fast paths, one by the general charge.
    caps = None if cap is None else Caps(steps=cap)
    sups = [Supervisor(root_budget, caps=caps) for _ in range(2)]
    trees: list[list[Node]] = []
    for sup in sups:
        sup.start()
        nodes = [sup.root]
        for position, parent_index in enumerate(shape):
            nodes.append(
                sup.open(nodes[parent_index], name=f"n{position}", limits=node_budgets[position])
            )
        scoped(*nodes[1:])
        trees.append(nodes)
    (fast, general), (fast_nodes, general_nodes) = sups, trees
    for kind, index in ops:
        at = index % len(fast_nodes)
        if kind == "stop":
            for sup, nodes in zip(sups, trees, strict=True):
                if nodes[at].parent is not None:
                    sup.stop_subtree(nodes[at], "cancelled", "stopped by the test")
            continue
        assert _charged(fast, fast_nodes[at], kind, True) == _charged(
            general, general_nodes[at], kind, False
        )
        assert _tree_state(fast_nodes) == _tree_state(general_nodes)
