"""``AnthropicModel``: Anthropic's Messages API, on the official SDK.

How a ``ModelRequest`` goes out (``POST {base_url}/v1/messages``):

- Every ``SystemMessage`` -> the top-level ``system`` text (several are joined with a
  blank line, in order): the Messages API has no system role.
- ``UserMessage`` (and a ``DigestMessage``) -> a ``user`` turn; ``AssistantMessage``
  -> an ``assistant`` turn of a ``text`` block (when there is text) and one
  ``tool_use`` block per call (id, name, ``input``: the call's JSON arguments
  decoded to an object).
- ``ToolResultMessage`` -> a ``tool_result`` block (``tool_use_id``, ``content``,
  ``is_error`` when the tool failed) in the next ``user`` turn. Consecutive turns of
  one role are merged into one message, so the results of one step's parallel calls
  share one user message, in call order, ahead of any text.
- Images and documents (``parts``; ``actors._parts``): a user turn with parts sends
  its text block (when there is text), then for each part a text block naming it
  (``describe_part``: ``[image 4x3 png, 1 KB, sha256:ab12cd34]``, so the model can
  name it to a subagent) and the part's block: ``{"type": "image", "source":
  {"type": "base64", "media_type": "image/png", "data": ...}}`` (or ``{"type":
  "url", "url": ...}``), a PDF as ``{"type": "document", "source": {"type":
  "base64", "media_type": "application/pdf", "data": ...}}`` (or by URL). A
  ``data:`` URL is sent as its base64 source. A tool result with parts sends its
  ``content`` as an array of those blocks (its text first): the API takes images and
  documents inside a ``tool_result``. Each part's base64 is made once per request and
  never kept in the part; a part with no bytes (read from a store without its blob)
  or of a kind ``accepts=`` leaves out is refused before anything is sent, and so is
  a recording (``Audio``): the Messages API takes none.
- ``ToolSpec`` -> ``{"name", "description", "input_schema": <JSON schema>}``.
- ``max_tokens`` is required by the API: the request's cap (the supervisor's
  reservation) clamped to ``max_output_tokens``, or ``max_output_tokens`` itself
  (``DEFAULT_MAX_OUTPUT_TOKENS`` = 8192 unless given) when the request has none.
- ``options`` are extra request fields sent as they are (``temperature``,
  ``tool_choice``, ``metadata``, ...).
- Typed answers (``Agent(output_type=...)``) take the final-answer tool: a tool like
  any other here (``tool_choice`` is not needed: the model calls it when done).
  A request asking for native structured output (``output_schema`` with
  ``native=True``) is refused: this model has none (``structured_output = False``).

How the answer comes back is told where it is read: in one piece in
``_anthropic_response.py``, streamed in ``_anthropic_stream.py``. This module imports
those two, never the reverse.

On trio it needs the SDK 0.46 or later (earlier ones run on asyncio only: the model
says so with a ``ProviderError`` instead of failing obscurely).

Not yet: prompt caching breakpoints (``cache_control``), extended thinking (thinking
blocks are not kept, so it cannot be combined with tool use), server tools, the
Files API (parts go inline). An assistant message with neither text nor tool calls is left out, and
so is blank text (the API refuses both); an empty tool result is sent without
``content``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import ModuleType
from typing import Any, ClassVar, cast

import msgspec

from .._messages import (
    AssistantMessage,
    DigestMessage,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from .._models._protocol import Sink
from .._parts import PDF, Media, anthropic_image_tokens
from ._anthropic_response import CHARS_PER_TOKEN, read_message
from ._anthropic_stream import AnthropicStreamReader
from ._base import ProviderModel, output_cap, read_raw
from ._content import KINDS, Parts, kind_of, label
from ._errors import ProviderError
from ._estimates import estimate_request_tokens

__all__ = ["DEFAULT_MAX_OUTPUT_TOKENS", "AnthropicModel"]

#: The output cap sent when the request has none, and the clamp of a larger one: the
#: API requires one, and a budget's headroom can be far larger than a model may
#: produce. 8192 fits every current Claude model (Claude 3 Haiku: pass 4096).
DEFAULT_MAX_OUTPUT_TOKENS = 8_192

# Token estimate constants (with ``CHARS_PER_TOKEN``, about 3.5 characters per
# token): each message costs about four tokens of framing; offering tools adds the
# tool-use system prompt (about 350 tokens) and each tool about eight.
_PER_MESSAGE = 4
_PER_TOOL = 8
_TOOLS_PREAMBLE = 350

#: The first SDK release whose async client runs on trio.
_FIRST_TRIO_RELEASE = (0, 46)

_decode_object = msgspec.json.Decoder(dict[str, Any]).decode


class AnthropicModel(ProviderModel):
    """A Claude model behind Anthropic's Messages API.

    ``AnthropicModel("claude-sonnet-4-5")`` talks to Anthropic with the key in
    ``$ANTHROPIC_API_KEY``; ``base_url`` (default ``$ANTHROPIC_BASE_URL``, then
    Anthropic's) points it at another server that speaks the Messages API (a
    gateway, a proxy). ``timeout`` is the seconds one request may take (streamed
    or not: the whole of it); ``options`` are extra request fields sent
    with every request. ``max_output_tokens`` is the output cap sent when the
    request has none, and clamps a larger one. ``stream`` says whether agents
    stream its answers (``streaming``); ``stream`` itself works either way.
    ``accepts`` names the kinds of parts the endpoint takes (``"image"``,
    ``"document"``; both by default): a gateway to a model that reads no PDFs takes
    ``accepts=("image",)``, and a request with one is refused before it is sent.

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
    #: No native structured output: an agent's typed answer takes the final-answer tool.
    structured_output: ClassVar[bool] = False

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
        accepts: Collection[str] = KINDS,
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
            accepts=accepts,
        )

    def estimate_tokens(self, request: ModelRequest) -> int:
        """About 3.5 characters per token, four tokens per message, and when tools
        are offered 350 for the tool-use system prompt and eight per tool on top of
        its name, description and schema; and each image and document of the user
        turns and tool results: an image by Anthropic's rule, ``width * height /
        750`` at most 1,600 (``anthropic_image_tokens``; 1,600 when its size is
        unknown), a PDF 1,500 tokens a page (``part_tokens``), plus 20 for the line
        naming each part. So a budget's reservation and admission count what
        images cost."""
        tokens = estimate_request_tokens(
            request,
            chars_per_token=CHARS_PER_TOKEN,
            per_message=_PER_MESSAGE,
            per_tool=_PER_TOOL,
            tools_preamble=_TOOLS_PREAMBLE,
            image_tokens=anthropic_image_tokens,
        )
        return tokens

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
        output = request.output_schema
        if output is not None and output.native:
            raise ProviderError(
                "anthropic",
                "this model has no native structured output (the request asks for the "
                f"schema {output.name!r} natively)",
                advice="give the agent output_mode='tool' (the default for this model)",
            )
        system: list[str] = []
        turns: list[dict[str, Any]] = []
        parts: Parts | None = None  # made at the first part: none for text only

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
                case UserMessage(content=content, parts=media) if media:
                    parts = parts or self.parts()
                    if content:  # the API refuses empty text blocks
                        add("user", {"type": "text", "text": content})
                    for piece in _part_blocks(media, parts):
                        add("user", piece)
                case UserMessage(content=content) | DigestMessage(content=content):
                    add("user", {"type": "text", "text": content})
                case AssistantMessage(content=content, tool_calls=tool_calls):
                    if content.strip():  # the API refuses blank text blocks
                        add("assistant", {"type": "text", "text": content})
                    for c in tool_calls:
                        add(
                            "assistant",
                            {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)},
                        )
                case ToolResultMessage(
                    call_id=call_id, content=content, is_error=is_error, parts=media
                ):
                    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
                    if media:
                        parts = parts or self.parts()
                        inner = [{"type": "text", "text": content}] if content else []
                        block["content"] = inner + _part_blocks(media, parts)
                    elif content:  # optional: an empty result is sent without it
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

    async def send(
        self, client: Any, request: ModelRequest
    ) -> tuple[int, bytes, Mapping[str, str]]:
        raw = await client.messages.with_raw_response.create(**self.body(request))
        return await read_raw(raw)

    def parse(self, status: int, body: bytes, request: ModelRequest) -> ModelResponse:
        return read_message(self, status, body)

    def open_stream(self, client: Any, request: ModelRequest) -> Any:
        return client.messages.with_streaming_response.create(**self.body(request), stream=True)

    def stream_reader(self, request: ModelRequest, sink: Sink) -> AnthropicStreamReader:
        return AnthropicStreamReader(self, request, sink)


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


#: The kinds of parts the Messages API takes, each a content block of that type.
_BLOCKS = frozenset({"image", "document"})


def _part_blocks(media: tuple[Media, ...], parts: Parts) -> list[dict[str, Any]]:
    """The content blocks of ``media``: each one named by a text block, then itself."""
    blocks: list[dict[str, Any]] = []
    for part in media:
        parts.check(part)
        kind = kind_of(part)
        if kind not in _BLOCKS:
            raise parts.refuse(
                part,
                f"the Messages API takes images and PDFs, no {kind}",
                "send it to a model that takes it (OpenAI's audio models take WAV and MP3), "
                "or describe it in text",
            )
        media_type = part.media_type or PDF
        if part.data is not None:
            source = {"type": "base64", "media_type": media_type, "data": parts.base64(part)}
        elif part.url.startswith("data:"):
            head, _, data = part.url.partition(",")
            if not head.endswith(";base64"):
                raise parts.refuse(
                    part,
                    "its data: URL is not base64 (the Messages API takes base64 or a URL)",
                    "give its bytes instead",
                )
            media_type = head[5:].removesuffix(";base64") or media_type
            source = {"type": "base64", "media_type": media_type, "data": data}
        else:
            source = {"type": "url", "url": part.url}
        blocks.append({"type": "text", "text": label(part)})
        blocks.append({"type": kind, "source": source})
    return blocks


def _tool(spec: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": spec.name, "input_schema": spec.parameters}
    if spec.description:
        tool["description"] = spec.description
    return tool
