"""Token estimates: what a provider's budget pre-check counts before a request, and
what it charges for output a server did not report.

Both are linear in the size of the text: ``ceil(chars / chars_per_token)`` plus
fixed costs per message and per tool, with each provider's own constants. An output
estimate is clamped to the request's ``max_tokens``: it is never "impossible".
"""

from __future__ import annotations

import msgspec

from .._messages import AssistantMessage, ModelRequest, ToolResultMessage, UserMessage
from .._parts import ImageTokens
from ._content import part_estimate

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
    image_tokens: ImageTokens | None = None,
) -> int:
    """A provider's estimate of the input tokens of ``request``, linear in its size.

    ``ceil(chars / chars_per_token)`` over every message's text (tool call names and
    arguments, tool results included), every tool spec (name, description, JSON
    schema) and a native structured output's schema, plus ``per_message`` tokens per
    message, ``per_tool`` per tool, ``tools_preamble`` once when tools are offered and
    ``base`` once; and with ``image_tokens`` (the provider's rule for an image of known
    size), each image and document of a user turn or tool result (``part_estimate``),
    in the same pass.
    """
    chars = 0
    parts = 0
    for message in request.messages:
        chars += len(message.content)
        kind = type(message)
        if kind is AssistantMessage:
            for tool_call in message.tool_calls:  # type: ignore[union-attr]
                chars += len(tool_call.name) + len(tool_call.arguments) + len(tool_call.id)
        elif image_tokens is not None and (kind is UserMessage or kind is ToolResultMessage):
            for part in message.parts:  # type: ignore[union-attr]
                parts += part_estimate(part, image_tokens)
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(_json_encoder.encode(spec.parameters))
    output = request.output_schema
    if output is not None and output.native:
        chars += len(_json_encoder.encode(output.schema))
    tokens = -int(-chars // chars_per_token) if chars else 0
    tokens += base + per_message * len(request.messages) + parts
    if request.tools:
        tokens += tools_preamble + per_tool * len(request.tools)
    return tokens


def estimate_output_tokens(
    text: str,
    arguments: int = 0,
    chars_per_token: float = 4.0,
    cap: int | None = None,
    *,
    pieces: int = 0,
) -> int:
    """Output tokens of a response whose server reported no usage: an estimate.

    ``pieces`` is how many pieces of output a stream brought (its deltas of text,
    arguments, reasoning): each is at least one token, however few characters it
    holds (a server that streams a token a chunk, digits and line breaks, sends
    fewer characters than ``chars_per_token`` a token), so the estimate is at least
    that many.

    ``cap`` is the request's ``max_tokens``: the output the request was granted (and
    its budget reserved). An estimate past it (text of more characters a token than
    ``chars_per_token``, a server that ignores the cap) is the cap: an estimate is
    never taken for usage that cannot be true; only a server's own figures are
    checked that way (``runtime._admission.impossible``).
    """
    chars = len(text) + arguments
    tokens = max(1, -int(-chars // chars_per_token)) if chars else 0
    tokens = max(tokens, pieces)
    return tokens if cap is None or tokens <= cap else cap
