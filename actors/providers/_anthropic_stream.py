"""How a streamed Anthropic Messages API response comes back, and how it is read:
the events' Structs and ``AnthropicStreamReader``. What it shares with reading a
message in one piece is in ``_anthropic_response.py``; ``AnthropicModel``
(``_anthropic.py``) opens the stream and imports this module, never the reverse.

Streamed (``stream``; ``streaming`` is True unless the model was built with
``stream=False``), the request says ``"stream": true`` and the answer comes as
server-sent events, each named by an ``event:`` line and typed by its data's ``type``:

- ``message_start``: the model and the usage so far (the input figures, counted as
  for a message read in one piece); ``ping``: nothing.
- ``content_block_start`` (``index``, ``content_block``): a ``text`` block, a
  ``tool_use`` block (``id``, ``name``), or another kind (``thinking``,
  ``redacted_thinking``, server tools) that is read past.
- ``content_block_delta`` (``index``, ``delta``): ``text_delta`` text goes to the
  sink at once; ``input_json_delta`` pieces of a tool call's ``partial_json`` are
  joined per block and decoded when the message is complete (re-encoded as a
  message's ``input`` is, so the response is the one ``request`` returns; JSON that
  does not decode, a call cut off by ``max_tokens``, is kept as it came);
  ``thinking_delta`` and ``signature_delta`` only count as output received.
  ``content_block_stop`` closes a block.
- ``message_delta``: the ``stop_reason`` and the cumulative ``output_tokens`` (newer
  servers repeat the input figures there too: they win); ``message_stop``: the end.
- ``error`` (``{"type": "error", "error": {"type", "message"}}``): the server failed
  part-way; a ``ProviderError`` with its words, retryable for
  ``overloaded_error``, ``api_error``, ``rate_limit_error`` and ``timeout_error``.
- Events of a type not listed here are skipped (the API may add some); data that is
  not an event is a malformed response. A stream that ends before ``message_stop``,
  or with no ``stop_reason`` (``message_stop`` ends the stream; only a stop reason
  says the message is complete), has broken off (retryable). A failed stream's error
  carries the usage reported so far, or the input estimate and an estimate of the
  output received (at least a token for each delta that brought output).
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._messages import ModelRequest, ModelResponse, ToolCall, Usage
from .._models._protocol import Sink
from ._anthropic_response import CHARS_PER_TOKEN, Block, finish_of, usage_of
from ._base import Asker
from ._errors import ProviderError, malformed
from ._estimates import estimate_output_tokens

__all__ = ["AnthropicStreamReader"]

#: The types of a stream's ``error`` event worth sending the request again for.
#: The error events of a stream that may pass, each with its ``ProviderError.kind``.
_RETRYABLE_ERRORS = {
    "overloaded_error": "busy",
    "api_error": "server",
    "rate_limit_error": "rate_limited",
    "timeout_error": "timeout",
}
_json_encoder = msgspec.json.Encoder()


# -- the stream, event by event -----------------------------------------------------------


class _StreamUsage(msgspec.Struct, frozen=True):
    """Usage as an event reports it: ``None`` for what it leaves out."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Started(msgspec.Struct, frozen=True):
    model: str | None = None
    usage: _StreamUsage = msgspec.field(default_factory=_StreamUsage)


class _Delta(msgspec.Struct, frozen=True):
    """A ``content_block_delta``'s delta, whatever its type (some are read past)."""

    type: str
    text: str = ""
    partial_json: str = ""
    thinking: str = ""
    signature: str = ""


class _Stopping(msgspec.Struct, frozen=True):
    stop_reason: str | None = None


class _ErrorDetail(msgspec.Struct, frozen=True):
    type: str = ""
    message: str = ""


class _Event(msgspec.Struct, frozen=True, tag_field="type"):
    """A server-sent event's data, tagged by its ``type``."""


class _MessageStart(_Event, frozen=True, tag="message_start"):
    message: _Started


class _BlockStart(_Event, frozen=True, tag="content_block_start"):
    index: int
    content_block: Block


class _BlockDelta(_Event, frozen=True, tag="content_block_delta"):
    index: int
    delta: _Delta


class _BlockStop(_Event, frozen=True, tag="content_block_stop"):
    index: int = 0


class _MessageDelta(_Event, frozen=True, tag="message_delta"):
    delta: _Stopping = msgspec.field(default_factory=_Stopping)
    usage: _StreamUsage = msgspec.field(default_factory=_StreamUsage)


class _MessageStop(_Event, frozen=True, tag="message_stop"):
    pass


class _Ping(_Event, frozen=True, tag="ping"):
    pass


class _Error(_Event, frozen=True, tag="error"):
    error: _ErrorDetail = msgspec.field(default_factory=_ErrorDetail)


_AnyEvent = (
    _BlockDelta
    | _BlockStart
    | _BlockStop
    | _MessageStart
    | _MessageDelta
    | _MessageStop
    | _Ping
    | _Error
)
_decode_event = msgspec.json.Decoder(_AnyEvent).decode
_KNOWN_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)


class _Envelope(msgspec.Struct, frozen=True):
    type: str = ""


_decode_envelope = msgspec.json.Decoder(_Envelope).decode


# -- reading a stream ------------------------------------------------------------------


class _Part:
    """A content block of a streamed message, as far as it has come."""

    __slots__ = ("id", "input", "kind", "name", "pieces")

    def __init__(self, kind: str, id: str = "", name: str = "", input: Any = None) -> None:
        self.kind = kind  # the block's type: "text", "tool_use", "thinking", ...
        self.id = id
        self.name = name
        self.input = input  # a tool_use block's input as it started (usually {})
        self.pieces: list[str] = []  # its text, or its input's JSON, piece by piece


class AnthropicStreamReader:
    """Reads a streamed Messages API response event by event (a ``StreamReader``):
    text to the sink as it comes, the rest kept until the message is complete."""

    def __init__(self, model: Asker, request: ModelRequest, sink: Sink) -> None:
        self.received = 0
        self._model = model
        self._request = request
        self._sink = sink
        self._parts: dict[int, _Part] = {}
        self._started = False
        self._model_name: str | None = None
        self._fresh = 0
        self._output = 0
        self._cache_creation = 0
        self._cache_read = 0
        self._output_final = False  # message_delta's cumulative output_tokens came
        self._stop_reason: str | None = None
        self._complete = False
        # The deltas that brought output (text, tool input, thinking): each is at
        # least one token, however few characters it holds (a digit, a line break).
        self._pieces = 0

    def feed(self, event: str, data: str) -> bool:
        try:
            decoded = _decode_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._unknown(event, data, exc)
            return False
        match decoded:
            case _BlockDelta(index=index, delta=delta):
                self._delta(index, delta)
            case _BlockStart(index=index, content_block=block):
                self._start(index, block)
            case _MessageStart(message=started):
                self._started = True
                self._model_name = started.model
                self._count(started.usage)
            case _MessageDelta(delta=stopping, usage=usage):
                if stopping.stop_reason is not None:
                    self._stop_reason = stopping.stop_reason
                self._count(usage)
                self._output_final = self._output_final or usage.output_tokens is not None
            case _MessageStop():
                self._complete = True
                return True
            case _Error(error=error):
                raise self._server_error(error)
        return False  # content_block_stop, ping

    def _delta(self, index: int, delta: _Delta) -> None:
        part = self._parts.get(index)
        if part is None:
            raise self._malformed(f"a {delta.type or 'delta'} for block {index}, never started")
        kind = delta.type
        if kind == "text_delta":
            text = delta.text
            if part.kind != "text":
                raise self._malformed(f"a text_delta for block {index}, a {part.kind} block")
            self.received += len(text)
            part.pieces.append(text)
            if text:
                self._pieces += 1
                self._sink(text)
        elif kind == "input_json_delta":
            self.received += len(delta.partial_json)
            self._pieces += bool(delta.partial_json)
            if part.kind == "tool_use":
                part.pieces.append(delta.partial_json)
        elif kind == "thinking_delta":
            self.received += len(delta.thinking)
            self._pieces += bool(delta.thinking)
        elif kind == "signature_delta":  # no output token: the thinking's signature
            self.received += len(delta.signature)
        # citations_delta and any newer kind: not text, nothing to keep

    def _start(self, index: int, block: Block) -> None:
        if index in self._parts:
            raise self._malformed(f"block {index} started twice")
        if block.type == "tool_use":
            if not block.name:
                raise self._malformed(f"the tool_use block {index} has no name")
            self._parts[index] = _Part("tool_use", block.id, block.name, block.input)
            return
        part = self._parts[index] = _Part(block.type)
        if block.type == "text" and block.text:
            self.received += len(block.text)
            self._pieces += 1
            part.pieces.append(block.text)
            self._sink(block.text)

    def _count(self, usage: _StreamUsage) -> None:
        """Take the figures an event reports (each one cumulative)."""
        if usage.input_tokens is not None:
            self._fresh = usage.input_tokens
        if usage.output_tokens is not None:
            self._output = usage.output_tokens
        if usage.cache_creation_input_tokens is not None:
            self._cache_creation = usage.cache_creation_input_tokens
        if usage.cache_read_input_tokens is not None:
            self._cache_read = usage.cache_read_input_tokens

    def _unknown(self, event: str, data: str, exc: Exception) -> None:
        """An event that did not decode: skipped if its type is one the API added
        since, else a malformed response."""
        try:
            kind = _decode_envelope(data).type
        except (msgspec.DecodeError, msgspec.ValidationError):
            kind = ""
        if kind and kind not in _KNOWN_EVENTS:
            return
        what = f"event {event!r}" if event else "an event"
        raise self._malformed(f"{what} is not a Messages API stream event: {exc}")

    def _malformed(self, detail: str) -> ProviderError:
        model = self._model
        return malformed(model.provider, model.model, None, detail).spent(self.usage())

    def _server_error(self, error: _ErrorDetail) -> ProviderError:
        kind = error.type or "error"
        said = f"{kind}: {error.message}" if error.message else kind
        retryable = kind in _RETRYABLE_ERRORS
        return ProviderError(
            self._model.provider,
            "the server reported an error part-way through the stream",
            detail=said,  # cut short after its secrets are redacted: see ProviderError
            advice=(
                "retryable (the agent's RetryPolicy decides how often, with backoff)"
                if retryable
                else "not retried"
            ),
            model=self._model.model,
            retryable=retryable,
            kind=_RETRYABLE_ERRORS.get(kind, "rejected"),
        ).spent(self.usage())

    def response(self, status: int) -> ModelResponse:
        model = self._model
        if not self._complete:
            raise self.broken(
                status, f"it ended without message_stop, after {self.received} characters"
            )
        if self._stop_reason is None:  # message_stop ends the stream, not the answer
            raise self.broken(
                status,
                "it ended without a stop_reason (no message_delta said why the message "
                f"ended), after {self.received} characters",
            )
        if not self._started:
            raise model.malformed(status, "the stream has no message_start event")
        texts: list[str] = []
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for index in sorted(self._parts):
            part = self._parts[index]
            if part.kind == "text":
                texts.extend(part.pieces)
            elif part.kind == "tool_use":
                call_id = part.id
                if not call_id or call_id in seen:
                    call_id = model.new_call_id()
                seen.add(call_id)
                calls.append(ToolCall(id=call_id, name=part.name, arguments=_arguments(part)))
        return ModelResponse(
            text="".join(texts),
            tool_calls=tuple(calls),
            usage=usage_of(self._fresh, self._output, self._cache_creation, self._cache_read),
            finish_reason=finish_of(self._stop_reason, bool(calls)),
            model=f"anthropic:{self._model_name}" if self._model_name else model.name,
        )

    def broken(self, status: int, detail: str) -> ProviderError:
        """The error of a stream that ended, or was dropped, before its message was
        complete (``detail`` says how): a retryable cut stream."""
        return self._model.broken(status, detail)

    def usage(self) -> Usage:
        """What the request spent so far: the server's figures where it sent them,
        else the input estimate and the output received (3.5 characters a token, at
        least a token a delta)."""
        if self._output_final:
            output = self._output
        else:
            received = estimate_output_tokens(
                "", self.received, CHARS_PER_TOKEN, self._request.max_tokens, pieces=self._pieces
            )
            output = max(self._output, received)
        if not self._started:
            return Usage(
                input_tokens=self._model.estimate_tokens(self._request),
                output_tokens=output,
                requests=1,
            )
        return usage_of(self._fresh, output, self._cache_creation, self._cache_read)


def _arguments(part: _Part) -> str:
    """A streamed tool call's arguments, as ``parse`` gives them: its input's JSON
    re-encoded (``{}`` when empty), or the JSON text as it came if it does not decode."""
    raw = "".join(part.pieces)
    if raw.strip():
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return raw
    else:
        value = {} if part.input is None else part.input
    return _json_encoder.encode(value).decode()
