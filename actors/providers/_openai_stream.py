"""How a streamed OpenAI chat completion comes back, and how it is read: the
``chat.completion.chunk`` Structs and ``OpenAIStreamReader``. What it shares with
reading a completion in one piece is in ``_openai_response.py``; ``OpenAIModel``
(``_openai.py``) opens the stream and imports this module, never the reverse.

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
  Studio, llama-cpp-python): estimated, as for a completion without usage, and at
  least a token for each chunk that brought output (llama.cpp's servers stream a
  token a chunk, one character each for digits and line breaks).
- Usage on every chunk (vLLM's ``continuous_usage_stats``, llama.cpp's last chunk),
  or ``"usage": null`` on some: the last figures win, counted once.
- No ``data: [DONE]`` (ik_llama.cpp, some proxies): a body that ends after a
  ``finish_reason`` is complete. Only a ``finish_reason`` says so: ``[DONE]``
  without one (llama-cpp-python's, when another request arrives) is a cut stream.
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
- A streamed request with tools answered with HTTP 200 and an empty body, ended or
  dropped (llama-cpp-python's ``chatml-function-calling`` chat format cannot stream
  tool calls): a ``ProviderError`` saying to build the model with ``stream=False``,
  not retried (``OpenAIStreamReader.broken``).
- A server that answers one JSON completion instead of a stream (it ignores
  ``"stream": true``): read as ``request`` reads it, its text to the sink at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from .._messages import ModelRequest, ModelResponse, Usage
from .._models._protocol import Sink
from ._base import Asker
from ._errors import ProviderError, malformed
from ._estimates import estimate_output_tokens
from ._openai_response import (
    CHARS_PER_TOKEN,
    Function,
    WireToolCall,
    WireUsage,
    answer,
    content_text,
    reasoning_text,
    tool_calls_of,
    usage_of,
)

__all__ = ["OpenAIStreamReader"]

_json_encoder = msgspec.json.Encoder()


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
    usage: WireUsage | None = None
    model: str | None = None
    # Set (an object, or a string) when the server fails in the middle of the stream.
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


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


class OpenAIStreamReader:
    """Reads a streamed chat completion, one ``chat.completion.chunk`` at a time
    (``StreamReader``): text to the sink, tool calls pieced together, the last usage
    reported, the finish reason, the end (``[DONE]``, or the body's end after a
    finish reason)."""

    def __init__(self, model: Asker, request: ModelRequest, sink: Sink) -> None:
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
        self._usage: WireUsage | None = None
        self._model_name: str | None = None
        self._done = False
        self._chunks = 0
        # The chunks that brought output (text, reasoning, arguments): each is at
        # least one token, however few characters it holds (a digit, a line break).
        self._pieces = 0

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
                before = self.received
                self._delta(delta)
                if self.received > before:
                    self._pieces += 1
            if choice.finish_reason:
                self._finish = choice.finish_reason
        return False

    def _delta(self, delta: _Delta) -> None:
        content = delta.content
        if content:
            text = content if isinstance(content, str) else content_text(content)
            if text:
                self.received += len(text)
                self._text.append(text)
                self._sink(text)
        if delta.refusal and not self._text:
            # A refusal is the answer's text when there is no content (as in ``parse``).
            self.received += len(delta.refusal)
            self._refusal.append(delta.refusal)
            self._sink(delta.refusal)
        reasoning = reasoning_text(delta.reasoning_content, delta.reasoning)
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
            "the server sent an error in the middle of the stream",
            detail=said,  # cut short after its secrets are redacted: see ProviderError
            advice=(
                "the server refused the request itself; not retried"
                if refused
                else "retryable (the agent's RetryPolicy decides how often)"
            ),
            model=self._model.model,
            retryable=not refused,
            kind="rejected" if refused else "server",
        )

    def response(self, status: int) -> ModelResponse:
        # Only a finish_reason says the answer is complete: [DONE] or the body's end
        # without one is a cut stream (llama-cpp-python sends [DONE] after a token
        # when another request arrives), never an answer.
        if self._finish is None:
            if self._done:
                what = "[DONE] came without a finish_reason: the answer was cut short"
            elif self._chunks:
                what = "the body ended without a finish_reason or [DONE]"
            else:
                what = "the body held no chat completion chunk"
            raise self.broken(status, what)
        wires: list[WireToolCall] = []
        for pending in self._calls:
            if not pending.name:
                raise self._model.malformed(
                    status, f"tool call {pending.id or pending.index!r} has no function name"
                )
            wires.append(
                WireToolCall(
                    function=Function(name=pending.name, arguments="".join(pending.arguments)),
                    id=pending.id or None,
                )
            )
        text = "".join(self._text) or "".join(self._refusal)
        return answer(
            self._model,
            self._request,
            text,
            tool_calls_of(self._model, wires),
            finish_reason=self._finish,
            wire=self._usage,
            reasoning=self._reasoning,
            model_name=self._model_name,
            pieces=self._pieces,
        )

    def broken(self, status: int, detail: str) -> ProviderError:
        """The error of a stream that ended, or was dropped, before its answer was
        complete (``detail`` says how): a retryable cut stream, but for a streamed
        request with tools answered with nothing at all. llama-cpp-python's
        ``chatml-function-calling`` chat format cannot stream tool calls: it fails
        once the stream's HTTP 200 is out, and the body stays empty, every time."""
        if self._request.tools and not self._chunks and not self._done:
            return ProviderError(
                "openai",
                "the server answered a streamed request with tools with HTTP 200 and an "
                "empty body, as llama-cpp-python's chatml-function-calling chat format "
                "does (it cannot stream tool calls)",
                advice="build the model with stream=False for this server; not retried",
                model=self._model.model,
                status=status,
            )
        return self._model.broken(status, detail)

    def usage(self) -> Usage:
        if self._usage is not None:
            return usage_of(self._usage)
        return Usage(
            input_tokens=self._model.estimate_tokens(self._request),
            output_tokens=estimate_output_tokens(
                "", self.received, CHARS_PER_TOKEN, self._request.max_tokens, pieces=self._pieces
            ),
            requests=1,
        )
