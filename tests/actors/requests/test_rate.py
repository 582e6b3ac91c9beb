"""The rate stage (``actors/_requests/_rate.py``) over a scripted stage below."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from fractor.actors._requests._rate import MustWait, Paused, Rate
from fractor.runtime import RateLimit, Usage

from .conftest import Below, Refused, ServerError, Unreachable, answer

pytestmark = pytest.mark.anyio


async def test_an_answer_goes_through_and_its_slot_is_free_again(make_harness: Any) -> None:
    async with make_harness(rate_limits={"m": RateLimit(concurrent=1)}) as h:
        below = Below([answer()])
        call = h.call()
        assert (await Rate(below).send(call)).text == "ok"
        assert call.lane.in_flight == 0
        assert len(below.seen) == 1


async def test_no_room_in_the_lane_is_a_signal_to_wait_holding_nothing(make_harness: Any) -> None:
    async with make_harness(rate_limits={"m": RateLimit(concurrent=1)}) as h:
        rates = h.rt.supervisor.rates
        first = h.call()
        held = rates.try_acquire(first.lane, 0, 0)
        assert held is not None
        rate = Rate(Below([answer()]))
        with pytest.raises(MustWait) as raised:
            await rate.send(h.call())
        assert raised.value.rate is rate
        assert raised.value.error is None
        assert first.lane.in_flight == 1  # (only the one held)
        rates.settle(held, 0, 0)


async def test_a_place_taken_while_waiting_is_used_not_taken_again(make_harness: Any) -> None:
    async with make_harness(rate_limits={"m": RateLimit(concurrent=1)}) as h:
        call = h.call()
        call.taken = await Rate(Below([])).wait(call)
        assert call.lane.in_flight == 1
        await Rate(Below([answer()])).send(call)
        assert call.taken is None
        assert call.lane.in_flight == 0


async def test_a_refusal_with_a_wait_pauses_the_lane_and_goes_again(make_harness: Any) -> None:
    async with make_harness() as h:
        call = h.call()
        with pytest.raises(MustWait) as raised:
            await Rate(Below([Refused(retry_after=0.5)])).send(call)
        assert isinstance(raised.value.error, Refused)
        lane = call.lane
        assert lane.paused_until >= h.rt.supervisor.rates.now() + 0.4
        assert "retry" in h.kinds()


async def test_a_refusal_past_the_deadline_stops_the_node_timed_out(make_harness: Any) -> None:
    from fractor.runtime import Budget

    async with make_harness(budget=Budget(seconds=0.2)) as h:
        with pytest.raises(Refused):
            await Rate(Below([Refused(retry_after=5)])).send(h.call())
        assert h.node.stop_status == "timed_out"
        assert "Retry-After of 5 s" in h.node.stop_reason


async def test_sent_once_a_refusal_is_the_answer(make_harness: Any) -> None:
    async with make_harness() as h:
        with pytest.raises(Refused):
            await Rate(Below([Refused(retry_after=0.1)]), again=False).send(h.call())
        assert h.node.stop_status is None


async def test_a_fallback_link_does_not_wait_past_its_patience(make_harness: Any) -> None:
    async with make_harness() as h:
        with pytest.raises(Refused):
            await Rate(Below([Refused(retry_after=3)])).send(h.call(patience=1.0))


async def test_a_paused_lane_past_patience_is_paused_at_once(make_harness: Any) -> None:
    async with make_harness() as h:
        call = h.call(patience=0.5)
        h.rt.supervisor.rates.pause(call.lane, 10)
        with anyio.fail_after(2):
            with pytest.raises(Paused, match=r"longer than the 0\.5 s"):
                await Rate(Below([])).wait(call)


async def test_an_unsent_request_gives_its_tokens_back(make_harness: Any) -> None:
    async with make_harness(rate_limits={"m": RateLimit(tokens_per_minute=1_000)}) as h:
        call = h.call(estimate=400)
        lane = call.lane
        with pytest.raises(Unreachable):
            await Rate(Below([Unreachable()])).send(call)
        assert lane.delay(900, 0, h.rt.supervisor.rates.now()) == 0  # all came back


async def test_a_failure_is_settled_with_what_it_reported(make_harness: Any) -> None:
    async with make_harness(rate_limits={"m": RateLimit(tokens_per_minute=1_000)}) as h:
        call = h.call(estimate=10)
        lane = call.lane
        used = Usage(input_tokens=600, output_tokens=100, requests=1)
        with pytest.raises(ServerError):
            await Rate(Below([ServerError(usage=used)])).send(call)
        now = h.rt.supervisor.rates.now()
        assert lane.delay(250, 0, now) == 0  # 700 of 1,000 spent
        assert lane.delay(400, 0, now) > 0


async def test_a_cancelled_request_frees_its_slot(make_harness: Any) -> None:
    async with make_harness(rate_limits={"m": RateLimit(concurrent=1)}) as h:
        call = h.call()

        async def hang(call: Any) -> None:
            await anyio.sleep(math.inf)

        with anyio.move_on_after(0.05):
            await Rate(Below([hang])).send(call)
        assert call.lane.in_flight == 0
