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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from fractor.runtime import BudgetExceeded

from ._messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    SummaryRecord,
    SystemMessage,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
    exception_text,
    safe_text,
)
from ._models import Model
from ._recording import EMPTY_USAGE
from ._requests import send

if TYPE_CHECKING:
    from ._policy import RetryPolicy
    from ._recording import Recorder

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

DEFAULT_SUMMARY_INSTRUCTIONS = (
    "You keep the memory of a conversation between a user and an assistant. Write a "
    "summary the assistant can rely on in place of the turns you are given: the "
    "user's goals and preferences, the facts, names, numbers and decisions in them, "
    "the answers given, and what is still open. Merge the summary so far into it, "
    "if there is one. Write the summary only, as plain text."
)

#: Characters per token of the conversation's estimate, and tokens per message.
_CHARS_PER_TOKEN = 4
_PER_MESSAGE = 4


def conversation_tokens(messages: list[Message] | tuple[Message, ...]) -> int:
    """An estimate of the tokens of ``messages``: a token per four characters of each
    message (rounded up) and four per message (providers count their own way: this
    decides when to fold). Per message, so that counting a conversation as it grows
    (``Tally``) gives what counting it whole does."""
    return sum(_tokens_of(len(message.content)) for message in messages) + _PER_MESSAGE * len(
        messages
    )


def _tokens(text: str) -> int:
    return _tokens_of(len(text))


def _tokens_of(chars: int) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class Compaction:
    """When and how an agent folds old turns of its conversation into its summary.

    ``threshold``: the estimated tokens of the conversation (user turns and final
    answers, the new task included: ``conversation_tokens``) from which it
    compacts. ``keep``: how many of the most recent turns (user/answer pairs) stay
    verbatim; the new task's turn comes on top of them. ``model``: the summarizer
    (None: the agent's own). ``instructions``: the summarizer's system prompt; its
    request is marked ``ModelRequest.purpose == "summary"``. ``max_tokens``: the cap
    of the summary's length, in tokens.
    """

    threshold: int = 8_000
    keep: int = 4
    model: Model | None = None
    instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS
    max_tokens: int = 1_000
    clear_results: int | None = None

    def __post_init__(self) -> None:
        checked = [("threshold", 1), ("keep", 0), ("max_tokens", 1)]
        if self.clear_results is not None:
            checked.append(("clear_results", 1))
        for name, minimum in checked:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(
                    f"Compaction.{name} must be a whole number >= {minimum}, got {value!r}"
                )
        if not isinstance(self.instructions, str) or not self.instructions.strip():
            raise ValueError("Compaction.instructions must be a non-empty str")
        object.__setattr__(self, "instructions", safe_text(self.instructions))  # from outside
        if self.model is not None and not callable(getattr(self.model, "request", None)):
            raise TypeError(
                "Compaction.model must implement the Model protocol (an async "
                f"request() method) or be None, got {type(self.model).__qualname__}"
            )

    def plan(
        self,
        messages: list[Message],
        tally: Tally,
        task: str,
        summary: list[Message],
        summarized: int,
    ) -> Fold | None:
        """The fold to do before an execution of ``task``, or None: the conversation
        with it is within ``threshold``, or no turn older than the last ``keep``."""
        pairs = len(messages) // 2
        turns = pairs - self.keep
        if turns < 1:
            return None
        with_task = tally.of(messages) + _tokens(task) + _PER_MESSAGE
        if with_task < self.threshold:
            return None
        folded = tuple(messages[: 2 * turns])
        earlier = "\n\n".join(_text(message.content) for message in summary)
        request = self._request(earlier, folded, summarized)
        return Fold(turns=turns, covered=summarized, messages=folded, request=request)

    def _request(self, earlier: str, folded: tuple[Message, ...], summarized: int) -> ModelRequest:
        parts: list[str] = []
        if earlier:
            parts.append(f"The summary so far (turns 1 to {summarized}):\n{earlier}")
        first = summarized + 1
        last = summarized + len(folded) // 2
        lines = [f"The turns to fold in (turns {first} to {last}):"]
        for message in folded:
            speaker = "User" if isinstance(message, UserMessage) else "Assistant"
            lines.append(f"{speaker}: {message.content}")
        parts.append("\n".join(lines))
        return ModelRequest(
            messages=(
                SystemMessage(content=self.instructions),
                UserMessage(content="\n\n".join(parts)),
            ),
            max_tokens=self.max_tokens,
            purpose="summary",
        )


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


class Tally:
    """An agent's conversation's ``conversation_tokens``, counted as it grows: each
    message once (all again after a fold or a load, when the start changed)."""

    __slots__ = ("counted", "tokens")

    def __init__(self) -> None:
        self.counted = 0
        self.tokens = 0

    def of(self, messages: list[Message]) -> int:
        counted = self.counted
        if counted < len(messages):
            self.tokens += conversation_tokens(messages[counted:])
            self.counted = len(messages)
        return self.tokens

    def restart(self) -> None:
        """The conversation lost messages at its start: count it all again."""
        self.counted = self.tokens = 0


@dataclass(frozen=True, slots=True)
class Fold:
    """One compaction to do: the oldest ``turns`` pairs (``messages``), the summary
    covering ``covered`` turns before it, and the summarization ``request``."""

    turns: int
    covered: int
    messages: tuple[Message, ...]
    request: ModelRequest


_HEADING = "Summary of the conversation before the turns below"


def summary_section(text: str, covered: int) -> SystemMessage:
    """The summary section's one message: the summary of the first ``covered`` turns."""
    return SystemMessage(content=f"{_HEADING} ({covered} earlier turns):\n{text}")


def _text(content: str) -> str:
    """The summary in a summary section's message, without its heading."""
    if content.startswith(_HEADING):
        return content.partition("\n")[2]
    return content


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
                response = await send(recorder, model, request, retry, once=True)
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
                "compaction",
                ok=not error,
                turns=fold.turns,
                covered=covered,
                input_tokens=record.usage.input_tokens,
                output_tokens=record.usage.output_tokens,
                error=error[:300],
            )


def _inner(model: Model) -> Model:
    """The model a summarization goes to: an adapter's inner model (its own format
    is for tool calls), else the model itself."""
    inner = getattr(model, "inner", None)
    return inner if inner is not None else model
