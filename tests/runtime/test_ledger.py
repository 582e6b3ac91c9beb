"""Leases of headroom for subtrees on other hosts, at the supervisor level.

No agents and no hosts: a test plays the host of a remote subtree by calling the
ledger as a remote child's stand-in does (``ask``, ``report``, ``end``) on a node
opened here, and plays local executions with ``reserve`` / ``settle`` / ``charge``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.abc import TaskGroup
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fractor.runtime import Budget, BudgetExceeded, Caps, Node, Reservation, Supervisor, Usage
from fractor.runtime._ledger import GROWTH, TELL
from fractor.runtime.lowlevel import LEASED, HeldUp, Lease, Tally, Want

#: What a refusal says when only a lost host's lease stands in the way.
LOST = "leased to a host that was lost"


def started(budget: Budget | None = None, *, caps: Caps | None = None) -> Supervisor:
    sup = Supervisor(budget, caps=caps)
    sup.start()
    return sup


def children(sup: Supervisor, parent: Node, *names: str) -> list[Node]:
    return [sup.open(parent, name=name, limits=None) for name in names]


def leased(sup: Supervisor, parent: Node, name: str = "remote") -> Node:
    """A child of ``parent`` whose subtree runs on another host."""
    node = sup.open(parent, name=name, limits=None)
    sup.ledger.open(node)
    return node


def held(node: Node, name: str) -> float:
    """What leases below ``node`` hold of its ``name`` headroom."""
    value: float = getattr(node.held, name) if node.held is not None else 0
    return value


def used(tokens: int = 0, *, requests: int = 0, tool_calls: int = 0) -> Tally:
    """A remote subtree's tally: ``tokens`` used, half input and half output."""
    usage = Usage(
        input_tokens=tokens // 2,
        output_tokens=tokens - tokens // 2,
        requests=requests,
        tool_calls=tool_calls,
    )
    return Tally(usage=usage, own=usage)


class Task:
    """The outcome of one awaitable run in the background by ``background``."""

    def __init__(self) -> None:
        self.done = False
        self.value: object = None
        self.error: BudgetExceeded | None = None


def background(tg: TaskGroup, work: Callable[[], Awaitable[object]]) -> Task:
    task = Task()

    async def run() -> None:
        try:
            task.value = await work()
        except BudgetExceeded as exc:
            task.error = exc
        task.done = True

    tg.start_soon(run)
    return task


# -- a lease starts empty -------------------------------------------------------------


async def test_a_lease_starts_empty_on_every_limited_field_of_the_chain() -> None:
    sup = started(Budget(tokens=1_000, cost=1.0))
    top = sup.open(sup.root, name="top", limits=Budget(tool_calls=5, steps=3))
    lease = sup.ledger.open(sup.open(top, name="remote", limits=None))
    limits = lease.limits()
    assert lease.fields == ("tokens", "tool_calls", "steps", "cost")  # in Budget's order
    # Empty but for one step, what its first operation needs (no round trip for it).
    assert limits == Budget(tokens=0, cost=0.0, tool_calls=0, steps=1)
    assert isinstance(limits.tokens, int)
    assert isinstance(limits.cost, float)
    for node in (top, sup.root):  # held on the whole chain
        assert node.held is not None
        assert (node.held.leases, node.held.holding, node.held.lost) == (1, 1, None)
        assert [name for name in LEASED if held(node, name)] == ["steps"]
        assert held(node, "steps") == 1
    # Where no step is free, it opens with nothing at all.
    sup.charge(top, steps=2)
    bare = sup.ledger.open(sup.open(top, name="bare", limits=None))
    assert bare.limits().steps == 0
    assert top.held is not None
    assert top.held.holding == 1


async def test_a_lease_on_a_chain_with_no_limits_grants_nothing_and_limits_nothing() -> None:
    sup = started()
    lease = sup.ledger.open(sup.open(sup.root, name="remote", limits=None))
    assert lease.fields == ()
    assert lease.limits() == Budget()


@pytest.mark.parametrize(
    ("root", "top", "caps", "depth"),
    [
        (Budget(depth=5), None, None, 3),
        (Budget(depth=5), Budget(depth=3), None, 2),
        (None, Budget(depth=1), None, 0),
        (Budget(depth=5), Budget(depth=3), Caps(depth=3), 1),
        (None, None, Caps(depth=8), 6),
        (None, None, None, None),
    ],
)
async def test_a_lease_carries_the_tightest_remaining_depth_of_budgets_and_caps(
    root: Budget | None, top: Budget | None, caps: Caps | None, depth: int | None
) -> None:
    sup = started(root, caps=caps)
    parent = sup.open(sup.root, name="top", limits=top)
    remote = sup.open(parent, name="remote", limits=None)  # at depth 2
    lease = sup.ledger.open(remote)
    assert lease.depth == depth
    # It travels with each subtree (the lease's node on the host is one level above).
    assert lease.limits().depth is None
    assert sup.ledger.own_limits(remote).depth == depth


async def test_the_runtime_cap_on_agents_is_leased_like_a_budget() -> None:
    sup = started(caps=Caps(agents=50))
    top = sup.open(sup.root, name="top", limits=None)
    remote = leased(sup, top)
    assert remote.lease is not None
    assert remote.lease.fields == ("agents",)
    assert remote.lease.limits().agents == 0
    granted = await sup.ledger.ask(remote, Tally(), Want(agents=3))
    # Alone under the cap, its share is all that is left (49: top has 1), but a
    # fresh lease gets at most GROWTH times what it needs.
    assert granted.agents == GROWTH * 3 == 12
    assert held(top, "agents") == 12


# -- asks are granted ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("want", "grant"),
    [
        (500, 2_000),  # a fair share is 2,500, GROWTH times 500 less
        (1_000, 2_500),
        (2_500, 2_500),
        (4_000, 4_000),
        (10_000, 10_000),
    ],
)
async def test_an_ask_gets_what_it_wants_or_a_fair_share_if_more(want: int, grant: int) -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000))
    remote = leased(sup, parent)
    children(sup, parent, "a", "b", "c")  # 4 parts: 10,000 // 4 = 2,500
    limits = await sup.ledger.ask(remote, Tally(), Want(tokens=want))
    assert limits.tokens == grant
    assert held(parent, "tokens") == grant
    assert parent.held is not None
    assert (parent.held.leases, parent.held.holding) == (1, 1)


async def test_a_lease_grows_by_a_share_of_what_is_free_shrinking_as_it_runs_out() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000, cost=1.0))
    remote = leased(sup, parent)
    children(sup, parent, "local")  # 2 parts: the remote subtree and the local child
    limits = await sup.ledger.ask(remote, Tally(), Want(tokens=2_000, cost=0.2))
    assert limits.tokens == 5_000
    assert limits.cost == pytest.approx(0.5)
    assert held(parent, "tokens") == 5_000
    # It used it all: the next grant is half of what is free now, and so on: a
    # subtree asks about log2(budget / request) times, not once per few requests.
    grants: list[int] = []
    spent = 5_000
    while spent < 9_900:
        limits = await sup.ledger.ask(remote, used(spent), Want(tokens=100))
        assert limits.tokens is not None
        grants.append(limits.tokens - spent)
        spent = limits.tokens
    assert grants == [2_500, 1_250, 625, 312, 156, 100]
    assert held(parent, "tokens") == 100


async def test_a_fresh_lease_gets_at_most_growth_times_what_it_needs_then_grows_with_use() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=100_000))
    remote = leased(sup, parent)  # alone: its share is all of it
    # The first to ask never takes what siblings about to start will need: GROWTH
    # times its need; a lease that used what it was given grows by GROWTH times that.
    grants: list[int] = []
    spent = 0
    while spent < 100_000:
        limits = await sup.ledger.ask(remote, used(spent), Want(tokens=100))
        assert limits.tokens is not None
        grants.append(limits.tokens - spent)
        spent = limits.tokens
    assert grants == [GROWTH * 100, GROWTH * 400, GROWTH * 2_000, GROWTH * 10_000, 50_000]


async def test_a_request_ask_grows_a_lease_by_whole_requests_not_minima() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=100_000, cost=10.0))
    remote = leased(sup, parent)
    # A request of 100 input that wants 4,096 output needs room for 116 (its
    # minimum output, 16): its lease holds GROWTH such requests whole.
    want = Want(tokens=116, output_tokens=16, cost=0.001, wanted_output=4_096)
    limits = await sup.ledger.ask(remote, Tally(), want)
    assert limits.tokens == GROWTH * (100 + 4_096)
    assert limits.cost == pytest.approx(GROWTH * 0.001 * 4_096 / 16)


async def test_a_lease_host_is_told_when_a_part_of_the_budget_grows_a_quarter_again() -> None:
    assert TELL == 1.25
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(output_tokens=900))
    first, second, third = (leased(sup, parent, name) for name in ("first", "second", "third"))
    told: list[tuple[str, dict[str, float]]] = []
    for node in (first, second, third):
        assert node.lease is not None
        node.lease.tell = lambda worth, name=node.name: told.append((name, worth))
        await sup.ledger.ask(node, Tally(), Want(output_tokens=16))
    # Three parts of 900: each was granted when a part was worth 300 (or less).
    sup.ledger.end(first, Tally(usage=Usage(output_tokens=250)))
    sup.close(first, "completed")
    # 650 left in 2 parts: 325, not a quarter again over 300: nobody is told.
    assert told == []
    sup.ledger.end(second, Tally(usage=Usage(output_tokens=100)))
    sup.close(second, "completed")
    # 550 left for the one part left: third's host hears of it, once.
    assert told == [("third", {"output_tokens": 550.0})]
    sup.ledger.report(third, Tally(usage=Usage(output_tokens=10)))
    sup.ledger.hint()
    assert len(told) == 1


async def test_a_request_cut_deep_is_granted_whole_tokens_so_no_fraction_stays_held() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(output_tokens=1_000))
    remote = leased(sup, parent)
    children(sup, parent, "a", "b")
    # Cut deep on its host, it asks for its fair part, or what a request here would
    # take: a third of what is free (333.33...), in whole tokens.
    want = Want(output_tokens=16, wanted_output=4_096, fair_output=100)
    limits = await sup.ledger.ask(remote, Tally(), want)
    assert remote.lease is not None
    assert limits.output_tokens == remote.lease.granted["output_tokens"] == 333
    assert held(parent, "output_tokens") == 333
    # Its subtree ends having used all but 1: nothing at all stays held (a fraction
    # would have an ask for the last token wait for ever on a lease holding none).
    sup.ledger.end(remote, Tally(usage=Usage(output_tokens=332)))
    assert held(parent, "output_tokens") == 0


async def test_a_subtree_of_several_executions_gets_a_share_for_each() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=12_000))
    remote = leased(sup, parent)
    children(sup, parent, "a", "b")
    # Three executions there may ask: 3 parts of 5 (itself 3, a and b one each).
    limits = await sup.ledger.ask(remote, Tally(leaves=3), Want(tokens=1_000))
    assert limits.tokens == 12_000 * 3 // 5
    assert parent.held is not None
    assert parent.held.parts == 2
    # When it ends, it stands for nothing any more (its node here, open till its
    # answer is taken, counts out its own leaf), nor once its node closes.
    sup.ledger.end(remote, Tally(leaves=3))
    assert (parent.leaves + parent.held.parts, held(parent, "tokens")) == (2, 0)
    sup.close(remote, "completed")
    assert (parent.leaves, parent.held.parts) == (2, 0)


async def test_a_part_of_the_budget_follows_the_subtrees_that_end_not_their_answers() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=8_000))
    remotes = [leased(sup, parent, f"r{i}") for i in range(4)]
    for node in remotes:  # four parts of 8,000: 2,000 each
        limits = await sup.ledger.ask(node, Tally(), Want(tokens=500))
        assert limits.tokens == 2_000
    told: list[dict[str, float]] = []
    last = remotes[-1]
    assert last.lease is not None
    last.lease.tell = told.append
    # Three end on their hosts; their nodes here close only once their answers
    # are taken, later: the budget is one part now, not four, for asks and hints.
    for node in remotes[:3]:
        sup.ledger.end(node, used(500))
    limits = await sup.ledger.ask(last, Tally(), Want(tokens=1_000))
    # (Asking, it gave back what it held.) Its share of the 6,500 settled usage
    # leaves, at most GROWTH whole requests: not a quarter of it (1,625).
    assert limits.tokens == GROWTH * 1_000
    for node in remotes[:3]:
        sup.close(node, "completed")
    assert (parent.leaves, parent.held is not None and parent.held.parts) == (1, 0)
    # A part is worth 6,500 still: what it was last granted at, nothing to tell.
    assert told == []


async def test_an_ask_tops_up_the_fields_it_does_not_ask_for_and_never_takes_from_them() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000, tool_calls=8))
    remote = leased(sup, parent)
    children(sup, parent, "a", "b", "c")  # 4 parts
    limits = await sup.ledger.ask(remote, Tally(), Want(tokens=1_000))
    # One round trip serves every field: tool calls, not asked for, get a share too.
    assert (limits.tokens, limits.tool_calls) == (2_500, 2)
    limits = await sup.ledger.ask(remote, used(2_000, tool_calls=2), Want(tool_calls=1))
    # Tool calls, all used, get a quarter of the 6 free (1.5: one, what it needs);
    # tokens, not asked for, are topped up to a quarter of the 8,000 free.
    assert (limits.tokens, limits.tool_calls) == (4_000, 3)
    assert (held(parent, "tokens"), held(parent, "tool_calls")) == (2_000, 1)
    limits = await sup.ledger.ask(remote, used(4_000, tool_calls=2), Want(tokens=3_000))
    # A share of tool calls is no more than it holds: it keeps what it holds.
    assert (limits.tokens, limits.tool_calls) == (4_000 + 3_000, 3)
    assert (held(parent, "tokens"), held(parent, "tool_calls")) == (3_000, 1)


async def test_every_execution_that_may_ask_counts_in_the_share_holding_or_not() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000))
    first, second = leased(sup, parent, "first"), leased(sup, parent, "second")
    local, _ = children(sup, parent, "local", "idle")
    assert (await sup.ledger.ask(first, Tally(), Want(tokens=1_000))).tokens == 2_500
    assert parent.held is not None
    assert (parent.held.leases, parent.held.holding) == (2, 1)
    reservation = sup.reserve_nowait(local, input_estimate=100, max_tokens=1_000)
    assert (reservation.input, reservation.output) == (100, 1_000)
    # A quarter of what settled usage leaves (10,000 in 4 parts, those holding
    # count: they will ask again, so what is free is never all handed to one, nor
    # does the first's part shrink the second's).
    assert (await sup.ledger.ask(second, Tally(), Want(tokens=1_000))).tokens == 2_500
    assert held(parent, "tokens") == 5_000
    assert (parent.held.leases, parent.held.holding) == (2, 2)


async def test_an_ask_charges_its_tally_and_gives_back_what_it_asks_for_and_does_not_use() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000))
    remote = leased(sup, parent)
    children(sup, parent, "a", "b", "c")
    await sup.ledger.ask(remote, Tally(), Want(tokens=1_000))  # 2,500
    tally = Tally(usage=Usage(input_tokens=200, output_tokens=100), reserved_output=400)
    asking = sup.ledger.ask_nowait(remote, tally, Want(tokens=1_000))
    assert isinstance(asking, Budget)
    # 300 used, 400 in flight stay held; a quarter of the 9,700 settled usage
    # leaves is 2,425, of which it holds 400: 2,025 more.
    assert (parent.input_tokens, parent.output_tokens) == (200, 100)
    assert asking.tokens == 300 + 400 + 2_025
    assert held(parent, "tokens") == 400 + 2_025
    # A small ask gets GROWTH times what the lease used (1,200), less than a share.
    limits = await sup.ledger.ask(remote, tally, Want(tokens=100))
    assert limits.tokens == 300 + 400 + GROWTH * 300
    assert held(parent, "tokens") == 400 + GROWTH * 300


# -- held headroom makes local work wait, never stop ----------------------------------


async def test_a_request_waits_for_what_a_lease_holds_until_the_lease_ends() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=900))
    async with anyio.create_task_group() as tg:
        request = background(tg, lambda: sup.reserve(local, input_estimate=100, max_tokens=200))
        await wait_all_tasks_blocked()
        assert sup.waiting == 1
        assert local.waiting.startswith("waiting for budget: tokens of parent")
        # What the subtree used replaces what it held: still no room.
        sup.ledger.report(remote, used(300, requests=1))
        await wait_all_tasks_blocked()
        assert not request.done
        sup.ledger.end(remote, used(400, requests=1))  # 500 of its 900 come back
        await wait_all_tasks_blocked()
        assert request.done
    assert isinstance(request.value, Reservation)
    assert request.value.max_tokens == 200
    assert (sup.waiting, local.waiting, parent.stop_status) == (0, "", None)


async def test_a_tool_call_held_up_only_by_a_lease_raises_held_up_and_stops_nothing() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tool_calls=4))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    assert (await sup.ledger.ask(remote, Tally(), Want(tool_calls=2))).tool_calls == 2
    sup.charge(local, tool_calls=2)
    with pytest.raises(HeldUp):
        sup.charge(local, tool_calls=1)
    # The door the layers above use: held up is a value there, never the signal.
    assert sup.try_charge(local, tool_calls=1) is False
    assert (local.tool_calls, parent.tool_calls) == (2, 2)  # nothing charged
    assert (parent.stop_status, local.stop_status) == (None, None)
    assert sup.try_charge(local, steps=1) is True


async def test_a_tool_call_with_no_settled_room_left_is_refused_and_stops_the_budget() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tool_calls=4))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tool_calls=2))
    sup.charge(local, tool_calls=2)
    sup.ledger.end(remote, used(tool_calls=2))
    with pytest.raises(BudgetExceeded) as caught:
        sup.charge(local, tool_calls=1)
    assert (caught.value.limit, caught.value.node_id) == ("tool_calls", parent.id)
    assert parent.stop_status == "budget_exceeded"


async def test_charge_waiting_returns_once_the_lease_gives_back_what_it_held() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(steps=3))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(steps=3))
    async with anyio.create_task_group() as tg:
        charge = background(tg, lambda: sup.charge_waiting(local, steps=1))
        await wait_all_tasks_blocked()
        assert (charge.done, sup.waiting) == (False, 1)
        assert "leased to subtrees on other hosts" in local.waiting
        sup.ledger.end(remote, Tally(steps=2))
        await wait_all_tasks_blocked()
        assert charge.done
    assert (local.steps, parent.steps) == (1, 3)
    assert (sup.waiting, local.waiting) == (0, "")


async def test_opening_a_child_held_up_only_by_a_lease_raises_held_up() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(agents=3))
    remote = leased(sup, parent)
    assert (await sup.ledger.ask(remote, Tally(), Want(agents=2))).agents == 2
    with pytest.raises(HeldUp):
        sup.open(parent, name="local", limits=None)
    assert sup.try_open(parent, name="local", limits=None) is None
    assert (parent.agents, len(parent.children)) == (1, 1)


async def test_open_waiting_returns_once_the_lease_ends() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(agents=3))
    remote = leased(sup, parent)
    await sup.ledger.ask(remote, Tally(), Want(agents=2))
    async with anyio.create_task_group() as tg:
        opening = background(tg, lambda: sup.open_waiting(parent, name="local", limits=None))
        await wait_all_tasks_blocked()
        assert (opening.done, sup.waiting) == (False, 1)
        sup.ledger.end(remote, Tally(agents=1))  # it opened one of its two
        await wait_all_tasks_blocked()
        assert opening.done
    assert isinstance(opening.value, Node)
    assert opening.value.parent is parent
    assert parent.agents == 3


async def test_opening_a_child_with_no_settled_room_left_is_refused_and_stops_nothing() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(agents=3))
    remote = leased(sup, parent)
    await sup.ledger.ask(remote, Tally(), Want(agents=2))
    sup.ledger.end(remote, Tally(agents=2))
    with pytest.raises(BudgetExceeded) as caught:
        sup.open(parent, name="local", limits=None)
    assert (caught.value.limit, caught.value.node_id) == ("agents", parent.id)
    assert parent.stop_status is None


# -- asks refused, asks waiting -------------------------------------------------------


async def test_an_ask_that_settled_usage_cannot_fit_is_refused_and_stops_the_budget() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    reservation = sup.reserve_nowait(local, input_estimate=400, max_tokens=400)
    assert reservation.output == 300  # a fair half of the 600 free
    sup.settle(local, reservation, Usage(input_tokens=400, output_tokens=300))
    with pytest.raises(BudgetExceeded) as caught:
        await sup.ledger.ask(remote, Tally(), Want(tokens=500, detail="a model request"))
    error = caught.value
    assert (error.limit, error.allowed, error.node_id) == ("tokens", 1_000, parent.id)
    assert (error.need, error.left, error.need_detail) == (500, 300, "a model request")
    assert parent.stop_status == "budget_exceeded"
    assert remote.stop_status == "budget_exceeded"
    assert parent.stop_error is error


async def test_an_ask_for_a_counter_that_settled_usage_cannot_fit_is_refused() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tool_calls=2))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    sup.charge(local, tool_calls=2)
    with pytest.raises(BudgetExceeded) as caught:
        sup.ledger.ask_nowait(remote, Tally(), Want(tool_calls=1))
    assert (caught.value.limit, caught.value.need, caught.value.left) == ("tool_calls", None, None)
    assert parent.stop_status == "budget_exceeded"


async def test_an_ask_held_up_by_other_leases_waits_and_asks_are_served_in_order() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    first, second, third = (leased(sup, parent, name) for name in ("first", "second", "third"))
    assert (await sup.ledger.ask(first, Tally(), Want(tokens=900))).tokens == 900
    big = sup.ledger.ask_nowait(second, Tally(), Want(tokens=500))
    small = sup.ledger.ask_nowait(third, Tally(), Want(tokens=50))  # would fit: in line
    assert not isinstance(big, Budget)
    assert not isinstance(small, Budget)
    assert (big.answer, small.answer, sup.ledger.waits) == (None, None, 2)
    sup.ledger.end(first, used(300))
    assert isinstance(big.answer, Budget)
    assert isinstance(small.answer, Budget)
    # 700 free: second first gets its 500 (a third of 700 is less), then third its
    # third of 700, of which 200 are left (served first, it would have had 233).
    assert (big.answer.tokens, small.answer.tokens) == (500, 200)
    assert parent.stop_status is None


async def test_a_cancelled_ask_lets_the_asks_behind_it_be_served() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    first, second, third = (leased(sup, parent, name) for name in ("first", "second", "third"))
    await sup.ledger.ask(first, Tally(), Want(tokens=900))
    scope = anyio.CancelScope()

    async def cancelled() -> None:
        with scope:
            await sup.ledger.ask(second, Tally(), Want(tokens=500))

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancelled)
        await wait_all_tasks_blocked()
        small = background(tg, lambda: sup.ledger.ask(third, Tally(), Want(tokens=50)))
        await wait_all_tasks_blocked()
        assert not small.done  # in line behind the big one
        scope.cancel()
        await wait_all_tasks_blocked()
        assert small.done
    assert isinstance(small.value, Budget)
    assert small.value.tokens == 100  # its third of 1,000 is more than the 100 free
    assert held(parent, "tokens") == 1_000


async def test_ending_a_lease_answers_its_waiting_ask_with_no_new_work() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    first, second = leased(sup, parent, "first"), leased(sup, parent, "second")
    await sup.ledger.ask(first, Tally(), Want(tokens=900))
    async with anyio.create_task_group() as tg:
        ask = background(tg, lambda: sup.ledger.ask(second, Tally(), Want(tokens=500)))
        await wait_all_tasks_blocked()
        sup.ledger.end(second, Tally())
        await wait_all_tasks_blocked()
        assert ask.done
    assert ask.error is not None
    assert (ask.error.limit, ask.error.node_id) == ("no new work", second.id)
    assert parent.stop_status is None
    assert held(parent, "tokens") == 900  # first still holds its lease


# -- lost leases ------------------------------------------------------------------------


async def test_a_lost_lease_keeps_what_it_was_granted_and_did_not_report_held_for_good() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=900))
    sup.ledger.report(remote, used(200))
    sup.ledger.end(remote, None, lost=True)
    assert held(parent, "tokens") == 700
    assert parent.held is not None
    assert parent.held.leases == 0
    sup.ledger.end(remote, used(300))  # a late answer changes nothing
    assert held(parent, "tokens") == 700
    assert parent.input_tokens + parent.output_tokens == 200


async def test_a_lease_of_a_dead_host_gives_back_all_but_what_was_in_flight() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000, tool_calls=10))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=900, tool_calls=4))
    # Its last report: 200 used, a request in flight holding 150 (the provider may
    # have billed it: that part stays spent), 1 tool call used.
    tally = Tally(
        usage=Usage(input_tokens=100, output_tokens=100, tool_calls=1), reserved_output=150
    )
    sup.ledger.report(remote, tally)
    sup.ledger.end(remote, None, lost=True, dead=True)
    assert held(parent, "tokens") == 150
    assert held(parent, "tool_calls") == 0
    assert parent.held is not None
    assert parent.held.lost is not None
    assert (parent.held.lost.tokens, parent.held.lost.tool_calls) == (150, 0)
    assert parent.held.leases == 0
    # The rest serves others at once: 1,000 - 200 used - 150 lost.
    sup.close(remote, "failed")
    reservation = sup.reserve_nowait(local, input_estimate=50, max_tokens=600)
    assert reservation.max_tokens == 600
    sup.ledger.end(remote, used(300))  # a late answer changes nothing
    assert held(parent, "tokens") == 150


async def test_a_request_waiting_on_a_lease_is_refused_when_its_host_is_lost() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=900))
    async with anyio.create_task_group() as tg:
        request = background(tg, lambda: sup.reserve(local, input_estimate=100, max_tokens=200))
        await wait_all_tasks_blocked()
        sup.ledger.end(remote, None, lost=True)
        await wait_all_tasks_blocked()
        assert request.done
    assert request.error is not None
    assert (request.error.limit, request.error.node_id) == ("tokens", parent.id)
    assert parent.stop_status == "budget_exceeded"
    assert sup.waiting == 0


async def test_a_request_needing_what_a_lost_lease_holds_says_the_host_was_lost() -> None:
    # Once failed: the refusal says only "no room left" (Supervisor._admit), where a tool
    # call, a spawn or an ask refused for the same reason say the host was lost.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=900))
    sup.ledger.end(remote, None, lost=True)
    with pytest.raises(BudgetExceeded) as caught:
        sup.reserve_nowait(local, input_estimate=100, max_tokens=200)
    assert LOST in caught.value.why


async def test_a_tool_call_needing_what_a_lost_lease_holds_is_refused_naming_the_host() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tool_calls=3))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tool_calls=3))
    sup.ledger.end(remote, None, lost=True)
    with pytest.raises(BudgetExceeded) as caught:
        await sup.charge_waiting(local, tool_calls=1)
    assert LOST in caught.value.why
    assert parent.stop_status == "budget_exceeded"


async def test_charge_waiting_on_a_lease_is_refused_when_its_host_is_lost() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tool_calls=3))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tool_calls=3))
    async with anyio.create_task_group() as tg:
        charge = background(tg, lambda: sup.charge_waiting(local, tool_calls=1))
        await wait_all_tasks_blocked()
        sup.ledger.end(remote, None, lost=True)
        await wait_all_tasks_blocked()
        assert charge.done
    assert charge.error is not None
    assert LOST in charge.error.why
    assert sup.waiting == 0


async def test_opening_a_child_needing_what_a_lost_lease_holds_is_refused_naming_the_host() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(agents=2))
    remote = leased(sup, parent)
    await sup.ledger.ask(remote, Tally(), Want(agents=1))
    sup.ledger.end(remote, None, lost=True)
    with pytest.raises(BudgetExceeded) as caught:
        await sup.open_waiting(parent, name="local", limits=None)
    assert LOST in caught.value.why
    assert parent.stop_status is None  # a refused spawn stops nothing


async def test_an_ask_needing_what_a_lost_lease_holds_is_refused_not_left_waiting() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    lost, other = leased(sup, parent, "lost"), leased(sup, parent, "other")
    await sup.ledger.ask(lost, Tally(), Want(tokens=900))
    sup.ledger.end(lost, None, lost=True)
    with pytest.raises(BudgetExceeded) as caught:
        sup.ledger.ask_nowait(other, Tally(), Want(tokens=500))
    assert LOST in caught.value.why
    assert parent.stop_status == "budget_exceeded"


# -- one lease for a parent's subtrees on one host ---------------------------------------


def pooled(sup: Supervisor, parent: Node, key: str, name: str = "remote") -> Node:
    """A child of ``parent`` placed on host ``key``: it joins the lease ``parent``
    holds for that host, if one is live or idle."""
    node = sup.open(parent, name=name, limits=None)
    sup.ledger.open(node, key=key)
    return node


async def test_the_subtrees_of_one_parent_on_one_host_draw_from_one_lease() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000, tool_calls=20))
    a, b, c = pooled(sup, parent, "h1"), pooled(sup, parent, "h1"), pooled(sup, parent, "h2")
    lease = a.lease
    assert lease is not None
    assert b.lease is lease
    assert c.lease is not None
    assert c.lease is not lease
    assert parent.held is not None
    assert (parent.held.leases, lease.count, lease.weight) == (2, 2, 2)
    # One ask for the pool; what each subtree uses is charged on its own node.
    granted = await sup.ledger.ask(a, Tally(), Want(tokens=300, tool_calls=1))
    assert granted.tokens is not None
    assert granted.tokens >= 300
    sup.ledger.report(b, used(200, tool_calls=1))
    sup.ledger.report(a, used(100))
    assert (b.input_tokens + b.output_tokens, a.input_tokens + a.output_tokens) == (200, 100)
    assert lease.hold["tokens"] == granted.tokens - 300
    assert held(parent, "tokens") == granted.tokens - 300
    assert held(b, "tokens") == 0  # (held on the anchor's chain, not on a subtree)
    # The first subtree ends: the lease lives on for the other.
    sup.ledger.end(a, used(100))
    assert (lease.live, lease.idle) == (True, False)
    assert held(parent, "tokens") == granted.tokens - 300
    # The last ends: all it holds comes back; it waits idle for the parent's next one.
    sup.ledger.end(b, used(200, tool_calls=1))
    assert (lease.live, lease.idle) == (False, True)
    assert held(parent, "tokens") == held(parent, "tool_calls") == 0
    assert parent.held.leases == 1  # (h2's)
    assert sup.ledger.idle == {parent: {lease}}
    assert (parent.input_tokens + parent.output_tokens, parent.tool_calls) == (300, 1)


async def test_an_idle_lease_is_revived_with_what_an_ask_would_grant_and_no_round_trip() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=100_000))
    first = pooled(sup, parent, "h1")
    await sup.ledger.ask(first, Tally(), Want(tokens=400, wanted_output=300))
    sup.ledger.end(first, used(400))
    asks = sup.ledger.asks
    lease = first.lease
    assert lease is not None
    was = (lease.idle, lease.live)
    again = pooled(sup, parent, "h1")
    assert again.lease is lease
    assert was == (True, False)
    assert (lease.idle, lease.live) == (False, True)
    assert sup.ledger.asks == asks  # no round trip
    # What it was granted while live (or 4 x what it used), its share of what is free.
    assert lease.hold["tokens"] >= 400
    assert lease.hold["tokens"] <= GROWTH * max(lease.granted["tokens"], 400)
    assert held(parent, "tokens") == lease.hold["tokens"]
    assert sup.ledger.idle == {parent: set()}


async def test_an_idle_lease_ends_when_its_parent_closes_and_its_host_is_told() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = pooled(sup, parent, "h1")
    lease = remote.lease
    assert lease is not None
    closed: list[str] = []
    lease.close = lambda: closed.append("h1")
    sup.ledger.end(remote, Tally())
    sup.close(remote, "completed")
    assert closed == []  # idle: the parent may place another there
    sup.close(parent, "completed")
    assert closed == ["h1"]
    assert not lease.idle
    assert sup.ledger.idle == {}


async def test_a_subtree_lost_alone_keeps_its_leases_hold_held_when_the_lease_ends() -> None:
    # Its host did not answer a stop: what it uses there is not known any more, so
    # the lease takes nothing back while it lives, and keeps its hold when it ends.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    a, b = pooled(sup, parent, "h1"), pooled(sup, parent, "h1")
    await sup.ledger.ask(a, Tally(), Want(tokens=400))
    hold = held(parent, "tokens")
    sup.ledger.end(a, None, lost=True)
    assert a.lease is not None
    assert a.lease.tainted
    sup.ledger.end(b, used(100))
    assert held(parent, "tokens") == hold - 100  # what b used was charged
    assert parent.held is not None
    assert parent.held.lost is not None
    assert parent.held.lost.tokens == hold - 100  # counted as spent
    assert not a.lease.idle  # a lost lease is never revived


async def test_a_dead_hosts_lease_gives_back_all_but_what_requests_in_flight_held() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    a, b = pooled(sup, parent, "h1"), pooled(sup, parent, "h1")
    await sup.ledger.ask(a, Tally(), Want(tokens=600))
    sup.ledger.report(b, Tally(usage=Usage(input_tokens=50), reserved_output=120))
    sup.ledger.end(a, None, lost=True, dead=True)
    sup.ledger.end(b, None, lost=True, dead=True)
    assert held(parent, "tokens") == 120  # b's request in flight may have been billed
    assert parent.held is not None
    assert parent.held.lost is not None
    assert parent.held.lost.tokens == 120


async def test_a_hosts_lease_asking_for_more_spends_nothing_more_until_the_answer() -> None:
    # On the host: while its ask is out, the tree above takes back what the lease's
    # subtrees do not hold in flight, so the lease's node spends no more than that.
    sup = started()
    node = sup.open(sup.root, name="lease", limits=Budget(tokens=5_000, tool_calls=9, cost=1.0))
    asked: list[Want] = []

    class Lender:
        def __init__(self) -> None:
            self.fresh: dict[str, float] = {}
            self.hint: dict[str, float] = {}
            self.asking = False

        def want(self, node: Node, want: Want) -> None:
            asked.append(want)

    node.lender = Lender()
    sup.charge(node, tool_calls=2)
    sup.ledger.freeze(node)
    assert node.limits == Budget(tokens=0, tool_calls=2, cost=0.0)
    # A tool call there waits for the answer (it asks, and is not charged).
    assert not sup.try_charge(node, tool_calls=1)
    assert asked == [Want(tool_calls=1)]
    assert (node.tool_calls, node.stop_status) == (2, None)


async def test_what_a_request_gives_back_while_its_lease_asks_stays_unspent_till_answered() -> None:
    # On the host: a request in flight when its lease asked settles for less than it
    # held. The tree above counts what the lease's subtrees use and hold from their
    # later reports, so that room must stay unspent until the answer (it was
    # spent before, and a remote budget overshot: 17.6 of a 17.1 cost limit).
    sup = started()
    node = sup.open(sup.root, name="lease", limits=Budget(tokens=5_000))

    class Lender:
        def __init__(self) -> None:
            self.fresh: dict[str, float] = {}
            self.hint: dict[str, float] = {}
            self.asking = False

        def want(self, node: Node, want: Want) -> None:
            self.asking = True
            sup.ledger.freeze(node)

    lender = node.lender = Lender()
    first = sup.reserve_nowait(node, input_estimate=1_000, max_tokens=4_000)
    assert first.max_tokens == 4_000
    lender.want(node, Want(tool_calls=1))  # another operation there asks
    assert node.limits is not None
    assert node.limits.tokens == 5_000
    sup.settle(node, first, Usage(input_tokens=1_000, output_tokens=500))
    # 3,500 came back under the frozen limits: still nothing until the answer.
    with pytest.raises(anyio.WouldBlock):
        sup.reserve_nowait(node, input_estimate=100, max_tokens=200)
    lender.asking = False
    sup.ledger.extend(node, Budget(tokens=1_500 + 300))
    again = sup.reserve_nowait(node, input_estimate=100, max_tokens=200)
    assert (again.input, again.max_tokens) == (100, 200)


async def test_an_ask_short_of_its_share_takes_back_what_other_leases_hold_past_theirs() -> None:
    # Two leases took half of 10,000 each; a third subtree starts: a part is now worth
    # a third. Its ask finds nothing free, so the others are asked to keep no more
    # than their third (``Reclaim`` to their hosts); it waits for their answers and
    # gets its third, as it would at home, instead of a sliver of what is free.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000))
    first, second = leased(sup, parent, "first"), leased(sup, parent, "second")
    want = Want(tokens=1_016, input_tokens=1_000, output_tokens=16, wanted_output=4_000)
    assert (await sup.ledger.ask(first, Tally(), want)).tokens == 5_000
    assert (await sup.ledger.ask(second, Tally(), want)).tokens == 5_000
    asked: dict[str, dict[str, float]] = {}

    def reclaim(name: str) -> Callable[[dict[str, float]], None]:
        return lambda free: asked.__setitem__(name, free)

    for node in (first, second):
        lease = node.lease
        assert lease is not None
        lease.reclaim = reclaim(node.name)
    third = leased(sup, parent, "third")
    got = sup.ledger.ask_nowait(third, Tally(), want)
    assert not isinstance(got, Budget)  # it waits for the others' answers
    assert asked == {
        "first": {"tokens": pytest.approx(10_000 / 3)},
        "second": {"tokens": pytest.approx(10_000 / 3)},
    }
    assert sup.ledger.reclaims == 2
    for node in (first, second):
        assert node.lease is not None
        sup.ledger.kept(node.lease, {"tokens": 3_333})
    answer = got.answer
    assert isinstance(answer, Budget)
    assert answer.tokens == 3_333
    assert held(parent, "tokens") == 9_999
    # Asked once for each grant they had: the next ask short of its share waits for
    # them to ask or end, and asks them nothing more.
    assert not isinstance(sup.ledger.ask_nowait(third, used(3_333), want), Budget)
    assert sup.ledger.reclaims == 2


async def test_a_reclaim_that_finds_its_host_asking_is_answered_with_nothing_given_back() -> None:
    # The first lease's host was asking as the reclaim came (a grant may be on its
    # way there): it keeps its limits and says so, and the ask waiting for it is
    # served with what the second gave back, never left waiting for an answer.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=10_000))
    first, second = leased(sup, parent, "first"), leased(sup, parent, "second")
    want = Want(tokens=1_016, input_tokens=1_000, output_tokens=16, wanted_output=4_000)
    for node in (first, second):
        await sup.ledger.ask(node, Tally(), want)
        assert node.lease is not None
        node.lease.reclaim = lambda free: None
    third = leased(sup, parent, "third")
    got = sup.ledger.ask_nowait(third, Tally(), want)
    assert not isinstance(got, Budget)
    assert first.lease is not None
    assert second.lease is not None
    sup.ledger.kept(first.lease, {})
    assert first.lease.reclaiming == {"tokens": False}
    assert first.lease.granted["tokens"] == 5_000
    answers = [got.answer]  # (None: the second has not answered yet)
    sup.ledger.kept(second.lease, {"tokens": 3_333})
    answers.append(got.answer)
    assert answers[0] is None
    assert isinstance(answers[1], Budget)
    assert answers[1].tokens == 10_000 - 5_000 - 3_333


# -- reports ----------------------------------------------------------------------------


async def test_a_report_charges_the_subtree_usage_on_the_whole_chain() -> None:
    sup = started(Budget(tokens=5_000))
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=2_000, tool_calls=9))
    remote = leased(sup, parent)
    children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=1_000, tool_calls=5))
    usage = Usage(input_tokens=300, output_tokens=100, requests=2, tool_calls=3, cost=0.5)
    own = Usage(input_tokens=100, output_tokens=50, requests=1, tool_calls=1, cost=0.25)
    sup.ledger.report(remote, Tally(usage=usage, own=own, steps=4, own_steps=1, agents=2))
    for node in (remote, parent, sup.root):
        assert node.usage() == usage
        assert node.steps == 4
    assert (remote.agents, parent.agents, sup.root.agents) == (2, 4, 5)
    assert sup.snapshot().node(remote.id).own_usage == own
    assert remote.own_steps == 1
    # The holds shrink by what was used: used and held add up to what was granted.
    assert (held(parent, "tokens"), held(sup.root, "tokens")) == (600, 600)
    assert held(parent, "tool_calls") == 2


async def test_a_report_charges_only_what_changed_since_the_last_one() -> None:
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=2_000))
    remote = leased(sup, parent)
    children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=1_000))
    sup.ledger.report(remote, used(400))
    sup.ledger.report(remote, used(400))
    sup.ledger.report(remote, used(500))
    assert (parent.input_tokens + parent.output_tokens, held(parent, "tokens")) == (500, 500)


async def test_an_over_report_stops_the_budget_it_went_past() -> None:
    # The remote estimate fell short: its subtree used more than its lease.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=1_000))
    sup.ledger.report(remote, used(1_200))
    assert parent.stop_status == "budget_exceeded"
    assert local.stop_status == "budget_exceeded"
    error = parent.stop_error
    assert error is not None
    assert (error.limit, error.allowed, error.node_id) == ("tokens", 1_000, parent.id)
    assert "1,200 used: a request used more than its estimate" in str(error)
    assert held(parent, "tokens") == 0  # it used all it held, and more


async def test_ending_a_lease_gives_back_everything_it_did_not_use() -> None:
    sup = started(Budget(tokens=5_000))
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=2_000))
    remote = leased(sup, parent)
    await sup.ledger.ask(remote, Tally(), Want(tokens=1_000))
    sup.ledger.end(remote, used(300))
    for node in (parent, sup.root):
        assert (held(node, "tokens"), node.input_tokens + node.output_tokens) == (0, 300)
        assert node.held is not None
        assert node.held.leases == 0


# -- found by these tests: each asserts what should happen (and once failed) ----------


async def test_an_ask_held_up_by_a_local_request_is_granted_when_the_request_settles() -> None:
    # Once failed: settle (and release) serve the requests waiting on the chain, never the
    # ledger's asks; the ask waits until some lease reports or ends, maybe forever.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    reservation = sup.reserve_nowait(local, input_estimate=100, max_tokens=800)
    assert reservation.output == 450  # a fair half of the 900 free
    async with anyio.create_task_group() as tg:
        ask = background(tg, lambda: sup.ledger.ask(remote, Tally(), Want(tokens=500)))
        await wait_all_tasks_blocked()
        assert not ask.done  # 450 free: it waits for the request in flight
        sup.settle(local, reservation, Usage(input_tokens=100, output_tokens=100))
        await wait_all_tasks_blocked()
        done = ask.done
        tg.cancel_scope.cancel()
    assert done, "the ask still waits with 800 tokens free"


async def test_an_ask_never_waits_behind_an_ask_for_another_budget() -> None:
    # Once failed: the ledger keeps one line for the whole tree, so an ask for a budget with
    # all its headroom free waits behind an ask held up under another budget.
    sup = started()
    busy = sup.open(sup.root, name="busy", limits=Budget(tokens=1_000))
    idle = sup.open(sup.root, name="idle", limits=Budget(tokens=1_000))
    holder, waiting = leased(sup, busy, "holder"), leased(sup, busy, "waiting")
    other = leased(sup, idle, "other")
    await sup.ledger.ask(holder, Tally(), Want(tokens=900))
    async with anyio.create_task_group() as tg:
        background(tg, lambda: sup.ledger.ask(waiting, Tally(), Want(tokens=500)))
        await wait_all_tasks_blocked()
        ask = background(tg, lambda: sup.ledger.ask(other, Tally(), Want(tokens=100)))
        await wait_all_tasks_blocked()
        done = ask.done
        tg.cancel_scope.cancel()
    assert done, "an ask for an idle budget waits behind another budget's ask"


async def test_a_request_waiting_on_a_lease_is_admitted_when_an_ask_gives_headroom_back() -> None:
    # Once failed: an ask gives back what its subtree does not hold in flight, but nothing
    # serves the requests (or wakes the charges) waiting for it; they wait until the
    # next report or end of some lease.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    await sup.ledger.ask(remote, Tally(), Want(tokens=900))
    async with anyio.create_task_group() as tg:
        request = background(tg, lambda: sup.reserve(local, input_estimate=100, max_tokens=200))
        await wait_all_tasks_blocked()
        assert not request.done
        # It used none of its 900 tokens: it gives them back, asking for a few more.
        assert isinstance(sup.ledger.ask_nowait(remote, Tally(), Want(tokens=10)), Budget)
        await wait_all_tasks_blocked()
        done = request.done
        tg.cancel_scope.cancel()
    assert done, "the request still waits though the lease gave its 900 tokens back"


async def test_an_ask_for_tool_calls_is_not_refused_by_float_noise_in_a_spent_cost() -> None:
    # Once failed: the ask's wait check on free headroom has no slack for sums of floats
    # (its refusal check does): cost used 0.1 + 0.2 of 0.3 leaves -5.6e-17 free, less
    # than the 0 it needs, and the tool-call ask is refused, the budget stopped, "held
    # by a host that was lost", though no host was lost.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(cost=0.3, tool_calls=4))
    remote, spender = leased(sup, parent, "remote"), leased(sup, parent, "spender")
    await sup.ledger.ask(spender, Tally(), Want(cost=0.3))
    sup.ledger.report(spender, Tally(usage=Usage(cost=0.1)))
    sup.ledger.end(spender, Tally(usage=Usage(cost=0.1 + 0.2)))
    assert 0.3 < parent.cost < 0.3 * (1 + 1e-9)  # within the limit's slack: not over
    assert parent.stop_status is None
    limits = sup.ledger.ask_nowait(remote, Tally(), Want(tool_calls=1))
    assert isinstance(limits, Budget)
    assert limits.tool_calls is not None
    assert limits.tool_calls >= 1


async def test_a_request_is_not_refused_for_what_an_asking_lease_holds_in_flight() -> None:
    # Once failed: a lease whose ask waits (here for the runtime's tool calls, held by a
    # lease in another subtree) no longer counts in ``Held.leases``, though what its
    # request in flight holds will come back; a local request needing it is refused
    # "no room left" and its budget stopped, though nothing was lost.
    sup = started(Budget(tool_calls=2))
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    remote = leased(sup, parent)
    (local,) = children(sup, parent, "local")
    elsewhere = leased(sup, sup.open(sup.root, name="other", limits=None), "elsewhere")
    await sup.ledger.ask(elsewhere, Tally(), Want(tool_calls=2))
    await sup.ledger.ask(remote, Tally(), Want(tokens=900))
    # Its request of 900 is in flight there when a tool call needs one more.
    in_flight = Tally(usage=Usage(requests=1), reserved_output=900)
    asking = sup.ledger.ask_nowait(remote, in_flight, Want(tool_calls=1))
    assert not isinstance(asking, Budget)  # waits for the runtime's tool calls
    with contextlib.suppress(anyio.WouldBlock):  # right: wait for what comes back
        sup.reserve_nowait(local, input_estimate=50, max_tokens=100)
    assert parent.stop_status is None


async def test_an_ask_queued_behind_another_is_answered_when_its_lease_ends() -> None:
    # Once failed: an ask queued behind others is not its lease's ``asking`` (only one tried
    # and told to wait is), so ``end`` leaves it unanswered; once the line moves it is
    # granted, and the lease of a subtree that ended holds headroom (and counts as
    # live, so requests needing it wait, never refused) for good.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000))
    first, second, third = (leased(sup, parent, name) for name in ("first", "second", "third"))
    await sup.ledger.ask(first, Tally(), Want(tokens=900))
    waiting = sup.ledger.ask_nowait(second, Tally(), Want(tokens=500))
    queued = sup.ledger.ask_nowait(third, Tally(), Want(tokens=50))
    assert not isinstance(waiting, Budget)
    assert not isinstance(queued, Budget)
    sup.ledger.end(third, Tally())
    sup.ledger.end(first, Tally())
    sup.ledger.end(second, Tally())
    assert (held(parent, "tokens"), parent.held.leases if parent.held else 0) == (0, 0)
    assert isinstance(queued.answer, BudgetExceeded)


async def test_an_ask_is_not_refused_for_what_a_lease_waiting_on_its_own_ask_holds() -> None:
    # Once failed: while its ask waits, a lease is not counted in ``Held.leases``, and what
    # it still holds (its request in flight, then what that request did not use: not
    # given back before its next ask) is taken for what a lost host holds. The ask in
    # front is refused "leased to a host that was lost" and the budget stopped, with
    # 675 tokens settled-free and no host lost. (Found by the property test below.)
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000, tool_calls=10))
    first, second = leased(sup, parent, "first"), leased(sup, parent, "second")
    assert (await sup.ledger.ask(second, Tally(), Want(tokens=660))).tokens == 660
    in_flight = Tally(usage=Usage(requests=1), reserved_output=650)
    sup.ledger.report(second, in_flight)
    waiting = sup.ledger.ask_nowait(first, Tally(), Want(tokens=360))
    assert not isinstance(waiting, Budget)  # 340 free
    # A tool call there needs one more while its request is in flight: in line.
    sup.ledger.ask_nowait(second, in_flight, Want(tool_calls=1))
    # Its request ends, using half of what it held.
    sup.ledger.report(second, Tally(usage=Usage(output_tokens=325, requests=1)))
    assert not isinstance(waiting.answer, BudgetExceeded), str(waiting.answer)
    assert parent.stop_status is None


# -- found under earlier rules: each asserts what should happen ----------------------------


async def test_two_asks_each_waiting_for_what_the_other_holds_are_not_both_left_waiting() -> None:
    # Once failed: an ask gave back only the fields it asked for, so each lease held,
    # unused, what the other asked for, and both waited forever. Now an ask that must
    # wait gives back everything it does not hold in flight: the other is served.
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000, tool_calls=4))
    first, second = leased(sup, parent, "first"), leased(sup, parent, "second")
    assert (await sup.ledger.ask(second, Tally(), Want(tool_calls=3))).tool_calls == 3
    assert (await sup.ledger.ask(first, Tally(), Want(tokens=600))).tokens == 600
    calls = sup.ledger.ask_nowait(first, Tally(), Want(tool_calls=2))  # 1 free: it waits
    assert not isinstance(calls, Budget)
    assert first.lease is not None
    assert first.lease.hold["tokens"] == 0  # given back
    assert calls.answer is None
    tokens = sup.ledger.ask_nowait(second, Tally(), Want(tokens=500))
    assert isinstance(tokens, Budget)
    assert tokens.tokens == 500
    # An ask gives back everything its lease does not hold in flight (its host spends
    # nothing more until the answer): the tool calls the first waits for among them.
    answer: object = calls.answer  # (mypy keeps it None from the line above)
    assert isinstance(answer, Budget)
    assert answer.tool_calls is not None
    assert answer.tool_calls >= 2


async def test_an_ask_for_free_headroom_never_waits_behind_an_ask_for_what_it_holds() -> None:
    # Once failed: asks were served in order per budget node, whatever the field: second's
    # ask for tool calls, all free, waits behind first's ask for tokens on the same
    # budget, and that one waits for the tokens second holds (not asked for, so not
    # given back). Neither is ever answered. (Found by the property test's operations;
    # the line-up of test_an_ask_is_not_refused_for_what_a_lease_waiting_on_its_own_ask_holds.)
    sup = started()
    parent = sup.open(sup.root, name="parent", limits=Budget(tokens=1_000, tool_calls=10))
    first, second = leased(sup, parent, "first"), leased(sup, parent, "second")
    assert (await sup.ledger.ask(second, Tally(), Want(tokens=660))).tokens == 660
    waiting = sup.ledger.ask_nowait(first, Tally(), Want(tokens=360))
    assert not isinstance(waiting, Budget)  # 340 free
    calls = sup.ledger.ask_nowait(second, Tally(), Want(tool_calls=1))  # 10 free
    assert isinstance(calls, Budget), "an ask for free tool calls waits behind tokens"


# -- the invariants, under random operations ---------------------------------------------


class Pending(Protocol):
    """An ask waiting in the ledger's line (what ``ask_nowait`` hands back)."""

    answer: Budget | BudgetExceeded | None


@dataclass
class Remote:
    """A remote subtree as its host runs it: never past its lease."""

    node: Node
    limits: Budget
    input_tokens: int = 0
    output_tokens: int = 0
    in_flight: int = 0  # the output tokens its request in flight holds there
    requests: int = 0
    tool_calls: int = 0
    steps: int = 0
    agents: int = 0
    want: Want = field(default_factory=Want)
    asking: Pending | None = None
    ended: bool = False
    lost: bool = False
    granted: bool = False  # some ask of it was granted

    def tally(self) -> Tally:
        usage = Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            requests=self.requests,
            tool_calls=self.tool_calls,
        )
        return Tally(
            usage=usage,
            own=usage,
            steps=self.steps,
            own_steps=self.steps,
            agents=self.agents,
            reserved_output=self.in_flight,
        )

    def room(self, name: str) -> int:
        """What its lease has left of ``name`` (a large number for no limit)."""
        limit: int | None = getattr(self.limits, name)
        if limit is None:
            return 10**6
        if name == "tokens":
            return limit - self.input_tokens - self.output_tokens - self.in_flight
        spent: int = getattr(self, name)
        return limit - spent

    def settle(self) -> None:
        """Its request in flight there ends, using half of what it held."""
        self.output_tokens += self.in_flight // 2
        self.in_flight = 0

    def use(self, tokens: int, tool_calls: int, extra: int) -> None:
        """Work within its lease: a request (still in flight when ``extra`` is odd),
        tool calls, ``extra % 3`` steps, and a subagent when ``extra >= 3``."""
        tokens = min(tokens, self.room("tokens"))
        if tokens and self.room("requests") >= 1:
            self.requests += 1
            if extra % 2:
                self.in_flight += tokens
            else:
                self.input_tokens += tokens // 2
                self.output_tokens += tokens - tokens // 2
        self.tool_calls += min(tool_calls, self.room("tool_calls"))
        self.steps += min(extra % 3, self.room("steps"))
        if extra >= 3 and self.room("agents") >= 1:
            self.agents += 1


@dataclass
class World:
    sup: Supervisor
    limited: list[Node]
    locals: list[Node]
    remotes: list[Remote]
    reservations: list[tuple[Node, Reservation]] = field(default_factory=list)
    spawned: int = 0

    def nodes(self) -> list[Node]:
        return [*self.limited, *self.locals, *(remote.node for remote in self.remotes)]


def build() -> World:
    """The runtime's budget over two subtrees: ``parent``, with a budget of its own,
    two remote children and two local ones; ``other``, with none, one of each."""
    sup = Supervisor(Budget(tokens=1_500, tool_calls=6), min_output_tokens=16)
    sup.start()
    parent = sup.open(
        sup.root,
        name="parent",
        limits=Budget(tokens=1_000, requests=6, tool_calls=5, steps=6, agents=7),
    )
    other = sup.open(sup.root, name="other", limits=None)
    remotes = []
    for name, under in (("r0", parent), ("r1", parent), ("r2", other)):
        node = sup.open(under, name=name, limits=None)
        limits = sup.ledger.open(node).limits()
        # A lease opens with a step when it can: granted, as an ask's grant is.
        remotes.append(Remote(node, limits, granted=bool(limits.steps)))
    local_nodes = [
        sup.open(under, name=name, limits=None)
        for name, under in (("l0", parent), ("l1", parent), ("l2", other))
    ]
    return World(sup, [sup.root, parent], local_nodes, remotes)


def below(node: Node, top: Node) -> bool:
    return any(current is top for current in node.chain())


def held_on(remote: Node, node: Node) -> bool:
    """Whether the lease of ``remote`` holds on ``node``: on its parent's chain."""
    return remote.parent is not None and below(remote.parent, node)


def spent(node: Node, name: str) -> float:
    """Settled usage (requests in flight count: they will happen)."""
    if name == "tokens":
        return node.input_tokens + node.output_tokens
    value: float = getattr(node, name)
    return value


def reserved(node: Node, name: str) -> float:
    return node.reserved_input + node.reserved_output if name == "tokens" else 0


def leases(world: World, node: Node, *, lost: bool = False) -> list[Lease]:
    """The leases below ``node`` (only those of lost hosts: ``lost``)."""
    found = []
    for remote in world.remotes:
        lease = remote.node.lease
        assert lease is not None
        if held_on(remote.node, node) and (remote.lost or not lost):
            found.append(lease)
    return found


def holds(world: World, node: Node, name: str, *, lost: bool = False) -> float:
    """What the leases below ``node`` hold of ``name`` (only lost ones: ``lost``)."""
    return sum((lease.hold.get(name, 0) for lease in leases(world, node, lost=lost)), 0.0)


def check_ledger(world: World) -> None:
    """Zero overshoot, holds never negative, and every node's holds adding up."""
    for node in world.nodes():
        budget = node.limits
        for name in LEASED:
            limit = getattr(budget, name) if budget is not None else None
            if limit is not None:
                total = spent(node, name) + reserved(node, name) + held(node, name)
                assert total <= limit, (node, name, total, limit)
            assert held(node, name) >= 0, (node, name)
            assert held(node, name) == holds(world, node, name), (node, name)
        # A lease may give back from its opening until it ends or is lost; it holds a
        # grant once it has one, while it asks for nothing more.
        below_node = [remote for remote in world.remotes if held_on(remote.node, node)]
        live = [remote for remote in below_node if not remote.ended]
        holding = [remote for remote in live if remote.granted and remote.asking is None]
        assert (node.held.leases if node.held is not None else 0) == len(live), node
        assert (node.held.holding if node.held is not None else 0) == len(holding), node
    for lease in leases(world, world.sup.root):
        assert min(lease.hold.values(), default=0) >= 0, lease.hold


def check_honest(
    world: World, error: BudgetExceeded, need: Mapping[str, float], *, stops: bool = True
) -> None:
    """A refusal only when settled usage, and what lost hosts hold for good, leave
    less than what was needed. (A refusal on a node stopped before only says so.)"""
    owner = world.sup.nodes.get(error.node_id, world.sup.root)
    assert owner.id == error.node_id, error
    if stops and owner.stop_error is not error:
        return
    name = error.limit
    lost = holds(world, owner, name, lost=True)
    if "lost" in error.why or error.why == "no room left":
        assert lost > 0, f"{error}: no host was lost"
    needed = error.need if error.need is not None else need.get(name, 0)
    assert spent(owner, name) + lost + needed > error.allowed, (str(error), need)
    if error.left is not None:
        assert error.left == error.allowed - spent(owner, name), error


def want_of(want: Want) -> dict[str, float]:
    return {name: getattr(want, name) for name in LEASED}


def end(world: World, remote: Remote) -> None:
    remote.settle()
    world.sup.ledger.end(remote.node, remote.tally())
    remote.ended = True
    remote.asking = None


def answered(world: World) -> None:
    """Hand each answered ask's answer to its host, as its stand-in would (checking
    every refusal before a refused subtree ends and reports)."""
    while True:
        refused = []
        for remote in world.remotes:
            ask = remote.asking
            if remote.ended or ask is None or ask.answer is None:
                continue
            remote.asking = None
            if isinstance(ask.answer, Budget):
                remote.limits, remote.granted = ask.answer, True
            else:
                check_honest(world, ask.answer, want_of(remote.want))
                refused.append(remote)
        if not refused:
            return
        for remote in refused:
            end(world, remote)  # its subtree stops and answers


def on_host(world: World, kind: str, remote: Remote, amount: int, calls: int, extra: int) -> None:
    ledger = world.sup.ledger
    node = remote.node
    if kind == "use":
        remote.settle()
        if remote.asking is None:  # waiting for an answer, it only settles
            remote.use(amount * 50, calls, extra)
        ledger.report(node, remote.tally())
    elif kind == "ask" and remote.asking is None:
        # A host asks for tokens only with nothing of its own in flight, and for the
        # request with them (an ask is granted only the fields it asks for).
        tokens = 0 if remote.in_flight else amount * 60
        remote.want = Want(
            tokens=tokens,
            requests=1 if tokens else 0,
            tool_calls=calls,
            steps=extra % 3,
            agents=extra // 3,
        )
        try:
            got = ledger.ask_nowait(node, remote.tally(), remote.want)
        except BudgetExceeded as exc:
            check_honest(world, exc, want_of(remote.want))
            end(world, remote)
        else:
            if isinstance(got, Budget):
                remote.limits, remote.granted = got, True
            else:
                remote.asking = got
    elif kind == "end":
        end(world, remote)
    elif kind == "lose":
        ledger.end(node, None, lost=True)
        remote.ended = remote.lost = True


def here(world: World, kind: str, node: Node, amount: int, calls: int, extra: int) -> None:
    sup = world.sup
    stops = [current.stop_status for current in world.nodes()]
    if kind == "reserve":
        max_tokens = (calls + 1) * 100
        try:
            reservation = sup.reserve_nowait(
                node, input_estimate=amount * 15, max_tokens=max_tokens
            )
        except anyio.WouldBlock:
            assert [current.stop_status for current in world.nodes()] == stops
        except BudgetExceeded as exc:
            need = {"tokens": amount * 15 + min(16, max_tokens), "requests": 1}
            check_honest(world, exc, need)
        else:
            world.reservations.append((node, reservation))
    elif kind == "settle" and world.reservations:
        node, reservation = world.reservations.pop(amount % len(world.reservations))
        output = reservation.output * extra // 5
        sup.settle(node, reservation, Usage(input_tokens=reservation.input, output_tokens=output))
    elif kind == "charge":
        try:
            sup.charge(node, steps=extra % 3, tool_calls=calls)
        except HeldUp:
            assert [current.stop_status for current in world.nodes()] == stops
        except BudgetExceeded as exc:
            check_honest(world, exc, {"steps": extra % 3, "tool_calls": calls})
    elif kind == "spawn":
        world.spawned += 1
        try:
            sup.open(node, name=f"s{world.spawned}", limits=None)
        except HeldUp:
            pass
        except BudgetExceeded as exc:
            check_honest(world, exc, {"agents": 1}, stops=False)
        assert [current.stop_status for current in world.nodes()] == stops  # never stops


#: (what, whose, an amount, tool calls, and a small number more: steps, agents...)
Op = tuple[str, int, int, int, int]
operations = st.lists(
    st.tuples(
        st.sampled_from(
            [
                *("use", "use", "ask", "ask", "ask", "end", "lose"),
                *("reserve", "reserve", "settle", "settle", "charge", "spawn"),
            ]
        ),
        st.integers(0, 5),
        st.integers(0, 15),
        st.integers(0, 3),
        st.integers(0, 5),
    ),
    min_size=5,
    max_size=40,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
# Found by this test (each once failed; see the two tests above it):
# an ended lease's queued ask granted later, its hold never back;
@example(ops=[("ask", 0, 0, 0, 0), ("ask", 1, 14, 0, 0), ("ask", 0, 0, 0, 0)])
# a refusal "leased to a host that was lost" with no host lost.
@example(
    ops=[
        ("ask", 1, 11, 0, 0),
        ("use", 1, 13, 0, 1),
        ("ask", 0, 6, 0, 0),
        ("ask", 1, 0, 0, 0),
        ("use", 1, 0, 0, 0),
    ]
)
async def test_leases_never_overshoot_never_refuse_early_and_give_everything_back(
    ops: list[Op],
) -> None:
    world = build()
    check_ledger(world)
    for kind, whose, amount, calls, extra in ops:
        if kind in ("use", "ask", "end", "lose"):
            remote = world.remotes[whose % len(world.remotes)]
            if not remote.ended:
                on_host(world, kind, remote, amount, calls, extra)
        else:
            node = world.locals[whose % len(world.locals)]
            here(world, kind, node, amount, calls, extra)
        answered(world)
        check_ledger(world)
    for node, reservation in world.reservations:
        world.sup.settle(node, reservation, None)
        answered(world)
    for remote in world.remotes:
        if not remote.ended:
            end(world, remote)
            answered(world)
        check_ledger(world)
    lost = any(remote.lost for remote in world.remotes)
    for node in world.limited:
        assert (node.held.leases if node.held is not None else 0) == 0
        for name in LEASED:
            assert held(node, name) == (holds(world, node, name, lost=True) if lost else 0)
