"""What the provider tests need of each wire format: builders of the bodies a server
sends, the model under test pointed at a loopback server, and a ``Wire`` per
provider for the contract both providers share (``test_provider_contract.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fractor.actors import AnthropicModel, OpenAIModel

from ..loopback import LoopbackServer, Received

# -- OpenAI chat completions -------------------------------------------------------------

OPENAI_KEY = "sk-test-not-a-real-key"


def completion(
    text: str | None = None,
    calls: tuple[dict[str, Any], ...] = (),
    *,
    finish: str | None = "",
    prompt: int = 11,
    output: int = 7,
    cached: int | None = None,
) -> dict[str, Any]:
    """A chat completion as OpenAI sends it (``finish=""``: what OpenAI would say)."""
    if finish == "":
        finish = "tool_calls" if calls else "stop"
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model-2025",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def wire_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def openai_error(message: str, code: str = "error") -> dict[str, Any]:
    return {"error": {"message": message, "type": code, "code": code}}


def openai_model(server: LoopbackServer, **kwargs: Any) -> OpenAIModel:
    kwargs.setdefault("api_key", OPENAI_KEY)
    kwargs.setdefault("timeout", 5.0)
    return OpenAIModel("test-model", base_url=f"{server.url}/v1", **kwargs)


# -- Anthropic Messages API --------------------------------------------------------------

ANTHROPIC_KEY = "sk-ant-test-not-a-real-key"


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def message(
    *blocks: dict[str, Any],
    stop: str | None = "",
    input_tokens: int = 11,
    output_tokens: int = 7,
    cache_read: int | None = None,
    cache_creation: int | None = None,
) -> dict[str, Any]:
    """A Messages API message as Anthropic sends it (``stop=""``: what it would say)."""
    if stop == "":
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    usage: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if cache_read is not None:
        usage["cache_read_input_tokens"] = cache_read
    if cache_creation is not None:
        usage["cache_creation_input_tokens"] = cache_creation
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test-2025",
        "content": list(blocks),
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def anthropic_error(kind: str, text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": text}}


def anthropic_model(server: LoopbackServer, **kwargs: Any) -> AnthropicModel:
    kwargs.setdefault("api_key", ANTHROPIC_KEY)
    kwargs.setdefault("timeout", 5.0)
    return AnthropicModel("claude-test", base_url=server.url, **kwargs)


def sent_anthropic_key(received: Received) -> str:
    """The key a request carried, in whichever header this SDK version uses."""
    if "x-api-key" in received.headers:
        return received.headers["x-api-key"]
    return received.headers.get("authorization", "").removeprefix("Bearer ")


def _anthropic_release() -> tuple[int, int]:
    import anthropic

    major, minor = anthropic.__version__.split(".")[:2]
    return int(major), int(minor)


#: Before 0.46 the SDK's async client runs on asyncio only (``asyncio.to_thread``).
ANTHROPIC_TRIO_UNSUPPORTED = _anthropic_release() < (0, 46)


# -- one contract, two wires -------------------------------------------------------------

Provider = OpenAIModel | AnthropicModel

#: (status, body, retryable, what the message says); a str body is sent as text.
HttpError = tuple[int, dict[str, Any] | str, bool, str]


@dataclass(frozen=True)
class Wire:
    """One provider as the contract tests drive it."""

    provider: str  # as ProviderError.provider and the messages name it
    model_name: str  # of the model ``model`` makes
    key: str
    model_class: Callable[..., Provider]  # the class: (name, **options)
    model: Callable[..., Provider]  # (server, **kwargs): pointed at the server
    base_url: Callable[[str], str]  # the endpoint below a server's root URL
    reply: Callable[[str], dict[str, Any]]  # a final answer with this text
    sent_key: Callable[[Received], str]
    key_variable: str  # the environment variable the key is read from
    sdk: str  # the module of the SDK (and the name of the extra)
    http_errors: list[HttpError]
    #: (response text, what the "malformed" message names)
    malformed: list[tuple[str, str]]
    #: Retryable errors (status, body) an agent's retry policy gets past.
    transient: list[tuple[int, dict[str, Any]]]
    invalid_key: dict[str, Any]  # the body of a 401
    server_error: dict[str, Any]  # the body of a 500
    #: Whether the error's type (not only its message) is in the ProviderError.
    names_error_type: bool


OPENAI = Wire(
    provider="openai",
    model_name="test-model",
    key=OPENAI_KEY,
    model_class=OpenAIModel,
    model=openai_model,
    base_url=lambda root: f"{root}/v1",
    reply=lambda value: completion(value),
    sent_key=lambda received: received.headers["authorization"].removeprefix("Bearer "),
    key_variable="OPENAI_API_KEY",
    sdk="openai",
    http_errors=[
        (400, openai_error("context too long", "invalid_request_error"), False, "rejected"),
        (401, openai_error("Incorrect API key", "invalid_api_key"), False, "check the key"),
        (403, openai_error("no access", "permission_denied"), False, "check the key"),
        (404, openai_error("model not found", "model_not_found"), False, "check the model name"),
        (408, openai_error("timeout"), True, "retryable"),
        (409, openai_error("conflict"), True, "retryable"),
        (413, openai_error("too large"), False, "too large"),
        (422, openai_error("bad"), False, "rejected"),
        (429, openai_error("Rate limit reached", "rate_limit_exceeded"), True, "rate limited"),
        (429, openai_error("You exceeded your quota", "insufficient_quota"), False, "billing"),
        (500, openai_error("boom", "server_error"), True, "server"),
        (502, "<html>Bad gateway</html>", True, "server"),
        (503, openai_error("overloaded"), True, "server"),
    ],
    malformed=[
        ("{not json", "malformed"),
        ('{"id": "x", "object": "chat.completion"}', "choices"),
        ('{"choices": []}', "no choices"),
        ('{"choices": [{"index": 0, "message": {"tool_calls": [{"id": "x"}]}}]}', "function"),
        ('{"choices": [{"message": {"content": 5}}]}', "content"),
    ],
    transient=[(429, openai_error("Rate limit reached", "rate_limit_exceeded"))],
    invalid_key=openai_error("Incorrect API key provided", "invalid_api_key"),
    server_error=openai_error("boom", "server_error"),
    names_error_type=False,
)

ANTHROPIC = Wire(
    provider="anthropic",
    model_name="claude-test",
    key=ANTHROPIC_KEY,
    model_class=AnthropicModel,
    model=anthropic_model,
    base_url=lambda root: root,
    reply=lambda value: message(text(value)),
    sent_key=sent_anthropic_key,
    key_variable="ANTHROPIC_API_KEY",
    sdk="anthropic",
    http_errors=[
        (400, anthropic_error("invalid_request_error", "prompt is too long"), False, "context"),
        (401, anthropic_error("authentication_error", "invalid x-api-key"), False, "check the key"),
        (403, anthropic_error("permission_error", "no access"), False, "check the key"),
        (404, anthropic_error("not_found_error", "model: nope"), False, "check the model name"),
        (413, anthropic_error("request_too_large", "too large"), False, "too large"),
        (429, anthropic_error("rate_limit_error", "rate limited"), True, "rate limited"),
        (500, anthropic_error("api_error", "internal"), True, "server"),
        (529, anthropic_error("overloaded_error", "Overloaded"), True, "overloaded"),
        (503, "upstream connect error", True, "server"),
    ],
    malformed=[
        ("{not json", "malformed"),
        ('{"type": "message", "usage": {"input_tokens": 1}}', "content"),
        ('{"type": "message", "content": []}', "usage"),
        ('{"content": [{"type": "tool_use", "id": "x", "input": {}}], "usage": {}}', "name"),
        ('{"content": [{"text": "no type"}], "usage": {}}', "type"),
    ],
    transient=[
        (529, anthropic_error("overloaded_error", "Overloaded")),
        (429, anthropic_error("rate_limit_error", "slow down")),
    ],
    invalid_key=anthropic_error("authentication_error", "invalid x-api-key"),
    server_error=anthropic_error("api_error", "Internal server error"),
    names_error_type=True,
)


def stream_opening(wire: Wire, *, text_block: bool = False) -> list[Any]:
    """The first events of a streamed answer ("Hel"), before whatever a test sends
    next: the server has answered and goes on. Anthropic's text arrives in a content
    block: ``text_block`` opens one and sends the text (OpenAI's is its first chunk)."""
    if wire.provider == "openai":
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
        return [{**chunk, "choices": [{"index": 0, "delta": {"content": "Hel"}}]}]
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 40, "output_tokens": 1},
        },
    }
    if not text_block:
        return [("message_start", start)]
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "Hel"},
    }
    return [
        ("message_start", start),
        ("content_block_start", block),
        ("content_block_delta", delta),
    ]
