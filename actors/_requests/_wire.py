"""The bottom of the stack: the model itself, asked for its answer (streamed to
the execution's sink when it streams)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .._messages import ModelResponse
    from .._models._protocol import Model, StreamingModel
    from ._call import Call

__all__ = ["Wire"]


class Wire:
    """The model's own ``request`` (or ``stream``): not a coroutine of its own, it
    hands back the model's, one frame less under the stages above it."""

    __slots__ = ("model",)

    def __init__(self, model: Model) -> None:
        self.model = model

    def send(self, call: Call) -> Awaitable[ModelResponse]:
        call.sent = True
        recorder = call.recorder
        sink = recorder.sink
        if sink is None:
            return self.model.request(call.outgoing)
        recorder.streamed.clear()  # each attempt streams from its start
        return cast("StreamingModel", self.model).stream(call.outgoing, sink)
