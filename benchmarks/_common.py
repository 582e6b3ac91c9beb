"""What the agent workloads share: one scripted model, tools, and the raw baseline.

Both sides run the same scripted turns, decode the same JSON tool arguments, run each
step's tool calls in one task group and append to a history. The raw loop is the
floor: a plain hand-written anyio loop, with nothing deliberately slow in it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import msgspec

from fractor.actors import (
    AssistantMessage,
    CycleModel,
    Message,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)

__all__ = ["CycleModel", "fanout_turns", "raw_execution", "step_turns"]

_USAGE = Usage(input_tokens=10, output_tokens=5, requests=1)


def _calls(name: str, k: int, step: int = 0) -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(id=f"call_{step}_{i}", name=name, arguments=f'{{"x": {i}}}') for i in range(k)
    )


def fanout_turns(tool: str, k: int) -> list[ModelResponse]:
    """One step with ``k`` calls of ``tool``, then a final answer."""
    return [
        ModelResponse(tool_calls=_calls(tool, k), usage=_USAGE, finish_reason="tool_calls"),
        ModelResponse(text="done", usage=_USAGE),
    ]


def step_turns(tool: str, steps: int) -> list[ModelResponse]:
    """``steps`` steps of one call each, then a final answer."""
    turns = [
        ModelResponse(tool_calls=_calls(tool, 1, s), usage=_USAGE, finish_reason="tool_calls")
        for s in range(steps)
    ]
    turns.append(ModelResponse(text="done", usage=_USAGE))
    return turns


class _Args(msgspec.Struct, frozen=True):
    """Tool arguments (``x``) or a delegated task (``task``), decoded like fractor does."""

    x: int = 0
    task: str = ""


_decode_args = msgspec.json.Decoder(_Args).decode


async def _call_into(
    results: list[Any], index: int, call: ToolCall, tool: Callable[[int], Awaitable[Any]]
) -> None:
    results[index] = await tool(_decode_args(call.arguments.encode()).x)


async def raw_execution(
    turns: Sequence[ModelResponse],
    tool: Callable[[int], Awaitable[Any]],
    conversation: list[Message],
    task: str = "task",
) -> str:
    """The hand-written loop: the same turns, decoding, task group and history.

    Like any real loop, each model request gets the whole context (the conversation
    plus this execution's tool calls and results); only the final answer is kept.
    """
    conversation.append(UserMessage(content=task))
    buffer: list[Message] = []
    for turn in turns:
        context = [*conversation, *buffer]  # what a request to a model would carry
        await anyio.lowlevel.checkpoint()  # the model request
        del context
        calls = turn.tool_calls
        if not calls:
            conversation.append(AssistantMessage(content=turn.text))
            return turn.text
        results: list[Any] = [None] * len(calls)
        if len(calls) == 1:
            await _call_into(results, 0, calls[0], tool)
        else:
            async with anyio.create_task_group() as tg:
                for index, call in enumerate(calls):
                    tg.start_soon(_call_into, results, index, call, tool)
        buffer.append(AssistantMessage(content=turn.text, tool_calls=calls))
        buffer.extend(
            ToolResultMessage(call_id=call.id, name=call.name, content=str(result))
            for call, result in zip(calls, results, strict=True)
        )
    return ""
