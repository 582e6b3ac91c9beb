"""Chat messages and the other values agents exchange, all frozen msgspec Structs.

Chat messages form a tagged union (``Message``), dispatched with ``match``:

- ``SystemMessage``: the agent's instructions, first in every inference context.
- ``UserMessage``: a task or a user turn.
- ``AssistantMessage``: the model's text, with the tool calls it asked for (if any).
- ``ToolResultMessage``: the result of one tool call, naming the call's id; flagged
  ``is_error`` when the tool failed, timed out, got bad arguments or does not exist.
- ``DigestMessage``: what earlier attempts of the current task did (``_memory._digest``),
  first in the execution buffer of the attempt that reads it; providers send it as
  a user turn. It never joins the conversation.

Every type here round-trips through msgspec JSON and MessagePack (invariant 6).

**Content parts** (``actors._parts``: images and documents): a ``UserMessage`` and a
``ToolResultMessage`` carry their text in ``content`` and their images and documents
in ``parts`` (after the text, in order); so do a ``Task``, a ``Result`` (a subagent's
answer with parts becomes its parent's tool result with them), a ``ModelResponse``
(a model that answers with parts), a ``ToolOutcome`` and an ``ExecutionTrace``
(``task_parts``, and ``parts`` of its answer). The two messages are declared
``omit_defaults``: a message without parts encodes without the field, so a
text-only ``UserMessage`` is byte for byte what it was before parts existed (a
``ToolResultMessage`` also leaves out ``is_error`` when False); both decode either form.

They are declared ``gc=False``: they hold only strings, numbers and tuples of each
other, so they can never be part of a reference cycle, and leaving them out of the
cyclic garbage collector's reach means the many made per step never trigger or
slow a collection.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import msgspec

from fractor.runtime import Budget, NodeSnapshot
from fractor.runtime import Usage as Usage

from ._parts import ImageTokens, Media, anthropic_image_tokens, part_tokens

__all__ = [
    "AssistantMessage",
    "Conversation",
    "DigestMessage",
    "ExecutionTrace",
    "FinishReason",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "OutputSchema",
    "Progress",
    "Result",
    "ServerLimits",
    "Status",
    "StepRecord",
    "SummaryRecord",
    "SystemMessage",
    "Task",
    "ToolCall",
    "ToolOutcome",
    "ToolResultMessage",
    "ToolSpec",
    "UserMessage",
    "exception_text",
    "parts_in",
    "parts_tokens",
    "safe_text",
]


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One tool call asked for by the model. ``arguments`` is JSON text, as on the wire."""

    id: str
    name: str
    arguments: str = "{}"


class SystemMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="system"):
    content: str


class UserMessage(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True, tag="user"
):
    content: str
    #: Images and documents after the text (``actors._parts``); none for text only.
    parts: tuple[Media, ...] = ()


class AssistantMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="assistant"):
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class ToolResultMessage(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True, tag="tool"
):
    call_id: str
    name: str
    content: str
    is_error: bool = False
    #: Images and documents the tool returned after its text (``actors._parts``).
    parts: tuple[Media, ...] = ()


class DigestMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="digest"):
    """A digest of earlier attempts of the task (``_memory._digest``): ``attempts`` of them."""

    content: str
    attempts: int = 1


Message = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage | DigestMessage


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A tool as the model sees it: name, description and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "error"]


class OutputSchema(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The JSON schema a typed answer's text must match (``Agent(output_type=...)``).

    ``native``: the model should enforce it with the provider's structured output
    (``OpenAIModel`` sends ``response_format`` ``json_schema`` named ``name``). Not
    native: the instructions in the context ask for it; a model may ignore it
    (``ReActModel`` takes a JSON value as its ``"final"``).
    """

    name: str
    schema: dict[str, Any]
    native: bool = True


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One inference request: the compiled context, the tools offered, the output cap,
    and for a typed answer in the text, its schema (``output_schema``). ``purpose``
    says what it is for: a step of an execution, or the summary of a compaction
    (``Agent(memory=...)``); providers send both alike."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    output_schema: OutputSchema | None = None
    purpose: Literal["step", "summary"] = "step"


class ServerLimits(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one response's headers said of the server's rate limits: each field is
    None when the server did not say it (or said something unreadable).

    ``*_limit`` is the most the bucket holds, ``*_remaining`` what is left of it,
    ``*_reset`` the seconds from the response until it is full again (OpenAI's
    ``x-ratelimit-*`` headers, Anthropic's ``anthropic-ratelimit-*``, whose resets
    are timestamps, read as seconds from when they came). ``tokens_*`` is OpenAI's
    one token bucket, or the tightest of Anthropic's; ``input_tokens_*`` and
    ``output_tokens_*`` are Anthropic's separate ones. ``retry_after`` is the
    seconds the server asked to wait before the next request (``retry-after``,
    ``retry-after-ms``, or an OpenAI 429's "Please try again in 644ms").
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset: float | None = None
    input_tokens_limit: int | None = None
    input_tokens_remaining: int | None = None
    input_tokens_reset: float | None = None
    output_tokens_limit: int | None = None
    output_tokens_remaining: int | None = None
    output_tokens_reset: float | None = None
    retry_after: float | None = None


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What a model answered: text, tool calls, usage and why it stopped, and what
    the server's headers said of its rate limits (``limits``, None when nothing)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    finish_reason: FinishReason = "stop"
    model: str = ""
    limits: ServerLimits | None = None
    #: Images and documents of the answer (a final answer's become ``Result.parts``).
    parts: tuple[Media, ...] = ()


Status = Literal["completed", "budget_exceeded", "timed_out", "cancelled", "failed"]


class Result(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The one reply to one task: the final text, how the execution ended, its usage."""

    text: str
    status: Status
    stop_reason: str
    usage: Usage
    #: The id of the agent's actor that ran the task: ``ref.id`` of an agent spawned
    #: with ``rt.spawn``; a subagent's actor lives for its one task and is named by
    #: that execution (there it equals ``execution_id``, unique across hosts). One
    #: meaning wherever an agent id is named: ``ApprovalRequest.agent_id``,
    #: ``Event.agent_id``, ``NodeSnapshot.actor_id`` in ``rt.tree()``.
    agent_id: str
    #: The id of the execution: its node in ``rt.tree()``, its trace in the store.
    execution_id: str = ""
    steps: int = 0
    #: The typed answer of an agent with an ``output_type`` (``text`` is its JSON);
    #: None otherwise, or when the execution ended without a valid one. Across
    #: hosts it travels as its JSON, decoded again where the type is known.
    output: Any = None
    #: Images and documents of the final answer (a parent's model reads them in the
    #: tool result of its call to this agent).
    parts: tuple[Media, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One tool call of a step, as the trace keeps it."""

    call: ToolCall
    content: str
    is_error: bool
    seconds: float
    attempts: int = 1
    #: Still running when its execution stopped: ``content`` says so.
    interrupted: bool = False
    #: For a call that needed approval: "approved", or "denied: <reason>"; and the
    #: seconds it waited for the decision.
    approval: str = ""
    waited: float = 0.0
    #: Answered from an earlier attempt of the task (a restart or a resumed ask
    #: with a digest): the same call had completed there; it did not run again.
    reused: bool = False
    #: Images and documents of the result (the tool result message carries them).
    parts: tuple[Media, ...] = ()
    #: When the call began running, in seconds after its execution's start (see
    #: ``ExecutionTrace.started``): after its approval (``waited`` ends here), its
    #: slot among the step's ``tool_concurrency`` workers and any runtime-wide cap
    #: of its tool, so that ``started + seconds`` is when it ended. A subagent call:
    #: when its child was started. A denied call: when its wait for the decision
    #: began. A ``reused`` call keeps the one of the attempt where it ran. None for
    #: a call that never ran (refused, unknown, answered by a typed answer) and in
    #: traces written before start times were kept.
    started: float | None = None


class StepRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One step of an execution: the model's answer and the tool calls it led to."""

    index: int
    input_messages: int
    response_text: str
    tool_calls: tuple[ToolCall, ...]
    outcomes: tuple[ToolOutcome, ...]
    usage: Usage
    model_seconds: float
    tools_seconds: float
    finish_reason: FinishReason
    error: str = ""
    #: The step in flight when its execution stopped (a deadline, a stop, a
    #: cancellation): ``error`` says what it was doing, ``outcomes`` mark the tool
    #: calls still running as interrupted.
    interrupted: bool = False
    #: The model that answered, as it named itself (a ``FallbackModel``'s answers
    #: name the model of its chain that gave them).
    model: str = ""
    #: When its model request began, in seconds after its execution's start (see
    #: ``ExecutionTrace.started``); its tool calls' phase began ``model_seconds`` later.
    #: None in traces written before start times were kept.
    started: float | None = None


class SummaryRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The summarization request of an execution that compacted its agent's
    conversation (``Agent(memory=Compaction(...))``), as the trace keeps it.

    ``turns`` user/answer pairs were to be folded into the summary; ``covered`` is
    how many turns the summary covers once this one succeeded (all compactions).
    On failure (``error``: the request failed, was refused, or said nothing) the
    conversation stayed as it was.
    """

    turns: int
    covered: int
    input_messages: int
    summary: str
    usage: Usage
    seconds: float
    model: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class ExecutionTrace(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything one execution did. Kept for debugging; never enters the conversation."""

    execution_id: str
    agent_id: str
    task: str
    steps: tuple[StepRecord, ...]
    status: Status
    stop_reason: str
    final_text: str
    usage: Usage
    seconds: float
    #: The execution that delegated this one (a subagent call); empty at the top.
    parent_id: str = ""
    agent_name: str = ""
    #: Which attempt of its task this was (a restart policy runs a failed one again):
    #: the last attempt has the task's execution id, an earlier one ``<id>~<attempt>``.
    attempt: int = 1
    #: For an earlier attempt: the execution id of its task (the last attempt's),
    #: which a store keeps as its record's parent.
    attempt_of: str = ""
    #: The compaction this execution began with, if its agent compacted.
    summarization: SummaryRecord | None = None
    #: Whether a digest of earlier attempts was in its context (``DigestMessage``).
    digest: bool = False
    #: The execution an ask with ``resume=True`` picked up from ("": none).
    resumed: str = ""
    #: Images and documents of the task, and of the final answer.
    task_parts: tuple[Media, ...] = ()
    parts: tuple[Media, ...] = ()
    #: When the execution began: wall-clock seconds since the epoch (``time.time()``),
    #: the origin of its steps' and tool calls' ``started`` offsets, and what places
    #: executions (a subagent's among them, on any host) on one time axis. None in
    #: traces written before start times were kept.
    started: float | None = None


class Conversation(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A snapshot of an agent's context sections.

    ``messages`` is the persistent part: user turns and final answers only.
    ``summary`` holds what compaction folded (``summarized`` turns: user/answer
    pairs no longer in ``messages``). ``execution`` is the execution buffer: empty
    between executions.
    """

    system: str
    summary: tuple[Message, ...]
    buffer: tuple[Message, ...]
    messages: tuple[Message, ...]
    execution: tuple[Message, ...]
    summarized: int = 0

    def context(self) -> tuple[Message, ...]:
        """The inference context these sections compile to."""
        head: tuple[Message, ...] = (SystemMessage(content=self.system),) if self.system else ()
        return head + self.summary + self.buffer + self.messages + self.execution


def parts_in(*sections: Iterable[Message]) -> Iterator[Media]:
    """The images and documents of the user turns and tool results of ``sections``."""
    for section in sections:
        for message in section:
            if type(message) is UserMessage or type(message) is ToolResultMessage:
                yield from message.parts


def parts_tokens(
    messages: Iterable[Message], *, image_tokens: ImageTokens = anthropic_image_tokens
) -> int:
    """The input tokens of the images and documents of ``messages`` (``part_tokens``,
    with ``image_tokens`` the provider's rule for an image of known size): what a
    model's ``estimate_tokens`` adds to its estimate of the text. 0 without parts."""
    tokens = 0
    for part in parts_in(messages):
        tokens += part_tokens(part, image_tokens=image_tokens)
    return tokens


def safe_text(text: str) -> str:
    """``text`` as every store and provider can take it: a lone surrogate (half of a
    UTF-16 pair, which no UTF-8 encoder accepts) becomes U+FFFD; a pair written as
    two halves becomes its character. Made safe once, where text comes in (a task,
    a deny's reason, the text of a definition: an agent's instructions and
    description, a tool's description, a summarizer's instructions; a tool's
    result, a model's reply), so nothing raises later inside an actor."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def exception_text(exc: BaseException) -> str:
    """``Kind: message`` of an exception, made safe as ``safe_text`` does (an error
    from a model, a provider or a tool may carry half a character) and never raising
    (a ``__str__`` that fails leaves the kind alone)."""
    kind = type(exc).__qualname__
    try:
        message = safe_text(str(exc))
    except Exception:
        message = ""
    return f"{kind}: {message}" if message else kind


class Task(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A task for an agent: one user message, optionally with its own budget.

    ``node`` is set when a parent execution already opened this task's node in the
    supervisor's tree (a subagent call); empty for a task from outside. ``watch``
    names the watcher of a streamed ask (``AgentRef.stream``) in the runtime's
    event bus: the execution's subtree reports its events to it. ``resume``: see
    ``AgentRef.ask``.
    """

    text: str
    budget: Budget | None = None
    node: str = ""
    #: Images and documents of the task, after its text (``UserMessage.parts``).
    parts: tuple[Media, ...] = ()
    watch: str = ""
    #: Pick up from the agent's last execution if it stopped before its answer (a
    #: limit, the deadline, a failure): a digest of what it did, and its completed
    #: tool calls answered from their results instead of run again.
    resume: bool = False
    #: The key an observer of the caller knows this task by (``EventBus.on_task``):
    #: the execution's start (or its refusal) names it as ``caller``.
    caller: str = ""


class Progress(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A snapshot of what an agent is doing now (``AgentRef.progress``).

    ``running`` is False between executions (then only ``agent_id``, ``queued`` and
    ``conversation_turns`` say anything). While an execution runs: its id and task,
    the ``steps`` recorded so far, the ``phase`` of the step in flight (``"model"``:
    its request is out, ``"tools"``: its tool calls run; ``"summary"``: before the
    first step, the request of a compaction is out), the tool calls still
    running (``in_flight``), the text the model has streamed so far in this step
    (``streamed``), the execution's usage so far (descendants included), the
    seconds since it started, and the subtree's nodes as the supervisor sees them.
    """

    agent_id: str
    running: bool
    execution_id: str = ""
    task: str = ""
    attempt: int = 1
    steps: tuple[StepRecord, ...] = ()
    phase: Literal["idle", "summary", "model", "tools"] = "idle"
    in_flight: tuple[ToolCall, ...] = ()
    streamed: str = ""
    usage: Usage = Usage()
    seconds: float = 0.0
    #: Tasks waiting in the agent's mailbox behind this one.
    queued: int = 0
    conversation_turns: int = 0
    #: The nodes of the subtree (this execution's first), from the supervisor's tree.
    nodes: tuple[NodeSnapshot, ...] = ()
