"""Models: the protocol a provider implements, and the fakes that script it.

A ``Model`` takes one ``ModelRequest`` (the inference context, the tools offered and
the output cap) and answers one ``ModelResponse`` (text, tool calls, usage, finish
reason). Real providers plug in behind the protocol; the tests, demos and benchmarks
use the fakes shipped here (as httpx ships ``MockTransport`` next to its transports):

- ``ScriptedModel``: a fixed list of turns, served in order.
- ``FunctionModel``: a function of the request, for concurrent and nested scripts.
- ``CycleModel``: a lean script for measurements (the benchmarks, ``fractor bench
  --tool``): each execution gets the same turns, and it records nothing.

A model that can also **stream** implements ``StreamingModel``: ``stream(request,
sink)`` hands each piece of the answer's text to ``sink`` as it arrives and returns
the same ``ModelResponse`` as ``request``. Both fakes stream: a turn built with
``streamed(...)`` comes in chunks, with a delay before each.

Turns are built with ``reply`` (a final answer), ``call`` (one tool call), ``calls``
(several tool calls in one step) and ``fail`` (the model raises an error). The first two
fill in what a provider would report: call ids, usage (estimated with
``estimate_tokens``) and the ``finish_reason="length"`` truncation that
``max_tokens`` causes.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, cast

import anyio.lowlevel
import msgspec

from runtime import FractorError

from ._messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    Usage,
)

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

_json_encoder = msgspec.json.Encoder()
_NO_USAGE = Usage()
#: What every message costs on top of its text (role markers, separators).
_TOKENS_PER_MESSAGE = 4
#: Characters per token: the usual rule of thumb for English text and JSON.
_CHARS_PER_TOKEN = 4
#: Generated call ids look like this; an explicit id of this form is never generated.
_GENERATED_ID = re.compile(r"call_\d+")


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
    holds (connections, clients).
    """

    @property
    def name(self) -> str: ...

    async def request(self, request: ModelRequest) -> ModelResponse: ...

    def estimate_tokens(self, request: ModelRequest) -> int: ...

    async def aclose(self) -> None: ...


Sink: TypeAlias = Callable[[str], None]
"""What a streaming model hands each piece of text to, as it arrives. It never blocks
(and never awaits): a slow consumer is the caller's to buffer."""


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


def _ceil_tokens(chars: int) -> int:
    return -(-chars // _CHARS_PER_TOKEN)


def estimate_tokens(request: ModelRequest) -> int:
    """A cheap, deterministic estimate of the input tokens of ``request``.

    One token per four characters of every message's text (content, tool call names
    and arguments, tool result content) and of every tool spec (name, description,
    JSON schema), plus four tokens per message. Linear in the size of the request.
    """
    chars = 0
    for message in request.messages:
        chars += len(message.content)
        if type(message) is AssistantMessage:
            for tool_call in message.tool_calls:
                chars += len(tool_call.name) + len(tool_call.arguments)
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(_json_encoder.encode(spec.parameters))
    return _ceil_tokens(chars) + _TOKENS_PER_MESSAGE * len(request.messages)


def _estimate_output(response: ModelResponse) -> int:
    chars = len(response.text)
    for tool_call in response.tool_calls:
        chars += len(tool_call.name) + len(tool_call.arguments)
    return max(1, _ceil_tokens(chars))


# -- turn builders ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    """A scripted model error: serving this turn raises ``error`` from ``request``.

    Built with ``fail(error)``; it takes the place of a ``ModelResponse`` in a
    ``ScriptedModel`` script or as the return value of a ``FunctionModel`` function.
    It is a test device and never crosses an actor boundary, so it is not a Struct.
    """

    error: Exception


@dataclass(frozen=True, slots=True)
class Streamed:
    """A scripted turn whose text comes in ``chunks``, ``delay`` seconds before each.

    Built with ``streamed(...)``. Streamed (``stream``), each chunk reaches the sink
    after its delay; asked in one piece (``request``), the whole answer comes after
    all the delays, as a server's would. A test device, like ``Failure``.
    """

    response: ModelResponse
    chunks: tuple[str, ...]
    delay: float


Turn: TypeAlias = ModelResponse | Failure | Streamed
"""One scripted turn: a response to serve, a ``Failure`` to raise, or a response
that comes in chunks (``Streamed``)."""


def reply(text: str, *, usage: Usage | None = None) -> ModelResponse:
    """A final answer: ``text`` and no tool calls (``finish_reason="stop"``).

    Without ``usage`` the serving model estimates it from the request and the text.
    """
    return ModelResponse(
        text=text, usage=_NO_USAGE if usage is None else usage, finish_reason="stop"
    )


def call(
    name: str,
    arguments: Mapping[str, object] | None = None,
    /,
    *,
    id: str | None = None,
    text: str = "",
    **kwargs: object,
) -> ModelResponse:
    """A turn asking for one tool call: ``call("get_weather", city="Paris")``.

    The arguments are the keyword arguments, JSON-encoded. An argument named ``id`` or
    ``text`` (or any name that is not an identifier) goes in the positional mapping:
    ``call("summarize", {"text": "..."})``. ``id=None`` lets the serving model assign
    a unique id (``call_1``, ``call_2``, ...). ``text`` is what the model says along
    with the call (trace, not answer).
    """
    merged: dict[str, object] = dict(arguments) if arguments is not None else {}
    merged.update(kwargs)
    try:
        encoded = _json_encoder.encode(merged).decode()
    except TypeError as exc:
        raise TypeError(f"the arguments of call {name!r} are not JSON-encodable: {exc}") from exc
    tool_call = ToolCall(id=id or "", name=name, arguments=encoded)
    return ModelResponse(text=text, tool_calls=(tool_call,), finish_reason="tool_calls")


def calls(*turns: ModelResponse, text: str = "") -> ModelResponse:
    """One turn asking for the tool calls of several ``call(...)`` turns at once.

    The calls of one step run concurrently. ``text`` defaults to the texts of the
    merged turns, joined by newlines. Raises ``ValueError`` for a turn without tool
    calls, for no turns at all and for an explicit id given twice.
    """
    if not turns:
        raise ValueError("calls() needs at least one call(...) turn to merge")
    merged: list[ToolCall] = []
    texts: list[str] = []
    seen: set[str] = set()
    for index, turn in enumerate(turns):
        if not isinstance(turn, ModelResponse) or not turn.tool_calls:
            raise ValueError(
                f"calls() merges tool calls, but turn {index} ({turn!r}) has none; "
                "build each turn with call(name, **arguments)"
            )
        for tool_call in turn.tool_calls:
            if tool_call.id:
                if tool_call.id in seen:
                    raise ValueError(
                        f"calls() got the tool call id {tool_call.id!r} twice; "
                        "the ids of one turn must be unique (or left out)"
                    )
                seen.add(tool_call.id)
            merged.append(tool_call)
        if turn.text:
            texts.append(turn.text)
    return ModelResponse(
        text=text or "\n".join(texts), tool_calls=tuple(merged), finish_reason="tool_calls"
    )


def streamed(
    turn: str | ModelResponse, *, chunks: int | Sequence[str] = 4, delay: float = 0.0
) -> Streamed:
    """A turn that comes in pieces: ``streamed("Sunny in Paris.", chunks=3, delay=0.05)``.

    ``turn`` is the answer's text (a final answer, as ``reply`` makes) or any turn
    built with ``reply`` or ``call`` (its text is what streams). ``chunks`` is how
    many pieces of about the same size to cut the text into, or the pieces
    themselves (they must join to the text). ``delay`` is the seconds before each.
    """
    response = reply(turn) if isinstance(turn, str) else turn
    if not isinstance(response, ModelResponse):
        raise TypeError(f"streamed() takes a text or a reply(...)/call(...) turn, got {turn!r}")
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0:
        raise ValueError(f"streamed(): delay must be a number of seconds >= 0, got {delay!r}")
    text = response.text
    if isinstance(chunks, int) and not isinstance(chunks, bool):
        if chunks < 1:
            raise ValueError(f"streamed(): chunks must be >= 1, got {chunks}")
        size = max(1, -(-len(text) // chunks))
        pieces = tuple(text[i : i + size] for i in range(0, len(text), size)) or ("",)
    elif isinstance(chunks, Sequence) and not isinstance(chunks, str):
        pieces = tuple(chunks)
        if not pieces or not all(isinstance(piece, str) for piece in pieces):
            raise TypeError(f"streamed(): chunks must be texts, got {chunks!r}")
        if "".join(pieces) != text:
            raise ValueError(
                f"streamed(): the chunks join to {''.join(pieces)!r}, not the turn's text {text!r}"
            )
    else:
        raise TypeError(
            f"streamed(): chunks must be a count or a sequence of texts, got {chunks!r}"
        )
    return Streamed(response=response, chunks=pieces, delay=float(delay))


def fail(error: Exception) -> Failure:
    """A turn that makes the model raise ``error`` when it is served."""
    if not isinstance(error, Exception):
        raise TypeError(f"fail() takes an exception instance, got {error!r}")
    return Failure(error=error)


class ScriptExhausted(FractorError):
    """A ``ScriptedModel`` was asked for a turn after serving its whole script."""

    def __init__(self, model_name: str, turns: int) -> None:
        super().__init__(
            f"scripted model {model_name!r} has served all {turns} turns of its script, "
            "and a test or demo asked for one more: add turns to the script, or find "
            "out why the agent took more steps than expected"
        )
        self.model_name = model_name
        self.turns = turns


# -- the fakes ------------------------------------------------------------------------

#: How many of the requests they served the fakes keep by default (``record=``).
RECORDED = 1_000


class _ServingModel:
    """What both fakes share: recording requests and turning a turn into a response."""

    def __init__(self, name: str, record: int | None) -> None:
        if record is not None and (
            isinstance(record, bool) or not isinstance(record, int) or record < 0
        ):
            raise ValueError(f"record must be a whole number >= 0 or None, got {record!r}")
        self.name = name
        #: The requests received, in order, for assertions: the last ``record`` of
        #: them (each holds its whole context: a long-lived fake would otherwise
        #: keep every context it ever served).
        self.requests: deque[ModelRequest] = deque(maxlen=record)
        self._ids = itertools.count(1)
        #: Explicit ids of the generated form, never to be generated again.
        self._taken_ids: set[str] = set()
        self._estimated: tuple[ModelRequest | None, int] = (None, 0)

    def estimate_tokens(self, request: ModelRequest) -> int:
        """``estimate_tokens(request)``, remembered for the request that follows."""
        last, tokens = self._estimated
        if request is not last:
            tokens = estimate_tokens(request)
            self._estimated = (request, tokens)
        return tokens

    async def aclose(self) -> None:
        """Nothing to release."""

    def _take_id(self, explicit: str) -> None:
        if explicit.startswith("call_") and _GENERATED_ID.fullmatch(explicit):
            self._taken_ids.add(explicit)

    def _new_id(self) -> str:
        while (new := f"call_{next(self._ids)}") in self._taken_ids:
            pass
        return new

    @property
    def streaming(self) -> bool:
        """The fakes always stream (a turn not built with ``streamed`` in one piece)."""
        return True

    async def _deliver(
        self, turn: object, request: ModelRequest, sink: Sink | None
    ) -> ModelResponse:
        """Serve ``turn``: at once, or for a ``Streamed`` one chunk by chunk (to
        ``sink``, when streaming) after each chunk's delay. Text cut by ``max_tokens``
        is cut in the chunks too."""
        if not isinstance(turn, Streamed):
            response = self._serve(turn, request)
            if sink is not None and response.text:
                sink(response.text)
            return response
        response = self._serve(turn.response, request)
        left = len(response.text)
        for piece in turn.chunks:
            if turn.delay:
                await anyio.sleep(turn.delay)
            piece = piece[:left]
            left -= len(piece)
            if sink is not None and piece:
                sink(piece)
        return response

    def _serve(self, turn: object, request: ModelRequest) -> ModelResponse:
        """Raise a ``Failure``, or complete a response as a provider would report it."""
        if isinstance(turn, Failure):
            raise turn.error
        if not isinstance(turn, ModelResponse):
            raise TypeError(
                f"model {self.name!r} was given {turn!r} as a turn; expected a "
                "ModelResponse (reply(...), call(...), calls(...)) or fail(error)"
            )
        usage = turn.usage
        if usage == _NO_USAGE:
            usage = Usage(
                input_tokens=self.estimate_tokens(request),
                output_tokens=_estimate_output(turn),
                requests=1,
            )
        elif usage.requests != 1:
            usage = msgspec.structs.replace(usage, requests=1)
        text = turn.text
        tool_calls = turn.tool_calls
        finish = turn.finish_reason
        limit = request.max_tokens
        if limit is not None and usage.output_tokens > limit:
            # Cut short, as a provider would: a truncated tool call is malformed JSON,
            # so the calls go and only the head of the text stays.
            limit = max(limit, 0)
            text = text[: limit * _CHARS_PER_TOKEN]
            tool_calls = ()
            finish = "length"
            usage = msgspec.structs.replace(usage, output_tokens=limit)
        elif tool_calls:
            tool_calls = tuple(
                c if c.id else msgspec.structs.replace(c, id=self._new_id()) for c in tool_calls
            )
        return ModelResponse(
            text=text,
            tool_calls=tool_calls,
            usage=usage,
            finish_reason=finish,
            model=turn.model or self.name,
        )


class ScriptedModel(_ServingModel):
    """A model that serves a fixed list of turns, one per request, in order.

    The script is shared by every caller, not kept per agent: when several agents (a
    parent and its children) use one ``ScriptedModel``, they take turns from the same
    list in the order their requests arrive. For scripts that depend on who asks, use
    a ``FunctionModel`` (or one ``ScriptedModel`` per agent).

    Serving is atomic: concurrent requests in one event loop each get a different
    turn, exactly once. Missing call ids are assigned (``call_1``, ``call_2``, ...,
    unique per model), usage is estimated unless the turn gives it (``requests`` is
    always 1), and ``request.max_tokens`` is honoured. After the last turn, a request
    raises ``ScriptExhausted``. ``requests`` keeps the last ``record`` requests
    served (1,000 by default; None keeps them all, 0 none).
    """

    def __init__(
        self, turns: Iterable[Turn], *, name: str = "scripted", record: int | None = RECORDED
    ) -> None:
        super().__init__(name, record)
        self._turns: tuple[Turn, ...] = tuple(turns)
        self._next = 0
        for index, turn in enumerate(self._turns):
            response = turn.response if isinstance(turn, Streamed) else turn
            if isinstance(response, ModelResponse):
                for tool_call in response.tool_calls:
                    self._take_id(tool_call.id)
            elif not isinstance(turn, Failure):
                raise TypeError(
                    f"turn {index} of the script of {name!r} is {turn!r}; expected a "
                    "ModelResponse (reply(...), call(...), calls(...)), streamed(...) "
                    "or fail(error)"
                )

    @property
    def remaining(self) -> int:
        """How many turns are left to serve."""
        return len(self._turns) - self._next

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self.stream(request, None)

    async def stream(self, request: ModelRequest, sink: Sink | None) -> ModelResponse:
        """Serve the next turn, its text to ``sink`` as it comes (``StreamingModel``)."""
        await anyio.lowlevel.checkpoint()
        # From here on nothing awaits until the turn is taken: atomic in the event loop.
        self.requests.append(request)
        index = self._next
        if index >= len(self._turns):
            raise ScriptExhausted(self.name, len(self._turns))
        self._next = index + 1
        turn = self._turns[index]
        if type(turn) is ModelResponse:  # the usual turn: no coroutine of _deliver's
            response = self._serve(turn, request)
            if sink is not None and response.text:
                sink(response.text)
            return response
        return await self._deliver(turn, request, sink)


ModelFunction: TypeAlias = (
    Callable[[ModelRequest], Turn] | Callable[[ModelRequest], Awaitable[Turn]]
)
"""What a ``FunctionModel`` calls: a function of the request, sync or async."""


class FunctionModel(_ServingModel):
    """A model whose every response is computed by a function of the request.

    ``function`` takes the ``ModelRequest`` and returns a ``ModelResponse`` (or a
    ``fail(...)`` marker, or raises); it may be sync (called inline: it must not
    block) or async. The response may depend on the request, for instance on its last
    message, which makes concurrent and nested scripts deterministic. The response is
    completed like a ``ScriptedModel`` turn: call ids, usage, ``max_tokens``.
    ``requests`` keeps the last ``record`` requests, as for ``ScriptedModel``.
    """

    def __init__(
        self, function: ModelFunction, *, name: str = "function", record: int | None = RECORDED
    ) -> None:
        super().__init__(name, record)
        self._function = function
        # A function, or an object whose __call__ is a coroutine function.
        self._is_async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
            type(function).__call__
        )

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self.stream(request, None)

    async def stream(self, request: ModelRequest, sink: Sink | None) -> ModelResponse:
        """Serve the function's turn, its text to ``sink`` as it comes (``StreamingModel``)."""
        turn: object
        if self._is_async:
            self.requests.append(request)
            run_async = cast(Callable[[ModelRequest], Awaitable[Turn]], self._function)
            turn = await run_async(request)
        else:
            await anyio.lowlevel.checkpoint()
            self.requests.append(request)
            turn = self._function(request)
            if not isinstance(turn, ModelResponse | Failure | Streamed) and inspect.isawaitable(
                turn
            ):
                # A sync function that hands back an awaitable (a lambda around a
                # coroutine function, a partial): await what it returned.
                turn = await cast(Awaitable[object], turn)
        response = turn.response if isinstance(turn, Streamed) else turn
        if isinstance(response, ModelResponse) and response.tool_calls:
            for tool_call in response.tool_calls:
                if tool_call.id:
                    self._take_id(tool_call.id)
        return await self._deliver(turn, request, sink)


class CycleModel:
    """A lean scripted model for measurements: each execution gets ``turns`` in order.

    The step is read from the last tool call id (``call_<step>_<i>``): O(1), no state,
    so concurrent executions of one definition never mix their scripts. It records no
    request and its token estimate is constant, so what is measured is the runtime
    (and the tool under test), not the fake. The benchmarks and ``fractor bench
    --tool`` use it.
    """

    def __init__(self, turns: Sequence[ModelResponse], *, name: str = "cycle") -> None:
        self.turns = tuple(turns)
        self.name = name

    async def request(self, request: ModelRequest) -> ModelResponse:
        await anyio.lowlevel.checkpoint()
        last = request.messages[-1]
        step = int(last.call_id.split("_")[1]) + 1 if isinstance(last, ToolResultMessage) else 0
        return self.turns[min(step, len(self.turns) - 1)]

    def estimate_tokens(self, request: ModelRequest) -> int:
        return 10

    async def aclose(self) -> None:
        return None
