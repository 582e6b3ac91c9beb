"""Memory (issue 19): turn 1,000 of one long conversation, with and without compaction.

One agent, asked 1,000 times in sequence (200-character tasks), over a zero-latency
``FunctionModel`` that answers each task in 200 characters and each summarization
request (recognised by its system message, the ``Compaction``'s instructions) with a
summary of 1,000 characters. Once without memory, once with
``Compaction(threshold=4_000, keep=8)``. A turn (task and answer) is 108 estimated
tokens, so the conversation folds when it holds 37 turns, down to the last 8: a
summarization every 29 turns, 34 of them in 1,000 turns (many cycles, and each window
of 50 turns below spans more than one, so no figure depends on where in the cycle it
falls), each one folding real work. The context then stays under 4,300 estimated
tokens, a size a small model takes, where without compaction it reaches 108,000.

The baseline is a hand-written anyio loop, without compaction: a Python list for the
conversation, the same context tuple built per turn, and the same function of the fake
called directly (after the same checkpoint the fake takes). What is reported:

- the context of the last turn's step request: its messages (in the row's name) and
  its estimated tokens (``estimate_tokens``), and with compaction the peak over every
  turn, whose bound is ``threshold`` plus the summary section plus the new task's
  message (the plan folds before the conversation with the task reaches ``threshold``);
- the time per step (one ask answered in one step) at turn 1,000: the mean wall time
  of an ``await ref.ask(task)`` over the last ``WINDOW`` turns, the turns that began
  with a summarization request left out (they are reported on their own row), and the
  amortized time per turn over the last ``AMORTIZED`` turns, those included;
- flatness, as in W2: the time per step at turn 1,000 over the time per step around
  turn 50 (turns 26 to 75), in the same run, with compaction (target) and without
  (reported); the baseline column is the raw loop's own growth. Without compaction
  fractor's step stays flat too: with no budget, no request's input estimate is made
  (it would read the whole context), and the context is one tuple concatenation.

Every figure is the median over ``repeats`` runs, each run doing the three
conversations one after the other; every ratio is against the raw loop at turn 1,000.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import anyio
import msgspec

from fractor.actors import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    Agent,
    AssistantMessage,
    Compaction,
    FunctionModel,
    Message,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    Usage,
    UserMessage,
    estimate_tokens,
)
from fractor.runtime import Runtime

from ._harness import Row, judged, summarize

__all__ = ["FLAT_TARGET", "KEEP", "THRESHOLD", "Conversation", "converse", "raw", "run"]

#: The compaction measured: about 37 turns of 108 tokens, down to the last 8.
THRESHOLD = 4_000
KEEP = 8
#: Per step at turn 1,000 over per step around turn 50, with compaction: at most this.
FLAT_TARGET = 1.2
TASK_CHARS = 200
ANSWER_CHARS = 200
SUMMARY_CHARS = 1_000
#: The turns the time per step is the mean of (the last ones, and around turn 50).
WINDOW = 50
EARLY = 50
#: The last turns the amortized time per turn (summarizations included) is taken over.
AMORTIZED = 100

_USAGE = Usage(input_tokens=10, output_tokens=ANSWER_CHARS // 4, requests=1)
_SUMMARY_USAGE = Usage(input_tokens=10, output_tokens=SUMMARY_CHARS // 4, requests=1)


class Fake:
    """The fake's function: a fixed answer to a task, a fixed summary to a
    summarization request; it counts the summarizations it answered."""

    def __init__(self) -> None:
        self.summaries = 0
        self.answer = ModelResponse(text="a" * ANSWER_CHARS, usage=_USAGE)
        self.summary = ModelResponse(text="s" * SUMMARY_CHARS, usage=_SUMMARY_USAGE)

    def __call__(self, request: ModelRequest) -> ModelResponse:
        first = request.messages[0]
        if type(first) is SystemMessage and first.content == DEFAULT_SUMMARY_INSTRUCTIONS:
            self.summaries += 1
            return self.summary
        return self.answer


def task(turn: int) -> str:
    """The user's text of ``turn`` (1-based): ``TASK_CHARS`` characters."""
    head = f"turn {turn}: "
    return head + "u" * (TASK_CHARS - len(head))


@dataclass
class Conversation:
    """One conversation's measurements: per turn, the seconds of its ask and whether
    it began with a summarization; the last step request's context, and the peak."""

    seconds: list[float] = field(default_factory=list)
    summarized: list[bool] = field(default_factory=list)
    messages: int = 0
    tokens: int = 0
    peak: int = 0
    #: Turns the summary covers at the end, and the summary section's tokens.
    covered: int = 0
    summary_tokens: int = 0

    def per_step(self, first: int, last: int) -> float:
        """Mean seconds per ask of turns ``first`` to ``last`` (1-based, inclusive),
        the turns with a summarization left out."""
        span = zip(self.seconds[first - 1 : last], self.summarized[first - 1 : last], strict=True)
        return statistics.mean(s for s, folded in span if not folded)

    def at_end(self) -> float:
        turns = len(self.seconds)
        return self.per_step(turns - WINDOW + 1, turns)

    def early(self) -> float:
        return self.per_step(EARLY - WINDOW // 2 + 1, EARLY + WINDOW // 2)

    def amortized(self) -> float:
        return statistics.mean(self.seconds[-AMORTIZED:])

    def folding(self) -> float:
        """Mean seconds of the asks that began with a summarization, last turns."""
        span = zip(self.seconds[-AMORTIZED:], self.summarized[-AMORTIZED:], strict=True)
        return statistics.mean(s for s, folded in span if folded)


async def converse(turns: int, memory: Compaction | None) -> Conversation:
    """``turns`` asks of one agent, each timed on its own."""
    fake = Fake()
    # Only the last request kept: a fake recording 1,000 contexts would hold them all.
    model = FunctionModel(fake, name="memory", record=1)
    out = Conversation()
    clock = time.perf_counter
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("chat", model, memory=memory))
        for turn in range(1, turns + 1):
            text = task(turn)
            before = fake.summaries
            began = clock()
            result = await ref.ask(text)
            out.seconds.append(clock() - began)
            out.summarized.append(fake.summaries != before)
            if not result.ok:
                raise RuntimeError(
                    f"memory: turn {turn} ended {result.status}: {result.stop_reason}"
                )
            if memory is not None:  # a bounded context: cheap to measure every turn
                out.peak = max(out.peak, estimate_tokens(model.requests[-1]))
        last = model.requests[-1]
        out.messages = len(last.messages)
        out.tokens = estimate_tokens(last)
        out.peak = max(out.peak, out.tokens)
        conversation = await ref.conversation()
        out.covered = conversation.summarized
        if conversation.summary:
            out.summary_tokens = estimate_tokens(ModelRequest(messages=conversation.summary))
    if memory is not None and out.covered == 0:
        raise RuntimeError(f"memory: {turns} turns and nothing was compacted")
    return out


async def raw(turns: int) -> Conversation:
    """The hand-written loop: a list, the context tuple per turn, the same function."""
    fake = Fake()
    out = Conversation()
    clock = time.perf_counter
    conversation: list[Message] = []
    context: tuple[Message, ...] = ()
    for turn in range(1, turns + 1):
        text = task(turn)
        began = clock()
        conversation.append(UserMessage(content=text))
        context = tuple(conversation)
        await anyio.lowlevel.checkpoint()  # the model request, as the fake takes it
        response = fake(ModelRequest(messages=context))
        conversation.append(AssistantMessage(content=response.text))
        out.seconds.append(clock() - began)
        out.summarized.append(False)
    out.messages = len(context)
    out.tokens = out.peak = estimate_tokens(ModelRequest(messages=context))
    return out


def _row(
    workload: str, unit: str, ours: list[float], base: list[float], target: str, holds: bool
) -> Row:
    return judged(summarize(workload, unit, ours, base, better="lower"), target, holds)


def _growth(workload: str, ours: list[float], base: list[float], target: str, holds: bool) -> Row:
    """A ratio of a run's own figures: the fractor column is the row's ratio (as W2)."""
    row = summarize(workload, "x", ours, base, better="lower")
    return msgspec.structs.replace(row, ratio=row.fractor, target=target, holds=holds)


async def run(
    *, quick: bool = False, turns: int | None = None, repeats: int | None = None
) -> list[Row]:
    if turns is None:
        turns = 200 if quick else 1_000
    if repeats is None:
        repeats = 2 if quick else 5
    if turns < EARLY + WINDOW:
        raise ValueError(f"memory: at least {EARLY + WINDOW} turns, got {turns}")
    compaction = Compaction(threshold=THRESHOLD, keep=KEEP)
    await converse(EARLY + WINDOW, None)  # warm-up
    await converse(EARLY + WINDOW, compaction)
    await raw(EARLY + WINDOW)
    none: list[Conversation] = []
    folded: list[Conversation] = []
    loop: list[Conversation] = []
    for _ in range(repeats):
        none.append(await converse(turns, None))
        folded.append(await converse(turns, compaction))
        loop.append(await raw(turns))
    return _rows(turns, none, folded, loop)


def _rows(
    turns: int, none: list[Conversation], folded: list[Conversation], loop: list[Conversation]
) -> list[Row]:
    at = f"Memory T={turns:,}"
    base_step = [c.at_end() for c in loop]
    base_tokens = [float(c.tokens) for c in loop]
    plain, last = none[-1], folded[-1]  # the contexts are the same every run
    bound = THRESHOLD + last.summary_tokens + 4  # + the new task's message, see above
    same = all(
        c.tokens == r.tokens and c.messages == r.messages for c, r in zip(none, loop, strict=True)
    )
    flat = statistics.median(c.at_end() / c.early() for c in folded)
    return [
        _row(
            f"{at} context, none ({plain.messages:,} msgs)",
            "tokens",
            [float(c.tokens) for c in none],
            base_tokens,
            "== raw",
            same,
        ),
        _row(
            f"{at} context, compaction ({last.messages} msgs)",
            "tokens",
            [float(c.tokens) for c in folded],
            base_tokens,
            "reported",
            True,
        ),
        _row(
            "  peak context over every turn, compaction",
            "tokens",
            [float(c.peak) for c in folded],
            base_tokens,
            f"<= {THRESHOLD:,} + summary + task ({bound:,})",
            max(c.peak for c in folded) <= bound,
        ),
        _row(f"{at} per step, none", "s", [c.at_end() for c in none], base_step, "reported", True),
        _row(
            f"{at} per step, compaction",
            "s",
            [c.at_end() for c in folded],
            base_step,
            "reported",
            True,
        ),
        _row(
            f"  amortized, last {AMORTIZED} turns, compaction",
            "s",
            [c.amortized() for c in folded],
            base_step,
            "reported",
            True,
        ),
        _row(
            "  a turn with its summarization",
            "s",
            [c.folding() for c in folded],
            base_step,
            "reported",
            True,
        ),
        _growth(
            f"{at} per step / T={EARLY}, compaction",
            [c.at_end() / c.early() for c in folded],
            [c.at_end() / c.early() for c in loop],
            f"<= {FLAT_TARGET:g}",
            flat <= FLAT_TARGET,
        ),
        _growth(
            f"{at} per step / T={EARLY}, none",
            [c.at_end() / c.early() for c in none],
            [c.at_end() / c.early() for c in loop],
            "reported",
            True,
        ),
    ]
