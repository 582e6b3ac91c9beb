"""The fake models: ``ScriptedModel``, ``FunctionModel`` and ``CycleModel``.

Each implements ``StreamingModel`` (``actors._models._protocol``, which re-exports them) and
serves turns built with the functions of ``actors._models._turns``:

- ``ScriptedModel``: a fixed list of turns, served in order.
- ``FunctionModel``: a function of the request, for concurrent and nested scripts.
- ``CycleModel``: a lean script for measurements (the benchmarks, ``fractor bench
  --tool``): each execution gets the same turns, and it records nothing.

The first two complete each turn as a provider would report it: call ids, usage
(estimated with ``estimate_tokens`` unless the turn gives it) and the
``finish_reason="length"`` truncation that ``max_tokens`` causes. A turn built with
``streamed(...)`` comes in chunks, with a delay before each.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeAlias, cast

import anyio.lowlevel
import msgspec

from fractor.runtime import FractorError

from .._messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    Usage,
    UserMessage,
    parts_tokens,
)
from ._turns import NO_USAGE, Failure, Streamed, Turn

__all__ = [
    "CycleModel",
    "FunctionModel",
    "ModelFunction",
    "ScriptExhausted",
    "ScriptedModel",
    "Sink",
    "estimate_tokens",
]

Sink: TypeAlias = Callable[[str], None]
"""What a streaming model hands each piece of text to, as it arrives. It never blocks
(and never awaits): a slow consumer is the caller's to buffer.

``StreamingModel`` (``actors._models._protocol``) takes one; it is written here, with the
fakes that take one too, because ``actors._models._protocol`` re-exports the fakes: a
module below it cannot name a type of it."""

_json_encoder = msgspec.json.Encoder()
#: What every message costs on top of its text (role markers, separators).
_TOKENS_PER_MESSAGE = 4
#: Characters per token: the usual rule of thumb for English text and JSON.
_CHARS_PER_TOKEN = 4
#: Generated call ids look like this; an explicit id of this form is never generated.
_GENERATED_ID = re.compile(r"call_\d+")


def _ceil_tokens(chars: int) -> int:
    return -(-chars // _CHARS_PER_TOKEN)


def estimate_tokens(request: ModelRequest) -> int:
    """A cheap, deterministic estimate of the input tokens of ``request``.

    One token per four characters of every message's text (content, tool call names
    and arguments, tool result content) and of every tool spec (name, description,
    JSON schema) and of a native structured output's schema, plus four tokens per
    message; and each image and document of a user turn or tool result as
    ``part_tokens`` counts it (Anthropic's image rule, 1,500 tokens a PDF page).
    Linear in the size of the request.
    """
    chars = 0
    parts = 0
    for message in request.messages:
        chars += len(message.content)
        if type(message) is AssistantMessage:
            for tool_call in message.tool_calls:
                chars += len(tool_call.name) + len(tool_call.arguments)
        elif (type(message) is UserMessage or type(message) is ToolResultMessage) and (
            message.parts
        ):
            parts += parts_tokens((message,))
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(_json_encoder.encode(spec.parameters))
    output = request.output_schema
    if output is not None and output.native:
        chars += len(_json_encoder.encode(output.schema))
    return _ceil_tokens(chars) + _TOKENS_PER_MESSAGE * len(request.messages) + parts


def _estimate_output(response: ModelResponse) -> int:
    chars = len(response.text)
    for tool_call in response.tool_calls:
        chars += len(tool_call.name) + len(tool_call.arguments)
    return max(1, _ceil_tokens(chars))


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

    #: Typed answers come in the text, as with a provider's structured output
    #: (``Agent(output_mode="auto")`` asks this way); the turns are served as they
    #: are, so a test decides whether they match the schema.
    structured_output = True

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
        if usage == NO_USAGE:
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
            parts=turn.parts,
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
