"""How an OpenAI chat completion comes back in one piece, and what reading one shares
with reading a stream (``_openai_stream.py``): the response's Structs, its tool calls,
usage and finish reason. ``OpenAIModel`` (``_openai.py``) sends the request and
imports these modules; they never import it.

How the response comes back: the first choice's text (a refusal's text when there is
no content) and tool calls (arguments kept as JSON text; a call without an id, or
repeating one, gets ``fractor_call_N``); usage from ``prompt_tokens``,
``completion_tokens`` and ``prompt_tokens_details.cached_tokens`` (estimated, like the
pre-check, when a server reports none); ``finish_reason`` ``stop``, ``tool_calls``
(also ``function_call``, and ``stop`` with tool calls), ``length``, ``content_filter``;
any other (``eos``, ``end_turn``, ...) is read from the calls: ``tool_calls`` when
there are some, else ``stop``. A thinking model's ``reasoning_content`` (or
``reasoning``) is never text; it counts in an output estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .._messages import FinishReason, ModelRequest, ModelResponse, ToolCall, Usage
from ._base import Asker
from ._estimates import estimate_output_tokens

__all__ = [
    "CHARS_PER_TOKEN",
    "Function",
    "WireToolCall",
    "WireUsage",
    "answer",
    "content_text",
    "read_completion",
    "reasoning_text",
    "tool_calls_of",
    "usage_of",
]

#: OpenAI's tokenizers average about four characters per token on English and JSON:
#: what an output estimate divides by (and ``OpenAIModel``'s input estimate).
CHARS_PER_TOKEN = 4.0

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}

_json_encoder = msgspec.json.Encoder()


# -- the response, as much of it as is read ----------------------------------------------


class Function(msgspec.Struct, frozen=True):
    name: str
    # JSON text on the wire; a few servers send the object itself.
    arguments: str | dict[str, Any] | None = None


class WireToolCall(msgspec.Struct, frozen=True):
    function: Function
    id: str | None = None


class _WireMessage(msgspec.Struct, frozen=True):
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[WireToolCall] | None = None
    refusal: str | None = None
    # The reasoning of a thinking model, as llama.cpp, vLLM, DeepSeek, Ollama and LM
    # Studio send it (never text; counted in an output estimate). Any: a few send
    # an object rather than a string.
    reasoning_content: Any = None
    reasoning: Any = None


class _Choice(msgspec.Struct, frozen=True):
    message: _WireMessage
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, frozen=True):
    cached_tokens: int | None = None


class WireUsage(msgspec.Struct, frozen=True):
    # null or missing: the server did not count (the usage is estimated then)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None

    @property
    def counted(self) -> bool:
        return self.prompt_tokens is not None or self.completion_tokens is not None


class _Completion(msgspec.Struct, frozen=True):
    choices: list[_Choice]
    usage: WireUsage | None = None
    model: str | None = None


_decode_completion = msgspec.json.Decoder(_Completion).decode


# -- reading it --------------------------------------------------------------------------


def read_completion(model: Asker, status: int, body: bytes, request: ModelRequest) -> ModelResponse:
    """The ``ModelResponse`` of a chat completion's body (``OpenAIModel.parse``)."""
    try:
        completion = _decode_completion(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise model.malformed(status, f"not a chat completion: {exc}") from exc
    if not completion.choices:
        raise model.malformed(status, "the completion has no choices")
    choice = completion.choices[0]
    message = choice.message
    text = content_text(message.content) or message.refusal or ""
    calls = tool_calls_of(model, message.tool_calls or ())
    reasoning = reasoning_text(message.reasoning_content, message.reasoning)
    return answer(
        model,
        request,
        text,
        calls,
        finish_reason=choice.finish_reason,
        wire=completion.usage,
        reasoning=len(reasoning),
        model_name=completion.model,
    )


def answer(
    model: Asker,
    request: ModelRequest,
    text: str,
    calls: tuple[ToolCall, ...],
    *,
    finish_reason: str | None,
    wire: WireUsage | None,
    reasoning: int,
    model_name: str | None,
    pieces: int = 0,
) -> ModelResponse:
    """The ``ModelResponse`` of a completion, read in one piece or streamed (in
    ``pieces`` chunks of output: without usage, at least a token each)."""
    finish = _FINISH.get(finish_reason or "")
    if finish is None or (finish == "stop" and calls):
        finish = "tool_calls" if calls else "stop"
    if wire is None or not wire.counted:
        arguments = sum(len(c.name) + len(c.arguments) for c in calls) + reasoning
        usage = Usage(
            input_tokens=model.estimate_tokens(request),
            output_tokens=estimate_output_tokens(
                text, arguments, CHARS_PER_TOKEN, request.max_tokens, pieces=pieces
            ),
            requests=1,
        )
    else:
        usage = usage_of(wire)
    return ModelResponse(
        text=text,
        tool_calls=calls,
        usage=usage,
        finish_reason=finish,
        model=f"openai:{model_name}" if model_name else model.name,
    )


def tool_calls_of(model: Asker, wire_calls: Sequence[WireToolCall]) -> tuple[ToolCall, ...]:
    """The tool calls of a completion: arguments as JSON text (``{}`` when none), a
    new id for a call without one or repeating one."""
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for wire in wire_calls:
        arguments = wire.function.arguments
        if arguments is None or arguments == "":
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = _json_encoder.encode(arguments).decode()
        call_id = wire.id or ""
        if not call_id or call_id in seen:
            call_id = model.new_call_id()
        seen.add(call_id)
        calls.append(ToolCall(id=call_id, name=wire.function.name, arguments=arguments))
    return tuple(calls)


def content_text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    # Content parts, as some compatible servers answer: keep the text ones.
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


def reasoning_text(*fields: Any) -> str:
    """The reasoning text of a message or delta: the first of its fields that is a
    string (vLLM has sent the same text in both ``reasoning_content`` and
    ``reasoning``: it is counted once)."""
    for field in fields:
        if isinstance(field, str) and field:
            return field
    return ""


def usage_of(wire: WireUsage) -> Usage:
    details = wire.prompt_tokens_details
    return Usage(
        input_tokens=wire.prompt_tokens or 0,
        output_tokens=wire.completion_tokens or 0,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        requests=1,
    )
