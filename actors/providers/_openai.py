"""``OpenAIModel``: the OpenAI chat completions wire format, on the official SDK.

It speaks to OpenAI itself and to every server that implements the same endpoint
(``POST {base_url}/chat/completions``): vLLM, Ollama, llama.cpp's server, LM Studio.

How a ``ModelRequest`` goes out:

- ``SystemMessage`` -> ``{"role": "system"}``; ``UserMessage`` (and a
  ``DigestMessage``) -> ``{"role": "user"}``.
- ``AssistantMessage`` -> ``{"role": "assistant", "content": text,
  "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}``:
  the execution buffer's calls, several in one turn, with their ids. The content is
  a string even when empty, never null: llama-cpp-python's server answers an
  assistant message with ``"content": null`` with HTTP 500 (every native tool loop
  then fails at its second request); OpenAI, vLLM, Ollama and llama.cpp take "".
- ``ToolResultMessage`` -> ``{"role": "tool", "tool_call_id": id, "content": text}``.
  The wire format has no error flag: an error result says so in its text.
- Images and documents (``parts``; ``actors._parts``). A user turn with parts
  sends its content as an array: ``{"type": "text", "text": ...}`` for its text (when
  there is any), then for each part a text part naming it (``describe_part``:
  ``[image 4x3 png, 1 KB, sha256:ab12cd34]``, so the model can name it to a
  subagent) and the part itself: an image as ``{"type": "image_url", "image_url":
  {"url": "data:<media type>;base64,..."}}`` (or its URL), a PDF as ``{"type":
  "file", "file": {"filename": <name>, "file_data":
  "data:application/pdf;base64,..."}}``. Chat completions have no URL form for a
  file: a PDF given only by an http(s) URL is refused (``ProviderError``), never
  dropped. A recording (``Audio``) is an ``input_audio`` part, its base64 and its
  format (``wav``, ``mp3``), for the models that take audio; it too has no URL form.
  A user turn without parts sends its content as a plain string, as ever.
- **The tool-result rule**: a tool message takes text only, so a tool result's text
  goes in its tool message and its images and documents in one user message right
  after the run of tool messages of that step (tool messages must follow their
  assistant turn unbroken): ``"Attached to the tool results above:"``, then per
  call ``"From call <id> (<tool>):"`` and its parts, each named as above. This is
  the usual practice of OpenAI-compatible clients for images a tool returns.
- Each part's base64 is made once per request, however many turns carry it, and
  never kept in the part. A part with no bytes (read from a store without its blob)
  or of a kind the model's ``accepts=`` leaves out is refused before anything is
  sent.
- ``ToolSpec`` -> ``{"type": "function", "function": {"name", "description",
  "parameters": <JSON schema>}}``.
- ``max_tokens`` (the supervisor's reservation) -> ``max_completion_tokens`` for
  OpenAI itself, ``max_tokens`` for a server given by ``base_url`` (what local
  servers read; choose with ``max_tokens_param``), clamped to ``max_output_tokens``.
  Without a cap in the request, none is sent.
- ``options`` are extra request fields sent as they are (``temperature``, ``seed``,
  ``tool_choice``, ``parallel_tool_calls``, ``reasoning_effort``, ...).
- A typed answer's schema asked natively (``request.output_schema`` with
  ``native=True``: ``Agent(output_type=...)``) -> ``response_format``
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict": false}}``
  (in place of one in ``options``). Not strict: OpenAI's strict mode refuses
  schemas with optional fields, and the local servers (llama.cpp, vLLM, LM Studio,
  Ollama) constrain their output to the schema either way. The answer's text is
  the JSON; the agent validates it.

How the answer comes back is told where it is read: in one piece in
``_openai_response.py``, streamed (with what the servers people run send) in
``_openai_stream.py``. This module imports those two, never the reverse.

Not yet: the Responses API; OpenAI's image ``detail`` setting (the server's default).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import ModuleType
from typing import Any, ClassVar, Literal

from .._messages import (
    AssistantMessage,
    DigestMessage,
    Message,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from .._models._protocol import Sink
from .._parts import Audio, Document, Image, Media, openai_image_tokens
from ._base import ProviderModel, output_cap, read_raw
from ._content import KINDS, Parts, label
from ._estimates import estimate_request_tokens
from ._openai_response import CHARS_PER_TOKEN, read_completion
from ._openai_stream import OpenAIStreamReader

__all__ = ["DEFAULT_MAX_OUTPUT_TOKENS", "OpenAIModel"]

#: The default clamp of the output cap sent: the largest that every current OpenAI
#: chat model accepts. A budget's headroom can be far larger than a model may produce.
DEFAULT_MAX_OUTPUT_TOKENS = 16_384

# Token estimate constants (with ``CHARS_PER_TOKEN``, about four characters per
# token): each message costs three tokens of framing and the reply three more; each
# function spec about eight on top of its text.
_PER_MESSAGE = 3
_REPLY_PRIMING = 3
_PER_TOOL = 8

#: The request options of ``with_raw_response``: the SDK returns its raw response
#: (a ``LegacyAPIResponse``, the httpx response read) instead of parsing the body.
_RAW_RESPONSE: Any = {"headers": {"X-Stainless-Raw-Response": "true"}}


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
    ``structured_output`` says whether the server takes a ``json_schema``
    ``response_format`` (an agent with an ``output_type`` then asks for its answer
    that way; False: with a final-answer tool). ``accepts`` names the kinds of parts
    the endpoint takes (``"image"``, ``"document"``; both by default): ``accepts=()``
    for a server that reads text only (a llama.cpp server without a vision
    projector), so a request with an image is refused clearly before it is sent.

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
        structured_output: bool = True,
        accepts: Collection[str] = KINDS,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            options=options,
            max_output_tokens=max_output_tokens,
            stream=stream,
            accepts=accepts,
        )
        if max_tokens_param is None:
            max_tokens_param = "max_tokens" if self._base_url else "max_completion_tokens"
        elif max_tokens_param not in ("max_tokens", "max_completion_tokens"):
            raise ValueError(
                "openai: max_tokens_param must be 'max_tokens' or 'max_completion_tokens', "
                f"got {max_tokens_param!r}"
            )
        self._max_tokens_param = max_tokens_param
        if not isinstance(structured_output, bool):
            raise TypeError(f"openai: structured_output must be a bool, got {structured_output!r}")
        self.structured_output = structured_output

    def estimate_tokens(self, request: ModelRequest) -> int:
        """About four characters per token, three tokens per message and three for
        the reply, eight per tool on top of its name, description and schema; and
        each image and document of the user turns and tool results: an image by
        OpenAI's tile rule from its width and height (``openai_image_tokens``: 85
        plus 170 per 512-px tile after scaling; 1,600 when its size is unknown), a
        PDF 1,500 tokens a page (``part_tokens``), plus 20 for the line naming each
        part. So a budget's reservation and admission count what images cost."""
        tokens = estimate_request_tokens(
            request,
            chars_per_token=CHARS_PER_TOKEN,
            per_message=_PER_MESSAGE,
            per_tool=_PER_TOOL,
            base=_REPLY_PRIMING,
            image_tokens=openai_image_tokens,
        )
        return tokens

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
            "messages": self._messages(request),
        }
        if request.tools:
            kwargs["tools"] = [_tool(spec) for spec in request.tools]
        extra = dict(self._options)
        output = request.output_schema
        if output is not None and output.native:
            extra.pop("response_format", None)
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": output.name, "schema": output.schema, "strict": False},
            }
        if request.max_tokens is not None:
            extra[self._max_tokens_param] = output_cap(request.max_tokens, self._max_output_tokens)
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _messages(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The chat messages of ``request``: those with parts as the module says,
        every other one as ``_message`` makes it (text only: as ever)."""
        out: list[dict[str, Any]] = []
        parts: Parts | None = None  # made at the first part: none for text only
        attached: list[ToolResultMessage] = []  # this step's results with parts
        for message in request.messages:
            if attached and type(message) is not ToolResultMessage:
                assert parts is not None
                out.append(_attachments(attached, parts))
                attached = []
            if type(message) is UserMessage and message.parts:
                parts = parts or self.parts()
                content = [_text(message.content)] if message.content else []
                content += _part_blocks(message.parts, parts)
                out.append({"role": "user", "content": content})
                continue
            if type(message) is ToolResultMessage and message.parts:
                parts = parts or self.parts()
                for part in message.parts:
                    _check(part, parts)  # all before anything is built further
                attached.append(message)
            out.append(_message(message))
        if attached:
            assert parts is not None
            out.append(_attachments(attached, parts))
        return out

    async def send(
        self, client: Any, request: ModelRequest
    ) -> tuple[int, bytes, Mapping[str, str]]:
        """Post the request as its JSON body, through the client's own ``post``: the
        same request, headers and errors as ``chat.completions.create``, minus that
        method's transformation of every parameter against its types (a walk of the
        whole context on each request: about a tenth of the client's work per
        request in the provider benchmark, more with a long context).

        Asked as ``with_raw_response`` asks (its header): the SDK hands back the
        response it read, body and headers (the rate limits), with no parsing."""
        kwargs = self.body(request)
        extra = kwargs.pop("extra_body", None)
        if extra:
            kwargs.update(extra)
        raw = await client.post(
            "/chat/completions", cast_to=bytes, body=kwargs, options=_RAW_RESPONSE
        )
        return await read_raw(raw)  # an error status raised

    def parse(self, status: int, body: bytes, request: ModelRequest) -> ModelResponse:
        return read_completion(self, status, body, request)

    def open_stream(self, client: Any, request: ModelRequest) -> Any:
        return client.chat.completions.with_streaming_response.create(
            **self.body(request), stream=True, stream_options={"include_usage": True}
        )

    def stream_reader(self, request: ModelRequest, sink: Sink) -> OpenAIStreamReader:
        return OpenAIStreamReader(self, request, sink)


def _message(message: Message) -> dict[str, Any]:
    match message:
        case SystemMessage(content=content):
            return {"role": "system", "content": content}
        case UserMessage(content=content) | DigestMessage(content=content):
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


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _check(part: Media, parts: Parts) -> None:
    """Refuse ``part`` unless it can go out: its bytes or a URL this wire takes."""
    parts.check(part)
    if type(part) is not Image and part.data is None and not part.url.startswith("data:"):
        what = "a PDF" if type(part) is Document else f"{part.kind} parts"
        name = type(part).__name__
        raise parts.refuse(
            part,
            f"OpenAI chat completions take {what} only as bytes (they have no URL form)",
            f"give its bytes ({name}(data=...) or {name}.from_file)",
        )


#: The ``input_audio`` format of each audio media type.
_AUDIO_FORMATS = {"audio/wav": "wav", "audio/mpeg": "mp3"}


def _part_blocks(media: tuple[Media, ...], parts: Parts) -> list[dict[str, Any]]:
    """The content parts of ``media``: each one named by a text part, then itself."""
    blocks: list[dict[str, Any]] = []
    for part in media:
        _check(part, parts)
        blocks.append(_text(label(part)))
        if type(part) is Image:
            url = part.url or parts.data_url(part)
            blocks.append({"type": "image_url", "image_url": {"url": url}})
        elif type(part) is Audio:
            data = part.url.partition(",")[2] if part.url else parts.base64(part)
            audio = {"data": data, "format": _AUDIO_FORMATS.get(part.media_type, "wav")}
            blocks.append({"type": "input_audio", "input_audio": audio})
        else:
            assert type(part) is Document
            name = part.name or f"{part.sha256[:16] or 'document'}.pdf"
            data = part.url or parts.data_url(part)  # a data: URL (checked above)
            blocks.append({"type": "file", "file": {"filename": name, "file_data": data}})
    return blocks


def _attachments(results: list[ToolResultMessage], parts: Parts) -> dict[str, Any]:
    """The user message carrying the images and documents of a step's tool results
    (a tool message takes text only: see the module's docstring)."""
    content = [_text("Attached to the tool results above:")]
    for result in results:
        content.append(_text(f"From call {result.call_id} ({result.name}):"))
        content += _part_blocks(result.parts, parts)
    return {"role": "user", "content": content}


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }
