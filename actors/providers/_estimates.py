"""Token estimates: what a provider's budget pre-check counts before a request, and
what it charges for output a server did not report.

Both are linear in the size of the text: ``ceil(chars / chars_per_token)`` plus
fixed costs per message and per tool, with each provider's own constants.
"""

from __future__ import annotations

import msgspec

from .._messages import AssistantMessage, ModelRequest

__all__ = ["estimate_output_tokens", "estimate_request_tokens"]

_json_encoder = msgspec.json.Encoder()


def estimate_request_tokens(
    request: ModelRequest,
    *,
    chars_per_token: float,
    per_message: int,
    per_tool: int,
    base: int = 0,
    tools_preamble: int = 0,
) -> int:
    """A provider's estimate of the input tokens of ``request``, linear in its size.

    ``ceil(chars / chars_per_token)`` over every message's text (tool call names and
    arguments, tool results included), every tool spec (name, description, JSON
    schema) and a native structured output's schema, plus ``per_message`` tokens per
    message, ``per_tool`` per tool, ``tools_preamble`` once when tools are offered and
    ``base`` once.
    """
    chars = 0
    for message in request.messages:
        chars += len(message.content)
        if type(message) is AssistantMessage:
            for tool_call in message.tool_calls:
                chars += len(tool_call.name) + len(tool_call.arguments) + len(tool_call.id)
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(_json_encoder.encode(spec.parameters))
    output = request.output_schema
    if output is not None and output.native:
        chars += len(_json_encoder.encode(output.schema))
    tokens = -int(-chars // chars_per_token) if chars else 0
    tokens += base + per_message * len(request.messages)
    if request.tools:
        tokens += tools_preamble + per_tool * len(request.tools)
    return tokens


def estimate_output_tokens(text: str, arguments: int = 0, chars_per_token: float = 4.0) -> int:
    """Output tokens of a response whose server reported no usage: an estimate."""
    chars = len(text) + arguments
    return max(1, -int(-chars // chars_per_token)) if chars else 0
