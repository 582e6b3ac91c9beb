"""The budget stage (``actors/_requests/_budget.py``) over a scripted stage below."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from fractor.actors._execution._recording import EMPTY_USAGE
from fractor.actors._models._inside import IN_CALL
from fractor.actors._requests._budget import Budget, bind_calls
from fractor.actors._requests._rate import MustWait, Rate
from fractor.runtime import Budget as Limits
from fractor.runtime import InvalidUsage, RateLimit, Usage

from .conftest import Below, Refused, ServerError, answer

pytestmark = pytest.mark.anyio


async def test_an_answer_is_reserved_for_and_settled(make_harness: Any) -> None:
    async with make_harness(budget=Limits(tokens=1_000)) as h:
        below = Below([answer(tokens=(30, 7))])
        response = await Budget(below).send(h.call())
        assert response.usage.output_tokens == 7
        assert (h.node.input_tokens, h.node.output_tokens, h.node.in_flight) == (30, 7, 0)
        assert h.recorder.charged.input_tokens == 30


async def test_a_request_with_no_cap_goes_with_the_one_reserved(make_harness: Any) -> None:
    async with make_harness(budget=Limits(output_tokens=2_000), default_max_tokens=300) as h:
        below = Below([answer(tokens=(5, 3))])
        request = h.call().request.__class__(messages=h.call().request.messages)  # no cap
        await Budget(below).send(h.call(request))
        assert below.requests[0].max_tokens == 300


async def test_a_reply_cut_by_the_budget_is_asked_again_with_more_room(make_harness: Any) -> None:
    async with make_harness(budget=Limits(output_tokens=1_000)) as h:
        request = h.call().request.__class__(messages=h.call().request.messages)  # no cap
        below = Below([answer(tokens=(5, 8), finish_reason="length"), answer()])
        h.rt.supervisor.admission.default_max_tokens = 8
        response = await Budget(below).send(h.call(request))
        assert response.text == "ok"
        assert len(below.requests) == 2
        assert below.requests[1].max_tokens is not None
        assert below.requests[1].max_tokens > 8
        assert any(
            "asking again with room for" in e.detail.error for e in h.events if e.kind == "retry"
        )


async def test_sent_once_a_cut_reply_is_taken_as_it_came(make_harness: Any) -> None:
    async with make_harness(budget=Limits(output_tokens=1_000)) as h:
        h.rt.supervisor.admission.default_max_tokens = 8
        request = h.call().request.__class__(messages=h.call().request.messages)
        below = Below([answer(tokens=(5, 8), finish_reason="length")])
        response = await Budget(below, again=False).send(h.call(request))
        assert response.finish_reason == "length"
        assert len(below.requests) == 1


async def test_a_failure_is_charged_what_it_reported(make_harness: Any) -> None:
    async with make_harness(budget=Limits(tokens=1_000)) as h:
        used = Usage(input_tokens=40, output_tokens=2, requests=1)
        with pytest.raises(ServerError):
            await Budget(Below([ServerError(usage=used)])).send(h.call())
        assert (h.node.input_tokens, h.node.output_tokens, h.node.requests) == (40, 2, 1)
        assert h.recorder.charged.input_tokens == 40


async def test_a_failure_that_reported_nothing_is_charged_its_estimate(make_harness: Any) -> None:
    async with make_harness(budget=Limits(tokens=1_000)) as h:
        with pytest.raises(ServerError):
            await Budget(Below([ServerError()])).send(h.call(estimate=25))
        assert h.node.input_tokens == 25


async def test_a_refusal_is_not_charged_unless_refusals_count(make_harness: Any) -> None:
    async with make_harness(budget=Limits(requests=5)) as h:
        with pytest.raises(Refused):
            await Budget(Below([Refused()])).send(h.call())
        assert (h.node.requests, h.node.input_tokens, h.node.in_flight) == (0, 0, 0)


async def test_counted_refusals_are_charged_one_request(make_harness: Any) -> None:
    async with make_harness(budget=Limits(requests=5), count_refused=True) as h:
        with pytest.raises(Refused):
            await Budget(Below([Refused()])).send(h.call())
        assert (h.node.requests, h.node.input_tokens) == (1, 0)


async def test_no_budget_is_held_while_it_waits_in_the_lane(make_harness: Any) -> None:
    async with make_harness(
        budget=Limits(tokens=10_000), rate_limits={"m": RateLimit(concurrent=1)}
    ) as h:
        rates = h.rt.supervisor.rates
        first = h.call()
        held = rates.try_acquire(first.lane, 0, 0)
        assert held is not None
        reserved_while_waiting: list[int] = []

        async def release_later() -> None:
            await anyio.wait_all_tasks_blocked()
            reserved_while_waiting.append(h.node.in_flight)
            rates.settle(held, 0, 0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(release_later)
            response = await Budget(Rate(Below([answer()]).__call__).send).send(h.call())
        assert response.text == "ok"
        assert reserved_while_waiting == [0]
        assert h.node.in_flight == 0


async def test_a_refusal_with_a_wait_is_settled_then_sent_again(make_harness: Any) -> None:
    async with make_harness(budget=Limits(requests=5)) as h:
        below = Below([Refused(retry_after=0.01), answer()])
        response = await Budget(Rate(below).send).send(h.call())
        assert response.text == "ok"
        assert len(below.seen) == 2
        assert (h.node.requests, h.node.in_flight) == (1, 0)


async def test_impossible_usage_is_charged_whole_and_raised(make_harness: Any) -> None:
    async with make_harness(budget=Limits(tokens=1_000)) as h:
        bad = answer(tokens=(5, 500))  # more output than the 64 reserved
        with pytest.raises(InvalidUsage):
            await Budget(Below([bad])).send(h.call())
        assert h.recorder.charged is not EMPTY_USAGE
        assert h.node.output_tokens == 64


async def test_a_cut_request_is_charged_and_released(make_harness: Any) -> None:
    async with make_harness(budget=Limits(tokens=1_000)) as h:

        async def hang(call: Any) -> None:
            await anyio.sleep(math.inf)

        with anyio.move_on_after(0.05):
            await Budget(Below([hang])).send(h.call(estimate=12))
        assert (h.node.input_tokens, h.node.in_flight) == (12, 0)


async def test_a_failure_above_the_wire_releases_and_charges_nothing(make_harness: Any) -> None:
    async with make_harness(budget=Limits(tokens=1_000)) as h:

        async def before_sending(call: Any) -> None:
            raise RuntimeError("not sent")

        async def below(call: Any) -> Any:
            return await before_sending(call)

        with pytest.raises(RuntimeError):
            await Budget(below).send(h.call(estimate=12))
        assert (h.node.input_tokens, h.node.in_flight) == (0, 0)


async def test_the_request_in_flight_is_the_tasks_for_a_model_inside(make_harness: Any) -> None:
    async with make_harness(budget=Limits(requests=2)) as h:
        seen: list[object] = []

        async def inside(call: Any) -> Any:
            slot = IN_CALL.get()
            seen.append(slot.call if slot is not None else None)
            return answer()

        token = bind_calls(h.recorder)
        try:
            call = h.call()
            await Budget(Below([inside])).send(call)
            assert seen == [call]
            slot = IN_CALL.get()
            assert slot is not None
            assert slot.call is None
        finally:
            IN_CALL.reset(token)


async def test_admitted_inner_requests_are_charged_each_after_the_first(make_harness: Any) -> None:
    async with make_harness(budget=Limits(requests=2)) as h:
        from fractor.actors._models._protocol import ScriptedModel, reply

        inner = ScriptedModel([reply("a"), reply("b"), reply("c")], name="inner")

        async def react(call: Any) -> Any:
            await call.admit(inner, call.outgoing)
            await call.admit(inner, call.outgoing)  # the second: one more request
            return await call.admit(inner, call.outgoing)  # refused: past 2

        with pytest.raises(Exception, match="requests"):
            await Budget(Below([react])).send(h.call())
        assert h.node.requests == 2


async def test_must_wait_from_below_is_never_seen_above(make_harness: Any) -> None:
    async with make_harness(rate_limits={"m": RateLimit(concurrent=1)}) as h:
        rate = Rate(Below([answer()]))
        waits = 0

        async def once_full(call: Any) -> Any:
            nonlocal waits
            if waits == 0:
                waits += 1
                raise MustWait(rate)
            return await rate.send(call)

        response = await Budget(once_full).send(h.call())
        assert response.text == "ok"
        assert waits == 1
