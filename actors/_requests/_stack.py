"""The request path of one agent's model, built once (``build``): a ``Chain`` of
stages for a model that answers itself, a ``Fallback`` of chains for a
``FallbackModel``, and an ``Adapter`` for a model built on another (ReAct), whose
every inner request goes down the stages of the model inside it."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol, cast

from .._models._fallback import FallbackModel
from ._chain import Chain
from ._fallback import Fallback

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .._agent._policy import RetryPolicy
    from .._execution._recording import Recorder
    from .._messages import ModelRequest, ModelResponse
    from .._models._protocol import Model, ModelAdapter

__all__ = ["Adapter", "Requests", "build"]


class Requests(Protocol):
    """How an execution sends a model request: the one method of a built stack."""

    def send(self, recorder: Recorder, request: ModelRequest) -> Awaitable[ModelResponse]: ...


class Adapter:
    """A model built on another (``ModelAdapter``): it answers through
    ``request_via``, each of its own requests (corrections included) sent down the
    stages of the model inside it, checked and charged like any other."""

    __slots__ = ("inner", "model")

    def __init__(self, model: ModelAdapter, inner: Requests) -> None:
        self.model = model
        self.inner = inner

    def send(self, recorder: Recorder, request: ModelRequest) -> Awaitable[ModelResponse]:
        return self.model.request_via(request, functools.partial(self.inner.send, recorder))


def build(model: Model, retry: RetryPolicy, *, once: bool = False) -> Requests:
    """The request path of ``model`` under the agent's ``retry`` policy; ``once``
    for optional work (one attempt, no second ask: a summarization)."""
    if callable(getattr(model, "request_via", None)):
        adapter = cast("ModelAdapter", model)
        return Adapter(adapter, build(adapter.inner, retry, once=once))
    if isinstance(model, FallbackModel):
        return Fallback(model, retry, once=once)
    return Chain(model, retry, once=once)
