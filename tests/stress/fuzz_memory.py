"""Memory under the fuzz's faults: compaction, digests of earlier attempts, resumed asks.

The plan (``fuzz_plan._memory``) gives half the top-level agents a ``Compaction``
with a small threshold and ``keep`` 0 to 3, summarized by their own fake model or
by one of their own (``Summarizer``); digests to some restart policies; ``resume``
to some asks. ``summarize`` answers a summarization request from the seed: the
summary (with the agent's marker), no text, an error, or (a separate summarizer
under a deadline) a hang. ``digest_calls``: the calls a digest shows, which a new
attempt's model asks for again now and then, so that some are reused.

The checks return violations as strings (``fuzz_checks`` has the rest):
``check_conversation`` is invariant 2 in its compacted form: the conversation is
every turn the agent answered (its start, then task and final answer per
execution, as its traces say) less a folded prefix of whole pairs,
``Conversation.summarized`` of them, with the summary of the last summarization
that succeeded; each one folds the turns but the last ``keep``, exactly when the
estimate reaches the threshold; a resumed ask picks up the last execution iff it
stopped before its answer. ``check_sections``: the summary section is empty iff
nothing was folded, else one ``SystemMessage``. ``continues``: a conversation seen
later continues one seen earlier. ``check_summary_request``: the instructions and
one user message, no tools, only the agent's text. ``check_reuse``: a trace had a
digest iff it resumed or restarted under a digest policy; a reused outcome only
there, for a call (name and arguments as JSON) that completed in an earlier
attempt, as often, with its result; ``check_reuse_charges``: never charged.
"""

from __future__ import annotations

import json
import math
import random
import re
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import anyio

from fractor.actors import (
    AssistantMessage,
    Conversation,
    DigestMessage,
    ExecutionTrace,
    Message,
    ModelRequest,
    ModelResponse,
    ProviderError,
    Result,
    SystemMessage,
    ToolCall,
    ToolOutcome,
    UserMessage,
    reply,
)
from fractor.actors._memory._digest import RESUMED_CHAIN
from fractor.runtime import TreeSnapshot

from .fuzz_checks import markers_in
from .fuzz_plan import Memory

__all__ = [
    "HEADING",
    "SUMMARIZER",
    "Summarizer",
    "check_conversation",
    "check_pairs",
    "check_reuse",
    "check_reuse_charges",
    "check_sections",
    "check_summary_request",
    "continues",
    "digest_calls",
    "summarize",
]

#: The name of a separate summarizer's model (priced like the others).
SUMMARIZER = "fuzz-summary"
#: How the summary section's one message begins.
HEADING = "Summary of the conversation before the turns below"
#: How an execution may end that a resumed ask picks up from.
RESUMABLE = frozenset({"budget_exceeded", "timed_out", "failed", "cancelled"})


# -- the fakes -------------------------------------------------------------------------------


def _crc(text: str) -> str:
    return f"{zlib.crc32(text.encode('utf-8', 'surrogatepass')) & 0xFFFF:04x}"


async def summarize(
    seed: int,
    name: str,
    request: ModelRequest,
    attempts: dict[tuple[str, int], int],
    *,
    separate: bool,
    deadline: bool,
) -> ModelResponse:
    """The answer of agent ``name``'s summarizer (its own model's, or a ``separate``
    one's, which fails more and may hang under a ``deadline``) to ``request``."""
    content = request.messages[-1].content if request.messages else ""
    key = (f"summary {_crc(content)}", 0)
    attempt = attempts.get(key, 0)
    attempts[key] = attempt + 1
    rng = random.Random(f"{seed}|{name}|{key}|{attempt}|{separate}")
    latency = rng.choice([0.0, 0.0, 0.001, 0.003])
    if latency:
        await anyio.sleep(latency)
    kinds = ["ok", "empty", "error", "stall"]
    weights = [3, 1, 1, 1 if deadline else 0] if separate else [8, 1, 1, 0]
    kind = rng.choices(kinds, weights)[0]
    me = f"<{name}>"
    if kind == "empty":
        return ModelResponse(text=rng.choice(["", "  \n"]), finish_reason="stop")
    if kind == "error":
        raise rng.choice(
            [
                ProviderError("fuzz", "rate limited", model=SUMMARIZER, status=429, retryable=True),
                RuntimeError(f"{me} the summarizer blew up"),
                ConnectionError("connection reset by peer"),
            ]
        )
    if kind == "stall":
        await anyio.sleep(60)  # a hang that only a deadline ends
    return reply(f"{me} summary {_crc(content)}.{attempt}")


class Summarizer:
    """The model function of a separate summarizer of agent ``name``."""

    def __init__(
        self, seed: int, name: str, *, deadline: bool, on_request: Callable[[], None]
    ) -> None:
        self.seed = seed
        self.name = name
        self.deadline = deadline
        self.on_request = on_request
        self.attempts: dict[tuple[str, int], int] = {}

    async def __call__(self, request: ModelRequest) -> ModelResponse:
        self.on_request()
        return await summarize(
            self.seed, self.name, request, self.attempts, separate=True, deadline=self.deadline
        )


_SHOWN = re.compile(r"^- (\w+)\((\{.*?\})\)(?: returned|: |$)", re.MULTILINE)


def digest_calls(request: ModelRequest, task: int) -> list[ToolCall]:
    """The calls the digest first in the buffer shows (after the task at ``task``),
    with blank ids for the fake to fill: asked again, the completed ones are reused."""
    messages = request.messages
    if len(messages) != task + 2 or not isinstance(messages[task + 1], DigestMessage):
        return []
    found = _SHOWN.findall(messages[task + 1].content)
    return [ToolCall(id="", name=name, arguments=arguments) for name, arguments in found[:4]]


# -- the conversation in its compacted form --------------------------------------------------


def _tokens(messages: Iterable[Message]) -> int:
    """The documented estimate: a token per four characters, four per message."""
    listed = list(messages)
    return math.ceil(sum(len(m.content) for m in listed) / 4) + 4 * len(listed)


def check_sections(
    where: str, summary: Sequence[Message], summarized: int, memory: bool
) -> list[str]:
    """2: the summary section is empty iff nothing was folded, else one
    ``SystemMessage`` saying how many turns it covers; none without memory."""
    if not memory and (summary or summarized):
        return [f"2: {where} has a summary ({summarized} turns), its agent does not compact"]
    if bool(summary) != bool(summarized):
        return [f"2: {where} has {len(summary)} summary messages for {summarized} turns"]
    if summary and (
        len(summary) != 1
        or not isinstance(summary[0], SystemMessage)
        or not summary[0].content.startswith(f"{HEADING} ({summarized} earlier turns):\n")
    ):
        return [f"2: {where} has a summary section of {summary!r:.200} for {summarized} turns"]
    return []


def continues(
    where: str,
    earlier: tuple[int, Sequence[Message]],
    later: tuple[int, Sequence[Message]],
) -> list[str]:
    """2: a conversation (summarized, messages) seen ``later`` continues one seen
    ``earlier``: it folded no fewer turns, and what both still hold is the same."""
    folded = later[0] - earlier[0]
    if folded < 0:
        return [f"2: {where}: its summary covers {later[0]} turns, {earlier[0]} before"]
    kept = list(earlier[1][2 * folded :])
    if list(later[1][: len(kept)]) != kept:
        return [f"2: {where} lost or changed messages (folded {folded} more turns)"]
    return []


def check_pairs(where: str, messages: Sequence[Message]) -> list[str]:
    """2: a conversation's messages are tasks and final answers, in pairs."""
    if len(messages) % 2:
        return [f"2: {where} has {len(messages)} messages: a turn is half-written"]
    for index, message in enumerate(messages):
        kind = UserMessage if index % 2 == 0 else AssistantMessage
        if not isinstance(message, kind) or (
            isinstance(message, AssistantMessage) and message.tool_calls
        ):
            return [f"2: {where} has {type(message).__name__} at {index}"]
    return []


def check_conversation(
    name: str,
    conversation: Conversation,
    traces: Sequence[ExecutionTrace],
    *,
    start: Conversation,
    system: str,
    results: Mapping[str, Result],
    memory: Memory | None = None,
    resumes: Collection[str] = (),
) -> list[str]:
    """2 (and 1) on a top-level agent's conversation between executions, against
    what it was when the actor started (``start``) and its ``traces`` since, in
    order: see the module. ``resumes``: the tasks asked with ``resume=True``."""
    where = f"the conversation of {name}"
    found: list[str] = []
    if conversation.execution:
        found.append(f"2: {where} keeps {len(conversation.execution)} buffer messages")
    if conversation.system != system or conversation.buffer:
        found.append(f"2: {where} has a changed system prompt or buffer section")
    found += check_sections(where, conversation.summary, conversation.summarized, bool(memory))
    expected: list[Message] = list(start.messages)
    summarized, summary = start.summarized, start.summary
    previous: ExecutionTrace | None = None
    final: dict[str, ExecutionTrace] = {}
    for trace in traces:
        record = trace.summarization
        if trace.attempt == 1:
            before = expected[2 * (summarized - start.summarized) :]
            found += _check_fold(where, trace, before, summarized, memory)
            found += _check_resumed(where, trace, previous, trace.task in resumes)
        elif record is not None:
            found.append(f"2: {where}: attempt {trace.attempt} of {trace.task!r:.60} compacted")
        if record is not None and record.ok:
            summarized += record.turns
            section = f"{HEADING} ({summarized} earlier turns):\n{record.summary}"
            summary = (SystemMessage(content=section),)
        # A restarted execution leaves a trace per attempt; an earlier attempt's id is
        # ``<id>~<attempt>``, and only the last attempt (the task's id) makes a turn.
        if trace.execution_id.endswith(f"~{trace.attempt}"):
            continue
        final[trace.execution_id] = previous = trace
        expected += [UserMessage(content=trace.task), AssistantMessage(content=trace.final_text)]
    if (conversation.summarized, conversation.summary) != (summarized, summary):
        found.append(
            f"2: {where} covers {conversation.summarized} turns in its summary, its "
            f"traces {summarized} (from {start.summarized}), or its summary is not theirs"
        )
    kept = expected[2 * (conversation.summarized - start.summarized) :]
    if list(conversation.messages) != kept:
        found.append(
            f"2: {where} has {len(conversation.messages)} messages, its executions "
            f"account for {len(kept)} past its summary: {_diff(conversation.messages, kept)}"
        )
    for execution_id, result in results.items():
        kept_trace = final.get(execution_id)
        if kept_trace is None:
            continue  # its trace was dropped (trace_limit) or the actor was replaced
        said = (kept_trace.final_text, kept_trace.status, kept_trace.stop_reason)
        if said != (result.text, result.status, result.stop_reason):
            found.append(f"2: {where}: execution {execution_id} answered other than it kept")
    for index, message in enumerate((*conversation.summary, *conversation.messages)):
        foreign = markers_in(message) - {name}
        if foreign:
            found.append(f"1: {where} holds text of {sorted(foreign)} at {index}")
    return found


def _check_fold(
    where: str,
    trace: ExecutionTrace,
    before: Sequence[Message],
    summarized: int,
    memory: Memory | None,
) -> list[str]:
    """2: the first attempt of a task compacted exactly when the conversation before
    it (``before``, past ``summarized`` turns) with its task reached the threshold
    and had turns older than the last ``keep``; it folded those."""
    record = trace.summarization
    if memory is None:
        return [f"2: {where}: {trace.execution_id} compacted, no memory"] if record else []
    turns = len(before) // 2 - memory.keep
    task = math.ceil(len(trace.task) / 4) + 4
    # The agent counts as the conversation grows: between the estimate of the whole
    # and the sum of the estimates of each message.
    low = _tokens(before) + task
    high = sum(_tokens((message,)) for message in before) + task
    if record is None:
        # Stopped before it began (a limit spent, a deadline, a cancellation): it
        # had no room for the optional summarization either.
        stopped = not trace.steps and trace.status in ("budget_exceeded", "timed_out", "cancelled")
        if turns >= 1 and low >= memory.threshold and not stopped:
            return [
                f"2: {where}: {trace.execution_id} did not compact {turns} turns at ~{low} "
                f"tokens, threshold {memory.threshold}"
            ]
        return []
    found = []
    if turns < 1 or high < memory.threshold or record.turns != turns:
        found.append(
            f"2: {where}: {trace.execution_id} folded {record.turns} turns of "
            f"{len(before) // 2} (keep {memory.keep}) at ~{high} tokens, threshold "
            f"{memory.threshold}"
        )
    if record.covered != summarized + (record.turns if record.ok else 0):
        found.append(
            f"2: {where}: {trace.execution_id}'s summary covers {record.covered} turns, "
            f"{summarized} before it ({record.error or 'ok'})"
        )
    if record.input_messages != 2 or (record.ok and not record.summary):
        found.append(f"2: {where}: {trace.execution_id}'s summarization is {record!r:.200}")
    return found


def _check_resumed(
    where: str, trace: ExecutionTrace, previous: ExecutionTrace | None, resume: bool
) -> list[str]:
    """2: an ask resumes the agent's last execution iff it asked to and that one
    stopped before its answer (unknown for the first in a respawned actor)."""
    if not resume:
        expected = ""
    elif previous is None:
        return []
    else:
        expected = previous.execution_id if previous.status in RESUMABLE else ""
    if trace.resumed != expected:
        return [
            f"2: {where}: {trace.execution_id} resumed {trace.resumed!r}, not {expected!r} "
            f"(resume={resume})"
        ]
    return []


def _diff(got: Sequence[Message], expected: Sequence[Message]) -> str:
    for index, (left, right) in enumerate(zip(got, expected, strict=False)):
        if left != right:
            return f"first difference at {index}: {left!r:.150} != {right!r:.150}"
    return "one is a prefix of the other"


def check_summary_request(name: str, request: ModelRequest, *, instructions: str) -> list[str]:
    """2 and 1: a summarization request holds the summarizer's instructions and one
    user message (no digest, no tools), and only agent ``name``'s text."""
    where = f"a summarization request of {name}"
    messages = request.messages
    found = []
    if (
        request.purpose != "summary"
        or request.tools
        or len(messages) != 2
        or messages[0] != SystemMessage(content=instructions)
        or not isinstance(messages[1], UserMessage)
    ):
        kinds = [type(m).__name__ for m in messages]
        found.append(f"2: {where} holds {kinds}, {len(request.tools)} tools")
    for index, message in enumerate(messages):
        foreign = markers_in(message) - {name}
        if foreign:
            found.append(f"1: {where} holds text of {sorted(foreign)} at {index}")
    return found


# -- digests and reused calls ----------------------------------------------------------------


def _key(call: ToolCall) -> tuple[str, str]:
    """A call by name and arguments as JSON, however the JSON was written."""
    try:
        arguments = json.dumps(json.loads(call.arguments), sort_keys=True)
    except ValueError:
        arguments = call.arguments
    return call.name, arguments


def _outcomes(trace: ExecutionTrace) -> list[ToolOutcome]:
    return [outcome for step in trace.steps for outcome in step.outcomes]


def _attempts(traces: Mapping[str, ExecutionTrace]) -> dict[str, list[ExecutionTrace]]:
    """The attempts of each task (by its execution id), oldest first."""
    found: dict[str, list[ExecutionTrace]] = {}
    for trace in traces.values():
        found.setdefault(trace.attempt_of or trace.execution_id, []).append(trace)
    for attempts in found.values():
        attempts.sort(key=lambda trace: trace.attempt)
    return found


def _whole(attempts: Sequence[ExecutionTrace], last: int) -> bool:
    return [trace.attempt for trace in attempts if trace.attempt <= last] == list(
        range(1, last + 1)
    )


def check_reuse(traces: Mapping[str, ExecutionTrace], digests: Mapping[str, bool]) -> list[str]:
    """2: each trace of ``traces`` (by execution id) had a digest iff it resumed an
    execution or is a restart under a digest policy (``digests``: by agent name);
    its reused outcomes are calls that completed in the attempts before it (when all
    of them are known), no more often than there, with a result of theirs."""
    found: list[str] = []
    tasks = _attempts(traces)
    for trace in traces.values():
        where = f"execution {trace.execution_id} of {trace.agent_name}"
        expected = bool(trace.resumed) or (trace.attempt > 1 and digests.get(trace.agent_name))
        if trace.digest != bool(expected):
            found.append(
                f"2: {where} (attempt {trace.attempt}, resumed {trace.resumed!r}) had a "
                f"digest: {trace.digest}"
            )
        reused = [outcome for outcome in _outcomes(trace) if outcome.reused]
        if not reused:
            continue
        if not trace.digest:
            found.append(f"2: {where} reused {len(reused)} calls without a digest")
        own = tasks[trace.attempt_of or trace.execution_id]
        earlier = [attempt for attempt in own if attempt.attempt < trace.attempt]
        if not _whole(own, trace.attempt - 1):
            continue
        chain = _resumed_chain(tasks, trace.resumed)
        if chain is None:
            continue  # its traces are not known here
        earlier += chain
        left: Counter[tuple[str, str]] = Counter()
        results: dict[tuple[str, str], set[str]] = {}
        for attempt in earlier:
            for outcome in _outcomes(attempt):  # a run that completed; a reuse is not one
                if not (outcome.is_error or outcome.interrupted or outcome.reused):
                    left[_key(outcome.call)] += 1
                    results.setdefault(_key(outcome.call), set()).add(outcome.content)
        for outcome in reused:
            key = _key(outcome.call)
            if left[key] < 1 or outcome.is_error or outcome.content not in results[key]:
                found.append(
                    f"2: {where} reused {key[0]}({key[1]:.100}), which did not complete "
                    f"as often or with that result in the attempts before it"
                )
            left[key] -= 1
    return found


def _resumed_chain(
    tasks: Mapping[str, list[ExecutionTrace]], resumed: str
) -> list[ExecutionTrace] | None:
    """The attempts of the executions a resumed one picks up from, following the
    chain of resumes back (as ``actors._memory._digest.resumable`` does, 8 at most); None
    when one of them is not whole here."""
    chain: list[ExecutionTrace] = []
    for _ in range(RESUMED_CHAIN):
        if not resumed:
            break
        attempts = tasks.get(resumed, [])
        if not attempts or attempts[-1].execution_id != resumed:
            return None
        if not _whole(attempts, attempts[-1].attempt):
            return None
        chain = attempts + chain
        resumed = attempts[-1].resumed
    return chain


def check_reuse_charges(
    tree: TreeSnapshot, traces: Mapping[str, ExecutionTrace], skip: Collection[str] = ()
) -> list[str]:
    """4: a node whose attempts reused calls was charged no more tool calls than the
    calls they did not reuse (a reused call is answered, not run: never charged)."""
    found = []
    tasks = _attempts(traces)
    for node in tree.nodes:
        attempts = tasks.get(node.id)
        if node.id in skip or not attempts or attempts[-1].execution_id != node.id:
            continue
        if not _whole(attempts, attempts[-1].attempt):
            continue
        outcomes = [outcome for attempt in attempts for outcome in _outcomes(attempt)]
        reused = sum(outcome.reused for outcome in outcomes)
        ran = len(outcomes) - reused
        if reused and node.own_usage.tool_calls > ran:
            found.append(
                f"4: {node.id} was charged {node.own_usage.tool_calls} tool calls; its "
                f"attempts ran {ran} and reused {reused}"
            )
    return found
