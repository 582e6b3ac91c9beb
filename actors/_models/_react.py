"""ReAct: tool use for models without native tool calling.

``ReActModel`` is a ``Model`` adapter around a text-only ``Model``. The agent talks to
it exactly as to a native tool-calling model; underneath, the inner model sees:

- no tool specs, and a system prompt that ends with the action protocol: each tool
  (name, description, JSON schema of its arguments) and the one reply format;
- its own earlier tool calls as the action JSON they stand for, and each tool result
  as a user message ``Observation for call <id> (<tool>): <content>`` carrying the
  result's images and documents (``parts``), which the inner model's provider sends
  as it sends a user turn's.

The inner model answers ONE JSON object (bare, in a ```json fence, or with prose
around it)::

    {"thought": "...", "actions": [{"tool": "name", "arguments": {...}}]}
    {"thought": "...", "final": "the answer"}

Actions become tool calls with ids ``react_1``, ``react_2``, ... (unique per adapter);
a final becomes the response text. A reply that does not fit is shown back to the
inner model with a correction saying what was wrong, in a local copy of the context
that the caller never sees, up to ``max_corrections`` times; then ``MalformedAction``.

For a typed answer (``Agent(output_type=...)``: the request carries an
``output_schema``, and the agent's instructions the schema), the ``"final"`` may be
any JSON value: one that is not a string becomes its JSON text, which the agent
validates.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import msgspec

from fractor.runtime import FractorError

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
from ._inside import admitting
from ._protocol import Model, Send

__all__ = ["MalformedAction", "ReActModel"]


class MalformedAction(FractorError):
    """The inner model of a ``ReActModel`` kept answering outside the action format.

    ``usage`` is what the failed attempts consumed, so it can still be charged.
    """

    def __init__(self, model_name: str, attempts: int, last_error: str, usage: Usage) -> None:
        super().__init__(
            f"model {model_name!r} did not answer in the action format after {attempts} "
            f"attempt{'s' if attempts != 1 else ''} ({attempts - 1} with a correction); "
            f"last problem: {last_error}"
        )
        self.model_name = model_name
        self.attempts = attempts
        self.last_error = last_error
        self.usage = usage


class _Action(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class _Reply(msgspec.Struct, frozen=True, kw_only=True):
    """One reply of the inner model. Unknown fields are ignored."""

    thought: str = ""
    actions: tuple[_Action, ...] | None = None
    final: str | None = None


class _TypedReply(msgspec.Struct, frozen=True, kw_only=True):
    """One reply of the inner model asked for a typed answer: ``final`` is JSON."""

    thought: str = ""
    actions: tuple[_Action, ...] | None = None
    final: Any = None


_decoder = msgspec.json.Decoder(_Reply)
_typed_decoder = msgspec.json.Decoder(_TypedReply)
_encoder = msgspec.json.Encoder()
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)```", re.DOTALL)

_FORMATS = (
    "To call tools (several actions in one reply run in parallel):\n"
    '{"thought": "<your reasoning>", "actions": [{"tool": "<tool name>", '
    '"arguments": {<arguments as the tool\'s schema describes>}}]}\n'
    "To give your final answer:\n"
    '{"thought": "<your reasoning>", "final": "<your answer>"}'
)
_NO_TOOLS = (
    "No tools are available for this reply. Answer in plain text, or as one JSON "
    'object: {"thought": "<your reasoning>", "final": "<your answer>"}'
)


_TYPED_FINAL = (
    '\nYour "final" is your answer as the JSON the instructions above describe (an '
    "object, a list, a number, ...), not a string that holds it."
)


class _Malformed(Exception):
    """What was wrong with one reply, in words for the correction."""


def _extract_object(text: str) -> str | None:
    """The outermost ``{...}`` of the first fenced block that has one, else of the text."""
    body = text
    for fenced in _FENCE.finditer(text):
        if "{" in fenced.group(1):
            body = fenced.group(1)
            break
    start = body.find("{")
    end = body.rfind("}")
    if start < 0 or end < start:
        return None
    return body[start : end + 1]


def _decode(text: str, typed: bool = False) -> _Reply | _TypedReply:
    """The reply in ``text``, or ``_Malformed`` saying why there is none."""
    candidate = _extract_object(text)
    if candidate is None:
        raise _Malformed("the reply contains no JSON object")
    try:
        return (_typed_decoder if typed else _decoder).decode(candidate)
    except msgspec.ValidationError as exc:
        raise _Malformed(f"the JSON object does not have the expected shape: {exc}") from None
    except msgspec.DecodeError as exc:
        raise _Malformed(f"the reply is not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the decoder reads: a reply like any bad one
        raise _Malformed(
            "the reply is nested too deeply to be read: give it with fewer levels of nesting"
        ) from None


def _check(reply: _Reply | _TypedReply, tool_names: frozenset[str]) -> None:
    """Raise ``_Malformed`` unless ``reply`` has exactly one of actions and final."""
    if reply.actions is not None and reply.final is not None:
        raise _Malformed('the reply has both "actions" and "final"; give exactly one of them')
    if reply.actions is None and reply.final is None:
        raise _Malformed('the reply has neither "actions" nor "final"; give exactly one of them')
    if reply.actions is None:
        return
    if not tool_names:
        raise _Malformed(
            'no tools are available for this reply, so "actions" cannot be used; '
            'answer with "final"'
        )
    if not reply.actions:
        raise _Malformed('"actions" is empty; ask for at least one tool, or answer with "final"')
    unknown = sorted({action.tool for action in reply.actions} - tool_names)
    if unknown:
        raise _Malformed(
            f"the reply asks for unknown tool{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; the tools are: "
            f"{', '.join(map(repr, sorted(tool_names)))}"
        )


def _interpret(text: str, tool_names: frozenset[str], typed: bool = False) -> _Reply | _TypedReply:
    """The reply ``text`` stands for, or ``_Malformed`` saying why it stands for none.

    With no tools offered, text that is not a reply object is the final answer itself.
    ``typed``: a final may be any JSON value (see the module).
    """
    try:
        reply = _decode(text, typed)
    except _Malformed:
        if tool_names:
            raise
        return _Reply(final=text.strip())
    if not tool_names and reply.actions is None and reply.final is None:
        return _Reply(final=text.strip())
    _check(reply, tool_names)
    return reply


def _correction(problem: str, tools_offered: bool) -> str:
    formats = _FORMATS if tools_offered else _NO_TOOLS
    return (
        f"Your last reply could not be used: {problem}. Reply again with exactly one JSON "
        f"object and nothing else, in one of these forms:\n{formats}"
    )


def _protocol(tools: tuple[ToolSpec, ...]) -> str:
    if not tools:
        return _NO_TOOLS
    lines = [
        "You can use the tools below. Reply with exactly one JSON object and nothing else, "
        "in one of two forms.",
        _FORMATS,
        'Use exactly one of "actions" and "final". The result of each action comes back '
        'as a user message starting "Observation for call <id> (<tool>):", in the order '
        "of the actions.",
        "",
        "Tools:",
    ]
    for spec in tools:
        lines.append(f"- {spec.name}: {spec.description}")
        lines.append(f"  arguments (JSON schema): {_encoder.encode(spec.parameters).decode()}")
    return "\n".join(lines)


def _arguments(encoded: str) -> Any:
    """Tool call arguments as JSON data; text that is not JSON stays a string."""
    try:
        return msgspec.json.decode(encoded)
    except msgspec.DecodeError:
        return encoded


def _action_text(message: AssistantMessage) -> str:
    """The action JSON an assistant message with tool calls stands for."""
    shown = {
        "thought": message.content,
        "actions": [
            {"tool": c.name, "arguments": _arguments(c.arguments)} for c in message.tool_calls
        ],
    }
    return _encoder.encode(shown).decode()


def _final_text(message: AssistantMessage) -> str:
    return _encoder.encode({"thought": "", "final": message.content}).decode()


def _observation(message: ToolResultMessage) -> str:
    error = " [error]" if message.is_error else ""
    return f"Observation for call {message.call_id} ({message.name}){error}: {message.content}"


def _show(message: Message) -> Message:
    """One message of the caller's context as the inner model sees it."""
    match message:
        case AssistantMessage(tool_calls=tool_calls) if tool_calls:
            return AssistantMessage(content=_action_text(message))
        case AssistantMessage() if message.content:
            return AssistantMessage(content=_final_text(message))
        case ToolResultMessage(parts=parts):
            # The result's images and documents go with its observation, as a user
            # turn carries them: the inner model sees what the tool returned.
            return UserMessage(content=_observation(message), parts=parts)
        case _:
            return message


class ReActModel:
    """Native tool calling on top of a text-only model, with the ReAct protocol.

    ``request`` renders the context for the inner model (protocol in the system
    message, tool calls as action JSON, tool results as observations, no tool specs),
    decodes the reply into tool calls or a final answer, and corrects a malformed reply
    up to ``max_corrections`` times. With no tools offered, plain text is the answer.

    It is a ``ModelAdapter``: an agent sends every inner request through
    ``request_via``, so each correction is its own request for the supervisor,
    checked against the budget before it is sent and charged after it. Called
    through ``request`` by another model an agent calls (a user's wrapper), each
    correction is admitted by the agent's supervisor before it is sent, as one more
    request of that call.

    Usage sums every inner request (``requests`` counts them all). ``max_tokens`` caps
    the output of all attempts together: each correction gets what is left. A reply cut
    short by ``max_tokens`` that does not decode is a format failure
    (``MalformedAction``), never an answer; with no tools offered, plain text cut
    short is the answer, with ``finish_reason="length"``.
    """

    #: A typed answer comes in the text, by the agent's instructions (``"text"``).
    structured_output = False

    def __init__(self, inner: Model, *, max_corrections: int = 2, name: str | None = None) -> None:
        if isinstance(max_corrections, bool) or not isinstance(max_corrections, int):
            raise TypeError(f"max_corrections must be an int, got {max_corrections!r}")
        if max_corrections < 0:
            raise ValueError(f"max_corrections must be 0 or more, got {max_corrections}")
        if not callable(getattr(inner, "request", None)) or not isinstance(
            getattr(inner, "name", None), str
        ):
            raise TypeError(
                "ReActModel wraps a model (the Model protocol: a name and an async "
                f"request() method), got {type(inner).__qualname__}"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"ReActModel name must be a non-empty str or None, got {name!r}")
        self._inner = inner
        self.max_corrections = max_corrections
        self.name = name or f"react:{inner.name}"
        self._ids = itertools.count(1)
        self._protocol: tuple[tuple[ToolSpec, ...] | None, str] = (None, "")
        self._rendered: tuple[ModelRequest | None, tuple[Message, ...]] = (None, ())
        self._shown: dict[int, tuple[Message, Message]] = {}

    @property
    def inner(self) -> Model:
        return self._inner

    def _system(self, tools: tuple[ToolSpec, ...]) -> str:
        cached_tools, text = self._protocol
        if tools is not cached_tools:
            text = _protocol(tools)
            self._protocol = (tools, text)
        return text

    def render(self, request: ModelRequest) -> tuple[Message, ...]:
        """The inference context the inner model sees for ``request``."""
        last, rendered = self._rendered
        if request is last:
            return rendered
        protocol = self._system(request.tools)
        if request.output_schema is not None:
            protocol += _TYPED_FINAL
        messages = request.messages
        out: list[Message] = []
        first = messages[0] if messages else None
        if isinstance(first, SystemMessage):
            out.append(SystemMessage(content=f"{first.content}\n\n{protocol}"))
            messages = messages[1:]
        else:
            out.append(SystemMessage(content=protocol))
        # What the last render made of each message, keyed by identity (the message is
        # kept with it, so the id cannot be reused): a long execution re-renders only
        # the messages that are new since the previous step.
        previous = self._shown
        shown: dict[int, tuple[Message, Message]] = {}
        for message in messages:
            entry = previous.get(id(message))
            view = entry[1] if entry is not None and entry[0] is message else _show(message)
            if view is not message:
                shown[id(message)] = (message, view)
            out.append(view)
        self._shown = shown
        rendered = tuple(out)
        self._rendered = (request, rendered)
        return rendered

    def estimate_tokens(self, request: ModelRequest) -> int:
        """The inner model's estimate for the rendered request."""
        inner = ModelRequest(messages=self.render(request), max_tokens=request.max_tokens)
        return self._inner.estimate_tokens(inner)

    async def request(self, request: ModelRequest) -> ModelResponse:
        """``request_via`` with the inner model's ``request``; inside an agent's model
        call (a user's model calling this one), each inner request after the first
        is admitted by the agent's supervisor before it is sent (``admitting``)."""
        return await self.request_via(request, admitting(self._inner))

    async def request_via(self, request: ModelRequest, send: Send) -> ModelResponse:
        """Answer ``request``, sending each inner request (corrections included)
        through ``send``."""
        tool_names = frozenset(spec.name for spec in request.tools)
        typed = request.output_schema is not None
        context = list(self.render(request))  # local: corrections never leave this call
        cap = limit = request.max_tokens
        usage = Usage()
        attempts = 0
        while True:
            inner_request = ModelRequest(messages=tuple(context), max_tokens=limit)
            response = await send(inner_request)
            attempts += 1
            usage = usage + response.usage
            if response.usage.requests < 1:
                usage = msgspec.structs.replace(usage, requests=usage.requests + 1)
            text = response.text
            try:
                reply = _interpret(text, tool_names, typed)
            except _Malformed as exc:
                problem = str(exc)
                if response.finish_reason == "length":
                    problem += f"; the reply was cut at max_tokens={inner_request.max_tokens}"
                    raise MalformedAction(self.name, attempts, problem, usage) from None
                if attempts > self.max_corrections:
                    raise MalformedAction(self.name, attempts, problem, usage) from None
                if cap is not None:
                    limit = cap - usage.output_tokens
                    if limit < 1:
                        problem += (
                            f"; no output tokens are left for another attempt (max_tokens={cap})"
                        )
                        raise MalformedAction(self.name, attempts, problem, usage) from None
                context.append(AssistantMessage(content=text))
                context.append(UserMessage(content=_correction(problem, bool(tool_names))))
                continue
            final = reply.final
            if final is not None:
                if not isinstance(final, str):  # a typed answer's JSON value
                    final = _encoder.encode(final).decode()
                # A final cut short (plain text with no tools offered) says so.
                cut = response.finish_reason == "length"
                return self._answer(final, usage, "length" if cut else "stop")
            assert reply.actions is not None
            tool_calls = tuple(
                ToolCall(
                    id=f"react_{next(self._ids)}",
                    name=action.tool,
                    arguments=_encoder.encode(action.arguments).decode(),
                )
                for action in reply.actions
            )
            return ModelResponse(
                text=reply.thought,
                tool_calls=tool_calls,
                usage=usage,
                finish_reason="tool_calls",
                model=self.name,
            )

    def _answer(self, text: str, usage: Usage, finish: FinishReason) -> ModelResponse:
        return ModelResponse(text=text, usage=usage, finish_reason=finish, model=self.name)

    async def aclose(self) -> None:
        """Close the inner model."""
        await self._inner.aclose()
