"""The turns a fake model serves, and the functions that build them.

A script (``ScriptedModel``) or a function (``FunctionModel``, both in
``actors._models._fakes``) hands its model one ``Turn`` per request: a ``ModelResponse``, a
``Failure`` to raise or a ``Streamed`` response that comes in chunks. They are built
with ``reply`` (a final answer), ``call`` (one tool call), ``calls`` (several tool
calls in one step), ``streamed`` (a turn in chunks, with a delay before each) and
``fail`` (the model raises an error). What a provider would report and a turn leaves
out (call ids, usage, the ``finish_reason="length"`` truncation that ``max_tokens``
causes) the serving model fills in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import msgspec

from .._messages import ModelResponse, ToolCall, Usage
from .._parts import Media

__all__ = ["Failure", "Streamed", "Turn", "call", "calls", "fail", "reply", "streamed"]

_json_encoder = msgspec.json.Encoder()
#: The usage of a turn built without one: the serving model estimates it.
NO_USAGE = Usage()


@dataclass(frozen=True, slots=True)
class Failure:
    """A scripted model error: serving this turn raises ``error`` from ``request``.

    Built with ``fail(error)``; it takes the place of a ``ModelResponse`` in a
    ``ScriptedModel`` script or as the return value of a ``FunctionModel`` function.
    It is a test device and never crosses an actor boundary, so it is not a Struct.
    """

    error: Exception


@dataclass(frozen=True, slots=True)
class Streamed:
    """A scripted turn whose text comes in ``chunks``, ``delay`` seconds before each.

    Built with ``streamed(...)``. Streamed (``stream``), each chunk reaches the sink
    after its delay; asked in one piece (``request``), the whole answer comes after
    all the delays, as a server's would. A test device, like ``Failure``.
    """

    response: ModelResponse
    chunks: tuple[str, ...]
    delay: float


Turn: TypeAlias = ModelResponse | Failure | Streamed
"""One scripted turn: a response to serve, a ``Failure`` to raise, or a response
that comes in chunks (``Streamed``)."""


def reply(text: str, *, usage: Usage | None = None, parts: tuple[Media, ...] = ()) -> ModelResponse:
    """A final answer: ``text`` and no tool calls (``finish_reason="stop"``), with
    ``parts`` (images, documents) if given: they become ``Result.parts``.

    Without ``usage`` the serving model estimates it from the request and the text.
    """
    return ModelResponse(
        text=text, usage=NO_USAGE if usage is None else usage, finish_reason="stop", parts=parts
    )


def call(
    name: str,
    arguments: Mapping[str, object] | None = None,
    /,
    *,
    id: str | None = None,
    text: str = "",
    **kwargs: object,
) -> ModelResponse:
    """A turn asking for one tool call: ``call("get_weather", city="Paris")``.

    The arguments are the keyword arguments, JSON-encoded. An argument named ``id`` or
    ``text`` (or any name that is not an identifier) goes in the positional mapping:
    ``call("summarize", {"text": "..."})``. ``id=None`` lets the serving model assign
    a unique id (``call_1``, ``call_2``, ...). ``text`` is what the model says along
    with the call (trace, not answer).
    """
    merged: dict[str, object] = dict(arguments) if arguments is not None else {}
    merged.update(kwargs)
    try:
        encoded = _json_encoder.encode(merged).decode()
    except TypeError as exc:
        raise TypeError(f"the arguments of call {name!r} are not JSON-encodable: {exc}") from exc
    tool_call = ToolCall(id=id or "", name=name, arguments=encoded)
    return ModelResponse(text=text, tool_calls=(tool_call,), finish_reason="tool_calls")


def calls(*turns: ModelResponse, text: str = "") -> ModelResponse:
    """One turn asking for the tool calls of several ``call(...)`` turns at once.

    The calls of one step run concurrently. ``text`` defaults to the texts of the
    merged turns, joined by newlines. Raises ``ValueError`` for a turn without tool
    calls, for no turns at all and for an explicit id given twice.
    """
    if not turns:
        raise ValueError("calls() needs at least one call(...) turn to merge")
    merged: list[ToolCall] = []
    texts: list[str] = []
    seen: set[str] = set()
    for index, turn in enumerate(turns):
        if not isinstance(turn, ModelResponse) or not turn.tool_calls:
            raise ValueError(
                f"calls() merges tool calls, but turn {index} ({turn!r}) has none; "
                "build each turn with call(name, **arguments)"
            )
        for tool_call in turn.tool_calls:
            if tool_call.id:
                if tool_call.id in seen:
                    raise ValueError(
                        f"calls() got the tool call id {tool_call.id!r} twice; "
                        "the ids of one turn must be unique (or left out)"
                    )
                seen.add(tool_call.id)
            merged.append(tool_call)
        if turn.text:
            texts.append(turn.text)
    return ModelResponse(
        text=text or "\n".join(texts), tool_calls=tuple(merged), finish_reason="tool_calls"
    )


def streamed(
    turn: str | ModelResponse, *, chunks: int | Sequence[str] = 4, delay: float = 0.0
) -> Streamed:
    """A turn that comes in pieces: ``streamed("Sunny in Paris.", chunks=3, delay=0.05)``.

    ``turn`` is the answer's text (a final answer, as ``reply`` makes) or any turn
    built with ``reply`` or ``call`` (its text is what streams). ``chunks`` is how
    many pieces of about the same size to cut the text into, or the pieces
    themselves (they must join to the text). ``delay`` is the seconds before each.
    """
    response = reply(turn) if isinstance(turn, str) else turn
    if not isinstance(response, ModelResponse):
        raise TypeError(f"streamed() takes a text or a reply(...)/call(...) turn, got {turn!r}")
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0:
        raise ValueError(f"streamed(): delay must be a number of seconds >= 0, got {delay!r}")
    text = response.text
    if isinstance(chunks, int) and not isinstance(chunks, bool):
        if chunks < 1:
            raise ValueError(f"streamed(): chunks must be >= 1, got {chunks}")
        size = max(1, -(-len(text) // chunks))
        pieces = tuple(text[i : i + size] for i in range(0, len(text), size)) or ("",)
    elif isinstance(chunks, Sequence) and not isinstance(chunks, str):
        pieces = tuple(chunks)
        if not pieces or not all(isinstance(piece, str) for piece in pieces):
            raise TypeError(f"streamed(): chunks must be texts, got {chunks!r}")
        if "".join(pieces) != text:
            raise ValueError(
                f"streamed(): the chunks join to {''.join(pieces)!r}, not the turn's text {text!r}"
            )
    else:
        raise TypeError(
            f"streamed(): chunks must be a count or a sequence of texts, got {chunks!r}"
        )
    return Streamed(response=response, chunks=pieces, delay=float(delay))


def fail(error: Exception) -> Failure:
    """A turn that makes the model raise ``error`` when it is served."""
    if not isinstance(error, Exception):
        raise TypeError(f"fail() takes an exception instance, got {error!r}")
    return Failure(error=error)
