"""Models: the protocol a provider implements.

A ``Model`` takes one ``ModelRequest`` (the inference context, the tools offered and
the output cap) and answers one ``ModelResponse`` (text, tool calls, usage, finish
reason). A model that can also **stream** implements ``StreamingModel``: ``stream(request,
sink)`` hands each piece of the answer's text to ``sink`` as it arrives and returns
the same ``ModelResponse`` as ``request``. A ``ModelAdapter`` (``ReActModel``) is a
model built on another one.

Real providers plug in behind the protocol (``fractor.actors.providers``); the tests, demos
and benchmarks use the fakes (as httpx ships ``MockTransport`` next to its
transports): ``ScriptedModel``, ``FunctionModel`` and ``CycleModel`` in
``actors._models._fakes``, serving turns built with ``reply``, ``call``, ``calls``,
``streamed`` and ``fail`` (``actors._models._turns``). Both are re-exported here, as are
``estimate_tokens``, the token estimate the fakes report usage with, and ``Sink``,
what a streaming model hands its text to (written beside the fakes, which take one
too: this module imports them, so they import nothing of it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeAlias

from .._messages import ModelRequest, ModelResponse
from ._fakes import CycleModel as CycleModel
from ._fakes import FunctionModel as FunctionModel
from ._fakes import ModelFunction as ModelFunction
from ._fakes import ScriptedModel as ScriptedModel
from ._fakes import ScriptExhausted as ScriptExhausted
from ._fakes import Sink as Sink
from ._fakes import estimate_tokens as estimate_tokens
from ._turns import Failure as Failure
from ._turns import Streamed as Streamed
from ._turns import Turn as Turn
from ._turns import call as call
from ._turns import calls as calls
from ._turns import fail as fail
from ._turns import reply as reply
from ._turns import streamed as streamed

__all__ = [
    "Failure",
    "FunctionModel",
    "Model",
    "ModelAdapter",
    "ModelFunction",
    "ScriptExhausted",
    "ScriptedModel",
    "Send",
    "Sink",
    "Streamed",
    "StreamingModel",
    "Turn",
    "call",
    "calls",
    "estimate_tokens",
    "fail",
    "reply",
    "streamed",
]


class Model(Protocol):
    """What a model provider implements.

    A provider must honour three things:

    - ``request.max_tokens`` (when not ``None``) caps the output tokens of the
      response: the supervisor reserves exactly that much budget before the request.
      A response cut short says so with ``finish_reason="length"``.
    - Usage is reported on every response, with ``requests=1`` per request (an adapter
      that makes several underlying requests reports all of them).
    - Tool call ids are unique within an execution: each tool result names the id of
      the call it answers.

    ``estimate_tokens`` is the cheap input-token estimate the budget pre-check uses
    before a request; it must never block. ``aclose`` releases whatever the model
    holds (connections, clients); a runtime calls it for each model its agents used,
    as it exits, and an adapter for its inner model, so it may come more than once
    (idempotent). A model asked again after ``aclose`` serves again (opening what it
    needs anew): a runtime that follows may use it, and one closing it must not cut
    a request another runtime still has in flight.
    """

    @property
    def name(self) -> str: ...

    async def request(self, request: ModelRequest) -> ModelResponse: ...

    def estimate_tokens(self, request: ModelRequest) -> int: ...

    async def aclose(self) -> None: ...


class StreamingModel(Model, Protocol):
    """A model that can hand its answer's text over as it is generated.

    ``stream`` sends the same request as ``request`` and returns the same
    ``ModelResponse``; meanwhile it calls ``sink`` with each piece of the answer's
    text, in order (tool call arguments and reasoning are not text: they never reach
    the sink). Everything ``Model`` asks of ``request`` holds for ``stream`` too, and:

    - When the caller is cancelled (a deadline, a stop), the stream is closed at once:
      the connection is released, so the server stops generating.
    - A stream that fails part-way raises like a failed request; the text already
      handed to ``sink`` is all the caller gets of it. A provider's error then
      carries a ``usage`` attribute: what the server reported, or an estimate of
      the input plus what was received.

    ``streaming`` says whether an agent should use ``stream`` at all (a provider may
    be told not to: ``OpenAIModel(..., stream=False)``).
    """

    @property
    def streaming(self) -> bool: ...

    async def stream(self, request: ModelRequest, sink: Sink) -> ModelResponse: ...


Send: TypeAlias = Callable[[ModelRequest], Awaitable[ModelResponse]]
"""How a ``ModelAdapter`` sends one request of its own to its inner model."""


class ModelAdapter(Model, Protocol):
    """A model built on another one (``ReActModel``): it may send several requests
    to ``inner`` for one request of its own (corrections, fallbacks).

    An agent calls ``request_via`` with a ``send`` that checks and charges each of
    those requests with the supervisor like any other (reserving headroom for it,
    waiting for it, settling its usage): an adapter never spends what the budget
    did not grant. ``request`` is ``request_via`` with the inner model's own
    ``request`` as ``send``, for use outside an agent.
    """

    @property
    def inner(self) -> Model: ...

    async def request_via(self, request: ModelRequest, send: Send) -> ModelResponse: ...
