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
(also ``function_call``, and ``stop`` with tool calls), ``length``, ``content_filter``;
any other (``eos``, ``end_turn``, ...) is read from the calls: ``tool_calls`` when
there are some, else ``stop``. A thinking model's ``reasoning_content`` (or
``reasoning``) is never text; it counts in an output estimate.

How a streamed response comes back (``stream``, the default for agents; turned off
with ``stream=False``): the same request with ``"stream": true`` and
``"stream_options": {"include_usage": true}``, answered with server-sent events, each
``data: <chat.completion.chunk>`` holding ``choices[0].delta`` (``content`` text,
``tool_calls`` fragments, ``reasoning_content``) and, on the last, the
``finish_reason``; then a chunk with ``"choices": []`` and the ``usage``; then
``data: [DONE]``. Each chunk is decoded into lean Structs; text goes to the sink as
it comes; tool calls are pieced together by ``index`` (id and name in the first
fragment, the arguments in pieces); the response is the one ``request`` returns for
the same completion. What the servers people run send, and how it is read:

- No usage at all (a server that ignores ``stream_options``: older vLLM, Ollama, LM
  Studio): estimated, as for a completion without usage.
- Usage on every chunk (vLLM's ``continuous_usage_stats``, llama.cpp's last chunk),
  or ``"usage": null`` on some: the last figures win, counted once.
- No ``data: [DONE]`` (ik_llama.cpp, some proxies): a body that ends after a
  ``finish_reason`` is complete; ``[DONE]`` without one is complete too.
- A first chunk with ``"choices": []`` (Azure's ``prompt_filter_results``), chunks
  whose choice has no delta, a role-only first delta, ``"content": null``: nothing.
- Whole tool calls in one chunk (llama.cpp, LM Studio, Ollama); several in one chunk
  without ``index``, or all with index 0 and their own ids (Ollama): a new id (or,
  without an index, a second name) opens a new call. Arguments sent as a JSON
  object are encoded; none at all are ``{}``.
- ``reasoning_content`` / ``reasoning`` deltas (llama.cpp, vLLM, DeepSeek, Ollama,
  LM Studio; once when a server sends both): never in the text nor the sink, counted
  in what was received (a cut stream's usage, an output estimate).
- A ``refusal`` in place of content: the text, as in ``request``.
- SSE comments (``: ping``), ``event:``, ``id:`` and ``retry:`` lines, CRLF or CR
  line ends; U+2028 and the other breaks ``str.splitlines`` knows, raw inside a JSON
  string (llama.cpp writes raw UTF-8): text, never a line end (see ``sse_events``).
- An error in the middle of the stream, ``data: {"error": {"message", "type",
  "code"}}`` (OpenAI, vLLM, llama.cpp) or older llama.cpp's ``error: {...}`` line: a
  ``ProviderError`` naming the server's code, type and message, retryable unless
  they say the request itself was refused (a 4xx code, ``invalid_request_error``),
  with the usage of what was received.
- Data that is not a chunk (garbage, a cut JSON): a "malformed" ``ProviderError``
  naming the chunk, retryable, with that usage; the text before it reached the sink.
- A cut connection, a body that ends too early, a stream silent for ``timeout``
  seconds: a retryable ``ProviderError`` ("the stream broke off") with that usage.
- A server that answers one JSON completion instead of a stream (it ignores
  ``"stream": true``): read as ``request`` reads it, its text to the sink at once.

Not yet: images and other content parts in requests, structured outputs, the
Responses API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from .._models import Sink
from ._base import (
    ProviderError,
    ProviderModel,
    _detail,
    estimate_output_tokens,
    estimate_request_tokens,
    malformed,
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


class _WireUsage(msgspec.Struct, frozen=True):
    # null or missing: the server did not count (the usage is estimated then)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None

    @property
    def counted(self) -> bool:
        return self.prompt_tokens is not None or self.completion_tokens is not None


class _Completion(msgspec.Struct, frozen=True):
    choices: list[_Choice]
    usage: _WireUsage | None = None
    model: str | None = None


_decode_completion = msgspec.json.Decoder(_Completion).decode


# -- the streamed response: chat.completion.chunk events ---------------------------------


class _DeltaFunction(msgspec.Struct, frozen=True):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None


class _DeltaCall(msgspec.Struct, frozen=True):
    index: int | None = None
    id: str | None = None
    function: _DeltaFunction | None = None


class _Delta(msgspec.Struct, frozen=True):
    content: str | list[dict[str, Any]] | None = None
    refusal: str | None = None
    reasoning_content: Any = None
    reasoning: Any = None
    tool_calls: list[_DeltaCall] | None = None


class _ChunkChoice(msgspec.Struct, frozen=True):
    delta: _Delta | None = None
    finish_reason: str | None = None
    index: int | None = None


class _Chunk(msgspec.Struct, frozen=True):
    choices: list[_ChunkChoice] | None = None
    usage: _WireUsage | None = None
    model: str | None = None
    # Set (an object, or a string) when the server fails in the middle of the stream.
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


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
    ``stream`` says whether agents stream its answers (``stream``, text to a sink as
    it is generated) or ask for them in one piece (``request``).

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
        stream: bool = True,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            options=options,
            max_output_tokens=max_output_tokens,
            stream=stream,
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
        reasoning = _reasoning(message.reasoning_content, message.reasoning)
        return self._answer(
            request,
            text,
            calls,
            finish_reason=choice.finish_reason,
            wire=completion.usage,
            reasoning=len(reasoning),
            model=completion.model,
        )

    def _answer(
        self,
        request: ModelRequest,
        text: str,
        calls: tuple[ToolCall, ...],
        *,
        finish_reason: str | None,
        wire: _WireUsage | None,
        reasoning: int,
        model: str | None,
    ) -> ModelResponse:
        """The ``ModelResponse`` of a completion, read in one piece or streamed."""
        finish = _FINISH.get(finish_reason or "")
        if finish is None or (finish == "stop" and calls):
            finish = "tool_calls" if calls else "stop"
        if wire is None or not wire.counted:
            arguments = sum(len(c.name) + len(c.arguments) for c in calls) + reasoning
            usage = Usage(
                input_tokens=self.estimate_tokens(request),
                output_tokens=estimate_output_tokens(text, arguments, _CHARS_PER_TOKEN),
                requests=1,
            )
        else:
            usage = _usage(wire)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            finish_reason=finish,
            model=f"openai:{model}" if model else self.name,
        )

    def open_stream(self, client: Any, request: ModelRequest) -> Any:
        return client.chat.completions.with_streaming_response.create(
            **self.body(request), stream=True, stream_options={"include_usage": True}
        )

    def stream_reader(self, request: ModelRequest, sink: Sink) -> _StreamReader:
        return _StreamReader(self, request, sink)

    def _calls(self, wire_calls: Sequence[_WireToolCall]) -> tuple[ToolCall, ...]:
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


def _reasoning(*fields: Any) -> str:
    """The reasoning text of a message or delta: the first of its fields that is a
    string (vLLM has sent the same text in both ``reasoning_content`` and
    ``reasoning``: it is counted once)."""
    for field in fields:
        if isinstance(field, str) and field:
            return field
    return ""


def _usage(wire: _WireUsage) -> Usage:
    details = wire.prompt_tokens_details
    return Usage(
        input_tokens=wire.prompt_tokens or 0,
        output_tokens=wire.completion_tokens or 0,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        requests=1,
    )


# -- reading a stream ------------------------------------------------------------------

#: What an error sent in the middle of a stream says when it is the request's fault
#: (retrying the same request cannot help), by its code or type.
_REQUEST_FAULTS = frozenset(
    {"invalid_request_error", "BadRequestError", "context_length_exceeded", "invalid_request"}
)


class _PendingCall:
    """A tool call being streamed: its id and name, and its arguments in pieces."""

    __slots__ = ("arguments", "id", "index", "name")

    def __init__(self, index: int | None, call_id: str) -> None:
        self.index = index
        self.id = call_id
        self.name = ""
        self.arguments: list[str] = []


class _StreamReader:
    """Reads a streamed chat completion, one ``chat.completion.chunk`` at a time
    (``StreamReader``): text to the sink, tool calls pieced together, the last usage
    reported, the finish reason, the end (``[DONE]``, or the body's end after a
    finish reason)."""

    def __init__(self, model: OpenAIModel, request: ModelRequest, sink: Sink) -> None:
        self.received = 0
        self._model = model
        self._request = request
        self._sink = sink
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._reasoning = 0
        self._calls: list[_PendingCall] = []
        self._by_index: dict[int, _PendingCall] = {}
        self._finish: str | None = None
        self._usage: _WireUsage | None = None
        self._model_name: str | None = None
        self._done = False
        self._chunks = 0

    def feed(self, event: str, data: str) -> bool:
        if event == "error":  # older llama.cpp: an ``error: {...}`` line
            raise self._server_error(data)
        if data[:6] == "[DONE]":
            self._done = True
            return True
        try:
            chunk = _decode_chunk(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise malformed(
                "openai",
                self._model.model,
                None,
                f"chunk {self._chunks + 1} of the stream is not a chat completion chunk "
                f"({exc}): {data!r}",
            ) from None
        self._chunks += 1
        if chunk.error is not None:
            raise self._server_error(data)
        if chunk.usage is not None and chunk.usage.counted:
            self._usage = chunk.usage  # the last one wins: vLLM can send one per chunk
        if chunk.model and self._model_name is None:
            self._model_name = chunk.model
        for choice in chunk.choices or ():  # none: the usage chunk, Azure's filter results
            if choice.index:  # only the first choice is asked for (n=1)
                continue
            delta = choice.delta
            if delta is not None:
                self._delta(delta)
            if choice.finish_reason:
                self._finish = choice.finish_reason
        return False

    def _delta(self, delta: _Delta) -> None:
        content = delta.content
        if content:
            text = content if isinstance(content, str) else _text(content)
            if text:
                self.received += len(text)
                self._text.append(text)
                self._sink(text)
        if delta.refusal and not self._text:
            # A refusal is the answer's text when there is no content (as in ``parse``).
            self.received += len(delta.refusal)
            self._refusal.append(delta.refusal)
            self._sink(delta.refusal)
        reasoning = _reasoning(delta.reasoning_content, delta.reasoning)
        if reasoning:
            self.received += len(reasoning)
            self._reasoning += len(reasoning)
        if delta.tool_calls:
            for fragment in delta.tool_calls:
                self._fragment(fragment)

    def _fragment(self, fragment: _DeltaCall) -> None:
        """Add one piece of a tool call: to the call it continues, or as a new call.

        OpenAI sends a call's id and name in its first fragment and its arguments in
        pieces after it, all with the call's ``index``. A fragment opens a new call
        when its index is new, when it brings an id other than its index's call has
        (Ollama numbers every call 0), or, without an index, when it brings another
        id or a name for a call already named.
        """
        call_id = fragment.id or ""
        function = fragment.function
        name = function.name if function is not None else None
        index = fragment.index
        pending: _PendingCall | None
        if index is not None:
            pending = self._by_index.get(index)
            opens = pending is None or bool(call_id and pending.id and call_id != pending.id)
        else:
            pending = self._calls[-1] if self._calls else None
            opens = (
                pending is None
                or bool(call_id and call_id != pending.id)
                or bool(name and pending.name and not call_id)
            )
        if opens or pending is None:
            pending = _PendingCall(index, call_id)
            self._calls.append(pending)
            if index is not None:
                self._by_index[index] = pending
        elif call_id and not pending.id:
            pending.id = call_id
        if name and not pending.name:
            pending.name = name
        if function is None:
            return
        arguments = function.arguments
        if isinstance(arguments, str):
            if arguments:
                self.received += len(arguments)
                pending.arguments.append(arguments)
        elif arguments is not None:  # the object itself, as a few servers send it
            encoded = _json_encoder.encode(arguments).decode()
            self.received += len(encoded)
            pending.arguments = [encoded]

    def _server_error(self, data: str) -> ProviderError:
        """The ``ProviderError`` for an error the server sent in the stream: retryable
        unless its code or type says the request itself was refused."""
        try:
            body: object = msgspec.json.decode(data)
        except msgspec.DecodeError:
            body = data
        inner = body.get("error", body) if isinstance(body, Mapping) else body
        message = ""
        labels: list[str] = []
        if isinstance(inner, Mapping):
            message = str(inner.get("message") or "")
            for value in (inner.get("code"), inner.get("type")):
                if value not in (None, "") and str(value) not in labels:
                    labels.append(str(value))
        elif isinstance(inner, str):
            message = inner
        refused = any(
            label in _REQUEST_FAULTS
            or (label.isdigit() and 400 <= int(label) < 500 and int(label) not in (408, 409, 429))
            for label in labels
        )
        said = ": ".join(part for part in (" ".join(labels), message) if part) or data
        return ProviderError(
            "openai",
            f"the server sent an error in the middle of the stream ({_detail(said)})",
            advice=(
                "the server refused the request itself; not retried"
                if refused
                else "retryable (the agent's RetryPolicy decides how often)"
            ),
            model=self._model.model,
            retryable=not refused,
        )

    def response(self, status: int) -> ModelResponse:
        if not self._done and self._finish is None:
            what = (
                "the body ended without a finish_reason or [DONE]"
                if self._chunks
                else "the body held no chat completion chunk"
            )
            raise self._model.broken(status, what)
        wires: list[_WireToolCall] = []
        for pending in self._calls:
            if not pending.name:
                raise self._model.malformed(
                    status, f"tool call {pending.id or pending.index!r} has no function name"
                )
            wires.append(
                _WireToolCall(
                    function=_Function(name=pending.name, arguments="".join(pending.arguments)),
                    id=pending.id or None,
                )
            )
        text = "".join(self._text) or "".join(self._refusal)
        return self._model._answer(
            self._request,
            text,
            self._model._calls(wires),
            finish_reason=self._finish,
            wire=self._usage,
            reasoning=self._reasoning,
            model=self._model_name,
        )

    def usage(self) -> Usage:
        if self._usage is not None:
            return _usage(self._usage)
        return Usage(
            input_tokens=self._model.estimate_tokens(self._request),
            output_tokens=estimate_output_tokens("", self.received, _CHARS_PER_TOKEN),
            requests=1,
        )
