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
tool calls (``input`` encoded to JSON text with msgspec; a call without an id, or
repeating one, gets ``fractor_call_N``); usage: input =
``input_tokens + cache_creation_input_tokens + cache_read_input_tokens`` (so input
counts every prompt token, as for OpenAI), cached = ``cache_read_input_tokens``,
output = ``output_tokens``; ``stop_reason`` ``end_turn``/``stop_sequence`` ->
``stop``, ``tool_use`` -> ``tool_calls``, ``max_tokens`` and
``model_context_window_exceeded`` -> ``length``, ``refusal`` -> ``content_filter``.

Streamed (``stream``; ``streaming`` is True unless the model was built with
``stream=False``), the request says ``"stream": true`` and the answer comes as
server-sent events, each named by an ``event:`` line and typed by its data's ``type``:

- ``message_start``: the model and the usage so far (the input figures, counted as
  above); ``ping``: nothing.
- ``content_block_start`` (``index``, ``content_block``): a ``text`` block, a
  ``tool_use`` block (``id``, ``name``), or another kind (``thinking``,
  ``redacted_thinking``, server tools) that is read past.
- ``content_block_delta`` (``index``, ``delta``): ``text_delta`` text goes to the
  sink at once; ``input_json_delta`` pieces of a tool call's ``partial_json`` are
  joined per block and decoded when the message is complete (re-encoded as above, so
  the response is the one ``request`` returns; JSON that does not decode, a call cut
  off by ``max_tokens``, is kept as it came); ``thinking_delta`` and
  ``signature_delta`` only count as output received. ``content_block_stop`` closes
  a block.
- ``message_delta``: the ``stop_reason`` and the cumulative ``output_tokens`` (newer
  servers repeat the input figures there too: they win); ``message_stop``: the end.
- ``error`` (``{"type": "error", "error": {"type", "message"}}``): the server failed
  part-way; a ``ProviderError`` with its words, retryable for
  ``overloaded_error``, ``api_error``, ``rate_limit_error`` and ``timeout_error``.
- Events of a type not listed here are skipped (the API may add some); data that is
  not an event is a malformed response. A stream that ends before ``message_stop``
  has broken off (retryable). A failed stream's error carries the usage reported so
  far, or the input estimate and an estimate of the output received.

On trio it needs the SDK 0.46 or later (earlier ones run on asyncio only: the model
says so with a ``ProviderError`` instead of failing obscurely).

Not yet: prompt caching breakpoints (``cache_control``), extended thinking (thinking
blocks are not kept, so it cannot be combined with tool use), images and documents,
server tools. An assistant message with neither text nor tool calls is left out, and
so is blank text (the API refuses both); an empty tool result is sent without
``content``.
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
from .._models import Sink
from ._base import (
    ProviderError,
    ProviderModel,
    estimate_output_tokens,
    estimate_request_tokens,
    malformed,
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

#: The types of a stream's ``error`` event worth sending the request again for.
_RETRYABLE_ERRORS = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
)
#: How much of a server's error message a ``ProviderError`` quotes.
_MAX_SAID = 300

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
    content_block: _Block


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


class AnthropicModel(ProviderModel):
    """A Claude model behind Anthropic's Messages API.

    ``AnthropicModel("claude-sonnet-4-5")`` talks to Anthropic with the key in
    ``$ANTHROPIC_API_KEY``; ``base_url`` (default ``$ANTHROPIC_BASE_URL``, then
    Anthropic's) points it at another server that speaks the Messages API (a
    gateway, a proxy). ``timeout`` is the seconds one request may take (streamed:
    the seconds to wait for each piece); ``options`` are extra request fields sent
    with every request. ``max_output_tokens`` is the output cap sent when the
    request has none, and clamps a larger one. ``stream`` says whether agents
    stream its answers (``streaming``); ``stream`` itself works either way.

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
        stream: bool = True,
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
            stream=stream,
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
        wire = message.usage
        return ModelResponse(
            text="".join(texts),
            tool_calls=tuple(calls),
            usage=_usage(
                wire.input_tokens,
                wire.output_tokens,
                wire.cache_creation_input_tokens or 0,
                wire.cache_read_input_tokens or 0,
            ),
            finish_reason=_finish(message.stop_reason, bool(calls)),
            model=f"anthropic:{message.model}" if message.model else self.name,
        )

    def open_stream(self, client: Any, request: ModelRequest) -> Any:
        return client.messages.with_streaming_response.create(**self.body(request), stream=True)

    def stream_reader(self, request: ModelRequest, sink: Sink) -> _StreamReader:
        return _StreamReader(self, request, sink)


def _finish(stop_reason: str | None, has_calls: bool) -> FinishReason:
    finish = _FINISH.get(stop_reason or "")
    if finish is None or (finish == "stop" and has_calls):
        finish = "tool_calls" if has_calls else "stop"
    return finish


def _usage(fresh: int, output: int, cache_creation: int, cache_read: int) -> Usage:
    """One request's usage: input counts every prompt token (fresh, written to the
    cache and read from it), cached those read from the cache."""
    return Usage(
        input_tokens=fresh + cache_creation + cache_read,
        output_tokens=output,
        cached_tokens=cache_read,
        requests=1,
    )


class _Part:
    """A content block of a streamed message, as far as it has come."""

    __slots__ = ("id", "input", "kind", "name", "pieces")

    def __init__(self, kind: str, id: str = "", name: str = "", input: Any = None) -> None:
        self.kind = kind  # the block's type: "text", "tool_use", "thinking", ...
        self.id = id
        self.name = name
        self.input = input  # a tool_use block's input as it started (usually {})
        self.pieces: list[str] = []  # its text, or its input's JSON, piece by piece


class _StreamReader:
    """Reads a streamed Messages API response event by event (a ``StreamReader``):
    text to the sink as it comes, the rest kept until the message is complete."""

    def __init__(self, model: AnthropicModel, request: ModelRequest, sink: Sink) -> None:
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
                self._sink(text)
        elif kind == "input_json_delta":
            self.received += len(delta.partial_json)
            if part.kind == "tool_use":
                part.pieces.append(delta.partial_json)
        elif kind == "thinking_delta":
            self.received += len(delta.thinking)
        elif kind == "signature_delta":
            self.received += len(delta.signature)
        # citations_delta and any newer kind: not text, nothing to keep

    def _start(self, index: int, block: _Block) -> None:
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
        said = " ".join(f"{kind}: {error.message}".split()) if error.message else kind
        if len(said) > _MAX_SAID:
            said = said[: _MAX_SAID - 3] + "..."
        retryable = kind in _RETRYABLE_ERRORS
        return ProviderError(
            self._model.provider,
            f"the server reported an error part-way through the stream ({said})",
            advice=(
                "retryable (the agent's RetryPolicy decides how often, with backoff)"
                if retryable
                else "not retried"
            ),
            model=self._model.model,
            retryable=retryable,
        ).spent(self.usage())

    def response(self, status: int) -> ModelResponse:
        model = self._model
        if not self._complete:
            raise model.broken(
                status, f"it ended without message_stop, after {self.received} characters"
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
            usage=_usage(self._fresh, self._output, self._cache_creation, self._cache_read),
            finish_reason=_finish(self._stop_reason, bool(calls)),
            model=f"anthropic:{self._model_name}" if self._model_name else model.name,
        )

    def usage(self) -> Usage:
        """What the request spent so far: the server's figures where it sent them,
        else the input estimate and the output received (3.5 characters a token)."""
        if self._output_final:
            output = self._output
        else:
            received = estimate_output_tokens("", self.received, _CHARS_PER_TOKEN)
            output = max(self._output, received)
        if not self._started:
            return Usage(
                input_tokens=self._model.estimate_tokens(self._request),
                output_tokens=output,
                requests=1,
            )
        return _usage(self._fresh, output, self._cache_creation, self._cache_read)


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
