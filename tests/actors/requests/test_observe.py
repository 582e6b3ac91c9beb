"""The observation stage (``actors/_requests/_observe.py``) over a scripted stage."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from fractor.actors._messages import ToolCall
from fractor.actors._requests._observe import Observe
from fractor.runtime import Usage

from .conftest import Below, ServerError, answer

pytestmark = pytest.mark.anyio


async def test_an_answer_is_a_start_and_an_end(make_harness: Any) -> None:
    async with make_harness() as h:
        response = answer(tool_calls=(ToolCall(id="c1", name="echo"),), model="m-2026")
        await Observe(Below([response])).send(h.call())
        start, end = (e.detail for e in h.events)
        assert (start.kind, start.attempt, start.model) == ("request_start", 1, "m")
        assert (end.kind, end.response_model, end.tool_calls) == (
            "request_end",
            "m-2026",
            (("c1", "echo"),),
        )
        assert (end.input_tokens, end.output_tokens) == (10, 5)


async def test_a_failure_ends_with_its_usage_and_error(make_harness: Any) -> None:
    async with make_harness() as h:
        used = Usage(input_tokens=3, output_tokens=1, requests=1)
        with pytest.raises(ServerError):
            await Observe(Below([ServerError(usage=used)])).send(h.call())
        end = h.events[-1].detail
        assert (end.finish_reason, end.input_tokens, end.error) == ("error", 3, "ServerError: 500")


async def test_a_cut_request_ends_saying_so(make_harness: Any) -> None:
    async with make_harness() as h:

        async def hang(call: Any) -> None:
            await anyio.sleep(math.inf)

        with anyio.move_on_after(0.02):
            await Observe(Below([hang])).send(h.call())
        assert h.events[-1].detail.error == "cut off before the model answered"


async def test_attempts_are_numbered(make_harness: Any) -> None:
    async with make_harness() as h:
        call = h.call()
        call.attempt = 2
        await Observe(Below([answer()])).send(call)
        assert h.events[0].detail.attempt == 3
