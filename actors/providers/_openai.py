"""``OpenAIModel``: the OpenAI chat completions wire format, on the official SDK.

It speaks to OpenAI itself and to every server that implements the same endpoint
(``POST {base_url}/chat/completions``): vLLM, Ollama, llama.cpp's server, LM Studio.

How a ``ModelRequest`` goes out:

- ``SystemMessage`` -> ``{"role": "system"}``; ``UserMessage`` -> ``{"role": "user"}``.
- ``AssistantMessage`` -> ``{"role": "assistant", "content": text,
  "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}``:
  the execution buffer's calls, several in one turn, with their ids. The content is
  a string even when empty, never null: llama-cpp-python's server answers an
  assistant message with ``"content": null`` with HTTP 500 (every native tool loop
  then fails at its second request); OpenAI, vLLM, Ollama and llama.cpp take "".
- ``ToolResultMessage`` -> ``{"role": "tool", "tool_call_id": id, "content": text}``.
  The wire format has no error flag: an error result says so in its text.
- ``ToolSpec`` -> ``{"type": "function", "function": {"name", "description",
  "parameters": <JSON schema>}}``.
- ``max_tokens`` (the supervisor's reservation) -> ``max_completion_tokens`` for
  OpenAI itself, ``max_tokens`` for a server given by ``base_url`` (what local
  servers read; choose with ``max_tokens_param``), clamped to ``max_output_tokens``.
  Without a cap in the request, none is sent.
- ``options`` are extra request fields sent as they are (``temperature``, ``seed``,
  ``tool_choice``, ``parallel_tool_calls``, ``reasoning_effort``, ...).

How the response comes back: the first choice's text (a refusal's text when there is
no content) and tool calls (arguments kept as JSON text; a call without an id, or
repeating one, gets ``fractor_call_N``); usage from ``prompt_tokens``,
``completion_tokens`` and ``prompt_tokens_details.cached_tokens`` (estimated, like the
pre-check, when a server reports none); ``finish_reason`` ``stop``, ``tool_calls``
(also ``function_call``, and ``stop`` with tool calls), ``length``, ``content_filter``.

Not yet: streaming, images and other content parts in requests, structured outputs,
the Responses API.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar, Literal

import msgspec

from .._messages import (
    AssistantMessage,
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from ._base import (
    ProviderModel,
    estimate_output_tokens,
    estimate_request_tokens,
    output_cap,
    read_raw,
)

__all__ = ["DEFAULT_MAX_OUTPUT_TOKENS", "OpenAIModel"]

#: The default clamp of the output cap sent: the largest that every current OpenAI
#: chat model accepts. A budget's headroom can be far larger than a model may produce.
DEFAULT_MAX_OUTPUT_TOKENS = 16_384

# Token estimate constants: OpenAI's tokenizers average about four characters per
# token on English and JSON; each message costs three tokens of framing and the reply
# three more; each function spec about eight on top of its text.
_CHARS_PER_TOKEN = 4.0
_PER_MESSAGE = 3
_REPLY_PRIMING = 3
_PER_TOOL = 8

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}

_json_encoder = msgspec.json.Encoder()


# -- the response, as much of it as is read ----------------------------------------------


class _Function(msgspec.Struct, frozen=True):
    name: str
    # JSON text on the wire; a few servers send the object itself.
    arguments: str | dict[str, Any] | None = None


class _WireToolCall(msgspec.Struct, frozen=True):
    function: _Function
    id: str | None = None


class _WireMessage(msgspec.Struct, frozen=True):
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_WireToolCall] | None = None
    refusal: str | None = None


class _Choice(msgspec.Struct, frozen=True):
    message: _WireMessage
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, frozen=True):
    cached_tokens: int | None = None


class _WireUsage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _PromptDetails | None = None


class _Completion(msgspec.Struct, frozen=True):
    choices: list[_Choice]
    usage: _WireUsage | None = None
    model: str | None = None


_decode_completion = msgspec.json.Decoder(_Completion).decode


class OpenAIModel(ProviderModel):
    """A model behind the OpenAI chat completions API, or an OpenAI-compatible server.

    ``OpenAIModel("gpt-4.1-mini")`` talks to OpenAI with the key in
    ``$OPENAI_API_KEY``; ``OpenAIModel("llama3.2", base_url="http://localhost:11434/v1")``
    to a local server (a placeholder key is sent when none is set; the base URL
    defaults to ``$OPENAI_BASE_URL``, then OpenAI's). ``timeout`` is
    the seconds one request may take; ``options`` are extra request fields sent with
    every request. ``max_output_tokens`` clamps the output cap sent (``None``: no
    clamp); ``max_tokens_param`` names the field it goes in (default:
    ``max_completion_tokens`` for OpenAI, ``max_tokens`` with a ``base_url``).

    ``name`` is ``"openai:<model>"`` (for example ``"openai:gpt-4.1-mini"``), also for
    a local server: it is the key of the model's prices in ``Runtime(prices=...)``.
    The SDK's own retries are off; give the agent a ``RetryPolicy``. Close the model
    with ``aclose()`` (or use it as an async context manager).
    """

    provider: ClassVar[str] = "openai"
    env_var: ClassVar[str] = "OPENAI_API_KEY"
    base_url_env: ClassVar[str] = "OPENAI_BASE_URL"
    default_base_url: ClassVar[str] = "https://api.openai.com/v1"
    reserved: ClassVar[frozenset[str]] = frozenset(
        {
            "model",
            "messages",
            "tools",
            "functions",
            "max_tokens",
            "max_completion_tokens",
            "n",
            "stream",
            "stream_options",
        }
    )

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        options: Mapping[str, Any] | None = None,
        max_output_tokens: int | None = DEFAULT_MAX_OUTPUT_TOKENS,
        max_tokens_param: Literal["max_tokens", "max_completion_tokens"] | None = None,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            options=options,
            max_output_tokens=max_output_tokens,
        )
        if max_tokens_param is None:
            max_tokens_param = "max_tokens" if self._base_url else "max_completion_tokens"
        elif max_tokens_param not in ("max_tokens", "max_completion_tokens"):
            raise ValueError(
                "openai: max_tokens_param must be 'max_tokens' or 'max_completion_tokens', "
                f"got {max_tokens_param!r}"
            )
        self._max_tokens_param = max_tokens_param

    def estimate_tokens(self, request: ModelRequest) -> int:
        """About four characters per token, three tokens per message and three for
        the reply, eight per tool on top of its name, description and schema."""
        return estimate_request_tokens(
            request,
            chars_per_token=_CHARS_PER_TOKEN,
            per_message=_PER_MESSAGE,
            per_tool=_PER_TOOL,
            base=_REPLY_PRIMING,
        )

    def create_client(self, sdk: ModuleType) -> Any:
        return sdk.AsyncOpenAI(
            api_key=self._api_key,
            base_url=self._base_url,
            timeout=self._timeout,
            max_retries=0,
        )

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``."""
        kwargs: dict[str, Any] = {
            "model": self._model,
            "messages": [_message(message) for message in request.messages],
        }
        if request.tools:
            kwargs["tools"] = [_tool(spec) for spec in request.tools]
        extra = dict(self._options)
        if request.max_tokens is not None:
            extra[self._max_tokens_param] = output_cap(request.max_tokens, self._max_output_tokens)
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    async def send(self, client: Any, request: ModelRequest) -> tuple[int, bytes]:
        raw = await client.chat.completions.with_raw_response.create(**self.body(request))
        return await read_raw(raw)

    def parse(self, status: int, body: bytes, request: ModelRequest) -> ModelResponse:
        try:
            completion = _decode_completion(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise self.malformed(status, f"not a chat completion: {exc}") from exc
        if not completion.choices:
            raise self.malformed(status, "the completion has no choices")
        choice = completion.choices[0]
        message = choice.message
        text = _text(message.content) or message.refusal or ""
        calls = self._calls(message.tool_calls or ())
        finish = _FINISH.get(choice.finish_reason or "")
        if finish is None or (finish == "stop" and calls):
            finish = "tool_calls" if calls else "stop"
        wire = completion.usage
        if wire is None:
            arguments = sum(len(c.name) + len(c.arguments) for c in calls)
            usage = Usage(
                input_tokens=self.estimate_tokens(request),
                output_tokens=estimate_output_tokens(text, arguments, _CHARS_PER_TOKEN),
                requests=1,
            )
        else:
            details = wire.prompt_tokens_details
            usage = Usage(
                input_tokens=wire.prompt_tokens,
                output_tokens=wire.completion_tokens,
                cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
                requests=1,
            )
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            finish_reason=finish,
            model=f"openai:{completion.model}" if completion.model else self.name,
        )

    def _calls(self, wire_calls: list[_WireToolCall] | tuple[()]) -> tuple[ToolCall, ...]:
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
                call_id = self.new_call_id()
            seen.add(call_id)
            calls.append(ToolCall(id=call_id, name=wire.function.name, arguments=arguments))
        return tuple(calls)


def _message(message: Message) -> dict[str, Any]:
    match message:
        case SystemMessage(content=content):
            return {"role": "system", "content": content}
        case UserMessage(content=content):
            return {"role": "user", "content": content}
        case AssistantMessage(content=content, tool_calls=()):
            return {"role": "assistant", "content": content}
        case AssistantMessage(content=content, tool_calls=tool_calls):
            return {
                "role": "assistant",
                "content": content,  # "" and never null: see the module's docstring
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in tool_calls
                ],
            }
        case ToolResultMessage(call_id=call_id, content=content):
            return {"role": "tool", "tool_call_id": call_id, "content": content}
    raise TypeError(f"not a chat message: {message!r}")  # pragma: no cover


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    # Content parts, as some compatible servers answer: keep the text ones.
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")
