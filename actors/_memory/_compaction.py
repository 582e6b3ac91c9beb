"""``Compaction``: when and how an agent folds old turns of its conversation into
its summary section (``Agent(memory=Compaction(...))``), and what it plans: a
``Fold`` (which turns, and the summarization request), from the conversation's
estimated tokens (``conversation_tokens``, counted as it grows by a ``Tally``).

This is the configuration an agent definition holds, below it: it imports nothing
of the running side. The request itself is sent by the execution's ``Summarizer``
(``actors._memory._summarizer``, where the whole mechanism is described), which re-exports these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._messages import (
    Message,
    ModelRequest,
    SystemMessage,
    UserMessage,
    parts_tokens,
    safe_text,
)
from .._models._protocol import Model
from .._parts import describe_part

__all__ = [
    "DEFAULT_SUMMARY_INSTRUCTIONS",
    "Compaction",
    "Fold",
    "Tally",
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
    decides when to fold), and the images and documents of its user turns as
    ``part_tokens`` counts them. Per message, so that counting a conversation as it
    grows (``Tally``) gives what counting it whole does."""
    return (
        sum(_tokens_of(len(message.content)) for message in messages)
        + _PER_MESSAGE * len(messages)
        + parts_tokens(messages)
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
        named = False
        for message in folded:
            speaker = "User" if isinstance(message, UserMessage) else "Assistant"
            lines.append(f"{speaker}: {message.content}")
            if isinstance(message, UserMessage) and message.parts:
                # Never the bytes: each image or document by its one line.
                named = True
                lines.extend(f"  (attached: {describe_part(part)})" for part in message.parts)
        if named:
            lines.append(_NAMED_PARTS)
        parts.append("\n".join(lines))
        return ModelRequest(
            messages=(
                SystemMessage(content=self.instructions),
                UserMessage(content="\n\n".join(parts)),
            ),
            max_tokens=self.max_tokens,
            purpose="summary",
        )


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

#: Said in a summary request whose turns had images or documents (named, not shown).
_NAMED_PARTS = (
    "(Attachments are named, not shown: the summary replaces these turns and their "
    "attachments leave the conversation; keep each name, e.g. [image ... sha256:...], "
    "that later turns may need, and say what it showed if the turns say.)"
)


def summary_section(text: str, covered: int) -> SystemMessage:
    """The summary section's one message: the summary of the first ``covered`` turns."""
    return SystemMessage(content=f"{_HEADING} ({covered} earlier turns):\n{text}")


def _text(content: str) -> str:
    """The summary in a summary section's message, without its heading."""
    if content.startswith(_HEADING):
        return content.partition("\n")[2]
    return content
