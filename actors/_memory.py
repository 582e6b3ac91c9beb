"""Compaction of an agent's conversation into its summary section
(``Agent(memory=Compaction(...))``).

Before an execution, when the conversation (user turns and final answers) with the
new task is estimated past ``threshold`` tokens, its oldest turns, whole user/answer
pairs only, are folded into the **summary** section with one summarization request,
and the last ``keep`` turns stay verbatim. The summarizer (``model``, by default the
agent's own; an adapter's inner model) reads ``instructions`` as its system prompt
and, in one user message, the summary so far and the turns to fold; its text becomes
the summary section (one ``SystemMessage``, right after the agent's instructions).

The request belongs to the execution (``Execution._summarize``): checked and charged
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
from typing import TYPE_CHECKING, Any, Protocol, cast

import msgspec

from fractor.runtime import BudgetExceeded, EventKind, Node, Supervisor, Usage

from ._messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    SummaryRecord,
    SystemMessage,
    ToolResultMessage,
    UserMessage,
    exception_text,
    safe_text,
)
from ._models import Model
from ._requests import EMPTY_USAGE, send

if TYPE_CHECKING:
    from ._agent import Agent
    from ._execution import Execution

__all__ = [
    "DEFAULT_SUMMARY_INSTRUCTIONS",
    "Compaction",
    "Fold",
    "Summarizing",
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


class _Summarizing(Protocol):
    """What the summarization uses of a running ``Execution``."""

    agent: Agent
    node: Node
    supervisor: Supervisor
    history: tuple[Message, ...]
    buffer: list[Message]
    fold: Fold | None
    compacted: Callable[[Fold, str], tuple[Message, ...]] | None
    summarization: SummaryRecord | None
    sink: Callable[[str], None] | None
    charged: Usage

    @property
    def observed(self) -> bool: ...

    def emit(self, kind: EventKind, **detail: Any) -> None: ...

    def _summarized(self, fold: Fold, model: str, began: float, text: str, error: str) -> None: ...


class Summarizing:
    """The summarization request an ``Execution`` begins with when its agent folds
    old turns (a mixin: see the module)."""

    __slots__ = ()
    # Set by Execution; declared for the assignments below.
    sink: Callable[[str], None] | None
    summarization: SummaryRecord | None

    async def _summarize(self: _Summarizing) -> None:
        """Send the fold's summarization request; on success the agent's sections
        are compacted (``compacted``) and the history is theirs. Never raises an
        ``Exception`` but a stop of the supervisor's (``BudgetExceeded``)."""
        fold = self.fold
        assert fold is not None
        assert self.compacted is not None
        memory = self.agent.memory
        assert memory is not None
        model = memory.model or _inner(self.agent.model)
        request = fold.request
        began = time.perf_counter()
        self.charged = EMPTY_USAGE
        refused = None
        node = self.node
        if node.limited or node.stop_status is not None:
            # Optional work: only with room for itself and the step it is done for.
            folded = {id(message) for message in fold.messages}
            kept = tuple(m for m in self.history if id(m) not in folded)
            step = ModelRequest(messages=(*kept, *self.buffer), tools=self.agent.specs)
            refused = self.supervisor.would_refuse(
                node,
                input_estimate=model.estimate_tokens(request)
                + self.agent.model.estimate_tokens(step)
                + memory.max_tokens,
                max_tokens=request.max_tokens,
                model=model.name,
                requests=2,
            )
        text = error = ""
        sink, self.sink = self.sink, None  # the summary is not the agent's text
        try:
            if refused is not None:
                error = f"refused: {refused}"
            else:
                # Once: a retry would spend the room checked for the step, and a
                # summarizer that keeps failing would pay the retry policy every ask.
                response = await send(cast("Execution", self), model, request, once=True)
                text = safe_text(response.text).strip()
                if not text:
                    error = f"the summarizer answered no text ({response.finish_reason})"
        except BudgetExceeded as exc:  # the budget was spent meanwhile: a stop
            self._summarized(fold, model.name, began, "", f"refused: {exc}")
            raise
        except Exception as exc:
            error = f"the summarization request failed: {exception_text(exc)}"
        except BaseException:  # cut off: a deadline, a stop, a cancellation
            self._summarized(fold, model.name, began, "", "cut off before the summary came")
            raise
        finally:
            self.sink = sink
        if not error:
            self.history = self.compacted(fold, text)
        self._summarized(fold, model.name, began, text, error)

    def _summarized(
        self: _Summarizing, fold: Fold, model: str, began: float, text: str, error: str
    ) -> None:
        """Keep the summarization's record and say how it went."""
        covered = fold.covered + (0 if error else fold.turns)
        record = self.summarization = SummaryRecord(
            turns=fold.turns,
            covered=covered,
            input_messages=len(fold.request.messages),
            summary=text,
            usage=self.charged,
            seconds=time.perf_counter() - began,
            model=model,
            error=error,
        )
        if self.observed:
            self.emit(
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
