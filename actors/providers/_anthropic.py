"""``AnthropicModel``: Anthropic's Messages API, on the official SDK.

How a ``ModelRequest`` goes out (``POST {base_url}/v1/messages``):

- Every ``SystemMessage`` -> the top-level ``system`` text (several are joined with a
  blank line, in order): the Messages API has no system role.
- ``UserMessage`` -> a ``user`` turn; ``AssistantMessage`` -> an ``assistant`` turn
  of a ``text`` block (when there is text) and one ``tool_use`` block per call (id,
  name, ``input``: the call's JSON arguments decoded to an object).
- ``ToolResultMessage`` -> a ``tool_result`` block (``tool_use_id``, ``content``,
  ``is_error`` when the tool failed) in the next ``user`` turn. Consecutive turns of
  one role are merged into one message, so the results of one step's parallel calls
  share one user message, in call order, ahead of any text.
- ``ToolSpec`` -> ``{"name", "description", "input_schema": <JSON schema>}``.
- ``max_tokens`` is required by the API: the request's cap (the supervisor's
  reservation) clamped to ``max_output_tokens``, or ``max_output_tokens`` itself
  (``DEFAULT_MAX_OUTPUT_TOKENS`` = 8192 unless given) when the request has none.
- ``options`` are extra request fields sent as they are (``temperature``,
  ``tool_choice``, ``metadata``, ...).

How the response comes back: the ``text`` blocks joined, the ``tool_use`` blocks as
tool calls (``input`` encoded to JSON text with msgspec); usage: input =
``input_tokens + cache_creation_input_tokens + cache_read_input_tokens`` (so input
counts every prompt token, as for OpenAI), cached = ``cache_read_input_tokens``,
output = ``output_tokens``; ``stop_reason`` ``end_turn``/``stop_sequence`` ->
``stop``, ``tool_use`` -> ``tool_calls``, ``max_tokens`` and
``model_context_window_exceeded`` -> ``length``, ``refusal`` -> ``content_filter``.

On trio it needs the SDK 0.46 or later (earlier ones run on asyncio only: the model
says so with a ``ProviderError`` instead of failing obscurely).

Not yet: streaming, prompt caching breakpoints (``cache_control``), extended
thinking (thinking blocks are not kept, so it cannot be combined with tool use),
images and documents, server tools. An assistant message with neither text nor tool
calls is left out, and so is blank text (the API refuses both); an empty tool result
is sent without ``content``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar, cast

import msgspec

from .._messages import (
    AssistantMessage,
    FinishReason,
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
    ProviderError,
    ProviderModel,
    estimate_request_tokens,
    output_cap,
    read_raw,
)

__all__ = ["DEFAULT_MAX_OUTPUT_TOKENS", "AnthropicModel"]

#: The output cap sent when the request has none, and the clamp of a larger one: the
#: API requires one, and a budget's headroom can be far larger than a model may
#: produce. 8192 fits every current Claude model (Claude 3 Haiku: pass 4096).
DEFAULT_MAX_OUTPUT_TOKENS = 8_192

# Token estimate constants: Claude's tokenizer averages about 3.5 characters per token
# on English and JSON; each message costs about four tokens of framing; offering tools
# adds the tool-use system prompt (about 350 tokens) and each tool about eight.
_CHARS_PER_TOKEN = 3.5
_PER_MESSAGE = 4
_PER_TOOL = 8
_TOOLS_PREAMBLE = 350

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}

#: The first SDK release whose async client runs on trio.
_FIRST_TRIO_RELEASE = (0, 46)

_json_encoder = msgspec.json.Encoder()
_decode_object = msgspec.json.Decoder(dict[str, Any]).decode


# -- the response, as much of it as is read ----------------------------------------------


class _Block(msgspec.Struct, frozen=True):
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
    content: list[_Block]
    usage: _WireUsage
    stop_reason: str | None = None
    model: str | None = None


_decode_message = msgspec.json.Decoder(_Message).decode


class AnthropicModel(ProviderModel):
    """A Claude model behind Anthropic's Messages API.

    ``AnthropicModel("claude-sonnet-4-5")`` talks to Anthropic with the key in
    ``$ANTHROPIC_API_KEY``; ``base_url`` (default ``$ANTHROPIC_BASE_URL``, then
    Anthropic's) points it at another server that speaks the Messages API (a
    gateway, a proxy). ``timeout`` is the seconds one request may
    take; ``options`` are extra request fields sent with every request.
    ``max_output_tokens`` is the output cap sent when the request has none, and
    clamps a larger one.

    ``name`` is ``"anthropic:<model>"`` (for example ``"anthropic:claude-sonnet-4-5"``):
    the key of the model's prices in ``Runtime(prices=...)``. The SDK's own retries
    are off; give the agent a ``RetryPolicy``. Close the model with ``aclose()`` (or
    use it as an async context manager).
    """

    provider: ClassVar[str] = "anthropic"
    env_var: ClassVar[str] = "ANTHROPIC_API_KEY"
    base_url_env: ClassVar[str] = "ANTHROPIC_BASE_URL"
    default_base_url: ClassVar[str] = "https://api.anthropic.com"
    reserved: ClassVar[frozenset[str]] = frozenset(
        {"model", "messages", "system", "tools", "max_tokens", "stream"}
    )

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        options: Mapping[str, Any] | None = None,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
    ) -> None:
        if cast(object, max_output_tokens) is None:
            raise ValueError(
                "anthropic: max_output_tokens may not be None: the Messages API requires "
                "an output cap"
            )
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            options=options,
            max_output_tokens=max_output_tokens,
        )

    def estimate_tokens(self, request: ModelRequest) -> int:
        """About 3.5 characters per token, four tokens per message, and when tools
        are offered 350 for the tool-use system prompt and eight per tool on top of
        its name, description and schema."""
        return estimate_request_tokens(
            request,
            chars_per_token=_CHARS_PER_TOKEN,
            per_message=_PER_MESSAGE,
            per_tool=_PER_TOOL,
            tools_preamble=_TOOLS_PREAMBLE,
        )

    def create_client(self, sdk: ModuleType) -> Any:
        check_event_loop(str(getattr(sdk, "__version__", "")))
        return sdk.AsyncAnthropic(
            api_key=self._api_key,
            base_url=self._base_url,
            timeout=self._timeout,
            max_retries=0,
        )

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request``."""
        system: list[str] = []
        turns: list[dict[str, Any]] = []

        def add(role: str, block: dict[str, Any]) -> None:
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"].append(block)
            else:
                turns.append({"role": role, "content": [block]})

        for message in request.messages:
            match message:
                case SystemMessage(content=content):
                    if content:
                        system.append(content)
                case UserMessage(content=content):
                    add("user", {"type": "text", "text": content})
                case AssistantMessage(content=content, tool_calls=tool_calls):
                    if content.strip():  # the API refuses blank text blocks
                        add("assistant", {"type": "text", "text": content})
                    for c in tool_calls:
                        add(
                            "assistant",
                            {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)},
                        )
                case ToolResultMessage(call_id=call_id, content=content, is_error=is_error):
                    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
                    if content:  # optional: an empty result is sent without it
                        block["content"] = content
                    if is_error:
                        block["is_error"] = True
                    add("user", block)
        cap = output_cap(request.max_tokens, self._max_output_tokens)
        kwargs: dict[str, Any] = {
            "model": self._model,
            "max_tokens": cap,
            "messages": turns,
            "timeout": self._timeout,
        }
        if system:
            kwargs["system"] = "\n\n".join(system)
        if request.tools:
            kwargs["tools"] = [_tool(spec) for spec in request.tools]
        if self._options:
            kwargs["extra_body"] = dict(self._options)
        return kwargs

    async def send(self, client: Any, request: ModelRequest) -> tuple[int, bytes]:
        raw = await client.messages.with_raw_response.create(**self.body(request))
        return await read_raw(raw)

    def parse(self, status: int, body: bytes, request: ModelRequest) -> ModelResponse:
        try:
            message = _decode_message(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise self.malformed(status, f"not a Messages API message: {exc}") from exc
        texts: list[str] = []
        calls: list[ToolCall] = []
        seen: set[str] = set()
        for block in message.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                if not block.name:
                    raise self.malformed(status, "a tool_use block has no name")
                call_id = block.id
                if not call_id or call_id in seen:
                    call_id = self.new_call_id()
                seen.add(call_id)
                arguments = _json_encoder.encode({} if block.input is None else block.input)
                calls.append(ToolCall(id=call_id, name=block.name, arguments=arguments.decode()))
        finish = _FINISH.get(message.stop_reason or "")
        if finish is None or (finish == "stop" and calls):
            finish = "tool_calls" if calls else "stop"
        wire = message.usage
        cache_read = wire.cache_read_input_tokens or 0
        input_tokens = wire.input_tokens + (wire.cache_creation_input_tokens or 0) + cache_read
        return ModelResponse(
            text="".join(texts),
            tool_calls=tuple(calls),
            usage=Usage(
                input_tokens=input_tokens,
                output_tokens=wire.output_tokens,
                cached_tokens=cache_read,
                requests=1,
            ),
            finish_reason=finish,
            model=f"anthropic:{message.model}" if message.model else self.name,
        )


def check_event_loop(sdk_version: str) -> None:
    """Refuse trio with an SDK older than 0.46, which runs on asyncio only.

    Before 0.46 the SDK's async client ran a blocking helper of its first request
    through ``asyncio.to_thread``, which fails on trio ("no running event loop").
    From 0.46 on it runs on trio too (httpx and anyio underneath).
    """
    try:
        major, minor = (int(part) for part in sdk_version.split(".")[:2])
    except ValueError:
        return
    if (major, minor) >= _FIRST_TRIO_RELEASE:
        return
    import sniffio  # a dependency of every anthropic release

    if sniffio.current_async_library() == "trio":
        raise ProviderError(
            "anthropic",
            f"the installed anthropic SDK {sdk_version} runs on asyncio only, and this is trio",
            advice="upgrade it (pip install 'anthropic>=0.46') or run on asyncio",
        )


def _input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object a ``tool_use`` block carries.

    Arguments that are not a JSON object (a model's broken output, kept in the
    history) are sent as ``{"_arguments": "<the text>"}``: the API takes only objects.
    """
    try:
        return _decode_object(call.arguments or "{}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {"_arguments": call.arguments}


def _tool(spec: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": spec.name, "input_schema": spec.parameters}
    if spec.description:
        tool["description"] = spec.description
    return tool
