"""A request on its way down (``actors/_requests/_call.py``) and the slot a model
inside it finds it by (``actors/_models/_inside.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from fractor.actors._models._inside import IN_CALL, CallSlot, admitting
from fractor.actors._models._protocol import ScriptedModel, reply
from fractor.actors._requests._call import cut, failed_usage, tokens
from fractor.runtime import Usage

from .conftest import Refused, ServerError, Unreachable

pytestmark = pytest.mark.anyio


async def test_what_a_failure_used(make_harness: Any) -> None:
    async with make_harness() as h:
        call = h.call()
        used = Usage(input_tokens=9, output_tokens=1, requests=1)
        assert failed_usage(call, Refused()) is None
        assert failed_usage(call, Unreachable()) is None
        assert failed_usage(call, ServerError(usage=used)) == used
        assert failed_usage(call, ServerError()) is None  # (its input estimate)
        call.used = used  # a model inside it answered before it failed
        assert failed_usage(call, Refused()) == used
        assert tokens(None, call) == (call.estimate, 0)
        assert tokens(used, call) == (9, 1)


async def test_a_cut_stream_is_its_input_and_what_it_streamed(make_harness: Any) -> None:
    async with make_harness() as h:
        call = h.call(estimate=50)
        assert cut(call) is None  # nothing streamed: its input estimate, when charged
        h.recorder.sink = h.recorder.streamed_text
        h.recorder.streamed_text("a" * 40)
        h.recorder.streamed_text("b")
        spent = cut(call)
        assert spent is not None
        assert (spent.input_tokens, spent.output_tokens) == (50, 11)


async def test_outside_a_request_a_model_inside_sends_on_its_own() -> None:
    inner = ScriptedModel([reply("x")], name="inner")
    assert admitting(inner) == inner.request


async def test_inside_a_request_a_model_inside_is_admitted(make_harness: Any) -> None:
    async with make_harness() as h:
        inner = ScriptedModel([reply("x"), reply("y")], name="inner")
        call = h.call()
        token = IN_CALL.set(CallSlot(h.recorder, call))
        try:
            send = admitting(inner)
            await send(call.request)
            await send(call.request)
        finally:
            IN_CALL.reset(token)
        assert call.inner == 2
        assert call.used is not None
        assert call.used.requests == 2
