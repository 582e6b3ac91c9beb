"""The request path as built (``actors/_requests/_stack.py``, ``_chain.py``,
``_fallback.py``, ``_wire.py``): the stages a model's stack holds, a fallback
chain's links in turn, and a model built on another whose inner requests go down
the stages of the model inside it."""

from __future__ import annotations

from typing import Any

import pytest

from fractor.actors._agent._policy import RetryPolicy
from fractor.actors._messages import ModelRequest, ToolSpec, UserMessage
from fractor.actors._models._fallback import FallbackModel
from fractor.actors._models._protocol import ScriptedModel, fail, reply
from fractor.actors._models._react import ReActModel
from fractor.actors._requests import build
from fractor.actors._requests._budget import Budget
from fractor.actors._requests._chain import Chain
from fractor.actors._requests._fallback import Fallback
from fractor.actors._requests._observe import Observe
from fractor.actors._requests._rate import Rate
from fractor.actors._requests._retry import Retry
from fractor.actors._requests._stack import Adapter
from fractor.actors._requests._wire import Wire
from fractor.runtime import Budget as Limits

pytestmark = pytest.mark.anyio


class Down(Exception):
    """A server error the chain moves on from once retries are spent."""

    kind = "server"
    status = 503
    retryable = True


class Rejected(Exception):
    """A request the server rejected: no other model mends it."""

    kind = "rejected"
    status = 400


def _request(tools: tuple[ToolSpec, ...] = ()) -> ModelRequest:
    return ModelRequest(messages=(UserMessage(content="hi"),), tools=tools, max_tokens=64)


def _stages(top: Any) -> list[type]:
    kinds = []
    while hasattr(top, "__self__"):
        stage = top.__self__
        kinds.append(type(stage))
        top = getattr(stage, "next", None)
    return kinds


def test_a_stage_with_nothing_to_do_is_left_out() -> None:
    model = ScriptedModel([reply("x")], name="m")
    chain = build(model, RetryPolicy())
    assert isinstance(chain, Chain)
    assert _stages(chain.plain) == [Budget, Rate, Wire]
    assert _stages(chain.observed) == [Budget, Rate, Observe, Wire]
    retrying = build(model, RetryPolicy(retries=2))
    assert isinstance(retrying, Chain)
    assert _stages(retrying.plain) == [Retry, Budget, Rate, Wire]
    once = build(model, RetryPolicy(retries=2), once=True)
    assert isinstance(once, Chain)
    assert _stages(once.plain) == [Budget, Rate, Wire]


def test_build_picks_the_shape_of_the_model() -> None:
    a, b = ScriptedModel([reply("a")], name="a"), ScriptedModel([reply("b")], name="b")
    assert isinstance(build(FallbackModel(a, b), RetryPolicy()), Fallback)
    adapter = build(ReActModel(FallbackModel(a, b)), RetryPolicy())
    assert isinstance(adapter, Adapter)
    assert isinstance(adapter.inner, Fallback)


async def test_a_fallback_chain_moves_on_and_names_the_model_that_answered(
    make_harness: Any,
) -> None:
    async with make_harness(budget=Limits(requests=5)) as h:
        down = ScriptedModel([fail(Down("down"))], name="primary")
        up = ScriptedModel([reply("from the second")], name="second")
        response = await build(FallbackModel(down, up), RetryPolicy()).send(h.recorder, _request())
        assert (response.text, response.model) == ("from the second", "second")
        retry = next(e.detail for e in h.events if e.kind == "retry")
        assert "falling back to second" in retry.error
        assert [e.detail.model for e in h.events if e.kind == "request_start"] == [
            "primary",
            "second",
        ]


async def test_an_error_no_fallback_mends_is_the_answer(make_harness: Any) -> None:
    async with make_harness() as h:
        bad = ScriptedModel([fail(Rejected("rejected"))], name="primary")
        spare = ScriptedModel([reply("unused")], name="second")
        with pytest.raises(Exception, match="rejected"):
            await build(FallbackModel(bad, spare), RetryPolicy()).send(h.recorder, _request())


async def test_every_inner_request_of_an_adapter_goes_down_the_stages(make_harness: Any) -> None:
    async with make_harness(budget=Limits(requests=10)) as h:
        inner = ScriptedModel(
            [reply("I will now add."), reply('{"thought": "done", "final": "done"}')], name="inner"
        )
        tools = (ToolSpec(name="add", description="adds", parameters={"type": "object"}),)
        response = await build(ReActModel(inner), RetryPolicy()).send(h.recorder, _request(tools))
        assert response.text == "done"
        assert h.node.requests == 2  # the correction too, charged
        assert [e.detail.model for e in h.events if e.kind == "request_start"] == ["inner"] * 2
