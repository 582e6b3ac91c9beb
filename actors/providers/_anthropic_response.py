"""How an Anthropic Messages API response comes back in one piece, and what reading
one shares with reading a stream (``_anthropic_stream.py``): the message's Structs, its
usage and stop reason. ``AnthropicModel`` (``_anthropic.py``) sends the request and
imports these modules; they never import it.

How the response comes back: the ``text`` blocks joined, the ``tool_use`` blocks as
tool calls (``input`` encoded to JSON text with msgspec; a call without an id, or
repeating one, gets ``fractor_call_N``); usage: input =
``input_tokens + cache_creation_input_tokens + cache_read_input_tokens`` (so input
counts every prompt token, as for OpenAI), cached = ``cache_read_input_tokens``,
output = ``output_tokens``; ``stop_reason`` ``end_turn``/``stop_sequence`` ->
``stop``, ``tool_use`` -> ``tool_calls``, ``max_tokens`` and
``model_context_window_exceeded`` -> ``length``, ``refusal`` -> ``content_filter``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._messages import FinishReason, ModelResponse, ToolCall, Usage
from ._base import Asker

__all__ = ["CHARS_PER_TOKEN", "Block", "finish_of", "read_message", "usage_of"]

#: Claude's tokenizer averages about 3.5 characters per token on English and JSON:
#: what an output estimate divides by (and ``AnthropicModel``'s input estimate).
CHARS_PER_TOKEN = 3.5

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}

_json_encoder = msgspec.json.Encoder()


# -- the response, as much of it as is read ----------------------------------------------


class Block(msgspec.Struct, frozen=True):
    type: str
    text: str = ""
    id: str = ""
    name: str = ""
    input: Any = None


class _WireUsage(msgspec.Struct, frozen=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Message(msgspec.Struct, frozen=True):
    content: list[Block]
    usage: _WireUsage
    stop_reason: str | None = None
    model: str | None = None


_decode_message = msgspec.json.Decoder(_Message).decode


# -- reading it --------------------------------------------------------------------------


def read_message(model: Asker, status: int, body: bytes) -> ModelResponse:
    """The ``ModelResponse`` of a Messages API message's body (``AnthropicModel.parse``)."""
    try:
        message = _decode_message(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise model.malformed(status, f"not a Messages API message: {exc}") from exc
    texts: list[str] = []
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            if not block.name:
                raise model.malformed(status, "a tool_use block has no name")
            call_id = block.id
            if not call_id or call_id in seen:
                call_id = model.new_call_id()
            seen.add(call_id)
            arguments = _json_encoder.encode({} if block.input is None else block.input)
            calls.append(ToolCall(id=call_id, name=block.name, arguments=arguments.decode()))
    wire = message.usage
    return ModelResponse(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=usage_of(
            wire.input_tokens,
            wire.output_tokens,
            wire.cache_creation_input_tokens or 0,
            wire.cache_read_input_tokens or 0,
        ),
        finish_reason=finish_of(message.stop_reason, bool(calls)),
        model=f"anthropic:{message.model}" if message.model else model.name,
    )


def finish_of(stop_reason: str | None, has_calls: bool) -> FinishReason:
    """The finish reason of a ``stop_reason``; an unknown one (or ``stop`` with tool
    calls) is read from the calls."""
    finish = _FINISH.get(stop_reason or "")
    if finish is None or (finish == "stop" and has_calls):
        finish = "tool_calls" if has_calls else "stop"
    return finish


def usage_of(fresh: int, output: int, cache_creation: int, cache_read: int) -> Usage:
    """One request's usage: input counts every prompt token (fresh, written to the
    cache and read from it), cached those read from the cache."""
    return Usage(
        input_tokens=fresh + cache_creation + cache_read,
        output_tokens=output,
        cached_tokens=cache_read,
        requests=1,
    )
