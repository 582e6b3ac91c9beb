"""The retry stage (``actors/_requests/_retry.py``) over a scripted stage below."""

from __future__ import annotations

from typing import Any

import pytest

from fractor.actors._agent._policy import RetryPolicy
from fractor.actors._requests._retry import Retry
from fractor.runtime import Budget

from .conftest import Below, ServerError, answer

pytestmark = pytest.mark.anyio

FAST = RetryPolicy(retries=2, initial_delay=0.001, max_delay=0.002)


async def test_a_failure_is_sent_again_until_it_answers(make_harness: Any) -> None:
    async with make_harness() as h:
        below = Below([ServerError(), ServerError(), answer()])
        call = h.call()
        assert (await Retry(below, FAST).send(call)).text == "ok"
        assert call.attempt == 2
        assert [e.detail.attempt for e in h.events if e.kind == "retry"] == [1, 2]


async def test_past_its_retries_the_error_is_the_answer(make_harness: Any) -> None:
    async with make_harness() as h:
        below = Below([ServerError(), ServerError(), ServerError(), answer()])
        with pytest.raises(ServerError):
            await Retry(below, FAST).send(h.call())
        assert len(below.seen) == 3


async def test_an_error_no_retry_mends_is_not_retried(make_harness: Any) -> None:
    async with make_harness() as h:
        below = Below([ValueError("bad request"), answer()])
        with pytest.raises(ValueError, match="bad request"):
            await Retry(below, FAST).send(h.call())
        assert len(below.seen) == 1


async def test_a_failure_before_sending_is_no_attempt(make_harness: Any) -> None:
    async with make_harness() as h:

        async def refused_above_the_wire(call: Any) -> Any:
            raise ServerError()  # (call.sent stays False)

        with pytest.raises(ServerError):
            await Retry(refused_above_the_wire, FAST).send(call := h.call())
        assert call.attempt == 0


async def test_a_retry_the_deadline_leaves_no_time_for_times_out_now(make_harness: Any) -> None:
    async with make_harness(budget=Budget(seconds=0.5)) as h:
        slow = RetryPolicy(retries=3, initial_delay=2.0, max_delay=2.0, jitter=0.0)
        with pytest.raises(ServerError):
            await Retry(Below([ServerError(), answer()]), slow).send(h.call())
        assert h.node.stop_status == "timed_out"
        assert "its backoff" in h.node.stop_reason


async def test_a_server_asked_wait_is_the_least_delay(make_harness: Any) -> None:
    async with make_harness() as h:
        below = Below([ServerError(retry_after=0.05), answer()])
        await Retry(below, FAST).send(h.call())
        (retry,) = [e.detail for e in h.events if e.kind == "retry"]
        assert retry.delay >= 0.05


async def test_a_fallback_link_gives_up_past_its_patience(make_harness: Any) -> None:
    async with make_harness() as h:
        below = Below([ServerError(retry_after=5), answer()])
        with pytest.raises(ServerError):
            await Retry(below, FAST).send(h.call(patience=1.0))
        assert len(below.seen) == 1
