"""Compaction of an agent's conversation into its summary section
(``Agent(memory=Compaction(...))``).

Before an execution, when the conversation (user turns and final answers) with the
new task is estimated past ``threshold`` tokens, its oldest turns, whole user/answer
pairs only, are folded into the **summary** section with one summarization request,
and the last ``keep`` turns stay verbatim. The summarizer (``model``, by default the
agent's own; an adapter's inner model) reads ``instructions`` as its system prompt
and, in one user message, the summary so far and the turns to fold; its text becomes
the summary section (one ``SystemMessage``, right after the agent's instructions).

The request belongs to the execution (``Summarizer``, a part it holds): checked and charged
by the supervisor like any other, under its deadline, traced as its
``SummaryRecord``, announced as a ``compaction`` event. It is optional work: sent
only with room for itself and the step it is done for, and sent once (never retried:
a retry would spend the step's room, and a summarizer that keeps failing would pay
the agent's whole retry policy at every ask; the next ask tries again). Refused by
the budget, failed, or answered with no text, it changes nothing: the execution goes
on with the whole conversation and the event (and the record) says why. Nothing is
ever lost: the turns are dropped only once their summary is in place.

The configuration and what it plans (``Compaction``, ``Fold``, ``Tally``) are written
in ``actors._memory._compaction``, below the agent's definition that holds them, and
re-exported here; this module sends the request (``Summarizer``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from fractor.runtime import BudgetExceeded

from .._execution._recording import EMPTY_USAGE
from .._messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    SummaryRecord,
    ToolResultMessage,
    ToolSpec,
    exception_text,
    safe_text,
)
from .._models._protocol import Model
from .._observation._events import CompactionEnd
from .._requests import build
from ._compaction import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    Compaction,
    Fold,
    Tally,
    conversation_tokens,
    summary_section,
)

if TYPE_CHECKING:
    from .._agent._policy import RetryPolicy
    from .._execution._recording import Recorder

__all__ = [
    "DEFAULT_SUMMARY_INSTRUCTIONS",
    "Compaction",
    "Fold",
    "Summarizer",
    "Tally",
    "clear_results",
    "conversation_tokens",
    "summary_section",
]


def clear_results(buffer: list[Message], keep: int, cleared: int) -> int:
    """Clear the results of the tool steps of an execution ``buffer`` but the last
    ``keep`` (``cleared`` of them are already): each result longer than its note is
    replaced by a note of its size, call and error flag kept, so each call still has
    its result (invariant 3). The number of tool steps cleared now; 0: none more."""
    steps = [
        (i, len(message.tool_calls))
        for i, message in enumerate(buffer)
        if isinstance(message, AssistantMessage) and message.tool_calls
    ]
    if len(steps) - keep <= cleared:
        return 0
    for start, calls in steps[cleared : len(steps) - keep]:
        for index in range(start + 1, start + 1 + calls):
            result = buffer[index]
            if isinstance(result, ToolResultMessage):
                note = f"[cleared: {len(result.content):,} characters of an earlier step's result]"
                if len(result.content) > len(note):
                    buffer[index] = msgspec.structs.replace(result, content=note)
    return len(steps) - keep


class Summarizer:
    """The summarization request an execution begins with when its agent folds old
    turns (see the module): a part the ``Execution`` holds when it has a ``fold`` to
    do. ``compacted`` folds the turns into the agent's sections once the summary
    came, and gives the execution's new history; ``record`` is the summarization's
    ``SummaryRecord`` once sent (or refused, or cut off).
    """

    __slots__ = ("compacted", "fold", "memory", "model", "record")

    def __init__(
        self,
        fold: Fold,
        memory: Compaction,
        model: Model,
        compacted: Callable[[Fold, str], tuple[Message, ...]],
    ) -> None:
        self.fold = fold
        self.memory = memory
        #: The agent's model: the summarizer's by default (an adapter's inner one),
        #: and the estimate of the step the summary is done for.
        self.model = model
        self.compacted = compacted
        self.record: SummaryRecord | None = None

    async def run(
        self,
        recorder: Recorder,
        history: tuple[Message, ...],
        buffer: list[Message],
        specs: tuple[ToolSpec, ...],
        retry: RetryPolicy,
    ) -> tuple[Message, ...] | None:
        """Send the fold's summarization request (through ``recorder``, the
        execution's, whose node it is charged to); on success the agent's sections
        are compacted and the new ``history`` is returned, else None (nothing
        changed). Never raises an ``Exception`` but a stop of the supervisor's
        (``BudgetExceeded``)."""
        fold = self.fold
        memory = self.memory
        model = memory.model or _inner(self.model)
        request = fold.request
        began = time.perf_counter()
        recorder.charged = EMPTY_USAGE
        refused = None
        node = recorder.node
        if node.limited or node.stop_status is not None:
            # Optional work: only with room for itself and the step it is done for.
            folded = {id(message) for message in fold.messages}
            kept = tuple(m for m in history if id(m) not in folded)
            step = ModelRequest(messages=(*kept, *buffer), tools=specs)
            refused = recorder.supervisor.would_refuse(
                node,
                input_estimate=model.estimate_tokens(request)
                + self.model.estimate_tokens(step)
                + memory.max_tokens,
                max_tokens=request.max_tokens,
                model=model.name,
                requests=2,
            )
        text = error = ""
        sink, recorder.sink = recorder.sink, None  # the summary is not the agent's text
        try:
            if refused is not None:
                error = f"refused: {refused}"
            else:
                # Once: a retry would spend the room checked for the step, and a
                # summarizer that keeps failing would pay the retry policy every ask.
                # (A stack of its own, built here: a summarization is rare.)
                response = await build(model, retry, once=True).send(recorder, request)
                text = safe_text(response.text).strip()
                if not text:
                    error = f"the summarizer answered no text ({response.finish_reason})"
        except BudgetExceeded as exc:  # the budget was spent meanwhile: a stop
            self._summarized(recorder, model.name, began, "", f"refused: {exc}")
            raise
        except Exception as exc:
            error = f"the summarization request failed: {exception_text(exc)}"
        except BaseException:  # cut off: a deadline, a stop, a cancellation
            self._summarized(recorder, model.name, began, "", "cut off before the summary came")
            raise
        finally:
            recorder.sink = sink
        compacted = None if error else self.compacted(fold, text)
        self._summarized(recorder, model.name, began, text, error)
        return compacted

    def _summarized(
        self, recorder: Recorder, model: str, began: float, text: str, error: str
    ) -> None:
        """Keep the summarization's record and say how it went."""
        fold = self.fold
        covered = fold.covered + (0 if error else fold.turns)
        record = self.record = SummaryRecord(
            turns=fold.turns,
            covered=covered,
            input_messages=len(fold.request.messages),
            summary=text,
            usage=recorder.charged,
            seconds=time.perf_counter() - began,
            model=model,
            error=error,
        )
        if recorder.observed:
            recorder.emit(
                CompactionEnd(
                    ok=not error,
                    turns=fold.turns,
                    covered=covered,
                    input_tokens=record.usage.input_tokens,
                    output_tokens=record.usage.output_tokens,
                    error=error[:300],
                )
            )


def _inner(model: Model) -> Model:
    """The model a summarization goes to: an adapter's inner model (its own format
    is for tool calls), else the model itself."""
    inner = getattr(model, "inner", None)
    return inner if inner is not None else model
