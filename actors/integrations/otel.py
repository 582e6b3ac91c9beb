"""OpenTelemetry traces of a runtime's agents: the span tree is the agent tree.

::

    from fractor.actors.integrations import otel

    async with Runtime() as rt:
        with otel.instrument(rt, tracer_provider=provider):
            result = await (await rt.spawn(agent)).ask("...")

``instrument`` listens to the runtime's events (``EventBus.listen``) and turns them
into spans as they happen, with the timestamps of the events themselves:

- one ``invoke_agent`` span per execution (its node in ``rt.tree()``: attribute
  ``fractor.node_id``), under the span current where ``ask``, ``tell`` or ``stream``
  was called for a top-level execution, under the ``execute_tool`` span of the call
  that spawned it for a subagent's;
- one ``chat`` span per model request (each attempt, retries included) and one
  ``execute_tool`` span per tool call, subagent calls included, under the execution's;
- one span event per event of any other kind (a retry, a restart, a budget wait, a
  kind defined since: ``HANDLERS`` names the kinds treated specially, ``IGNORED``
  those left out on purpose), named ``fractor.<kind>``, on its execution's span,
  the detail's fields as its attributes (``fractor.<field>``).

Attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``), plus
fractor's own (``fractor.*``: node, depth, status, stop reason, budget limits), and
OpenInference's span kind (``openinference.span.kind``: ``AGENT``, ``LLM``, ``TOOL``),
which Arize Phoenix reads. A ``chat`` span names its provider
(``gen_ai.provider.name``): the part of the model's name before its first ``:``
(fractor's providers name their models ``openai:...``, ``anthropic:...``), or
``fractor`` for a model whose name names none (the scripted and function models);
``gen_ai.request.model`` is the rest of the name.

Contents are recorded only with ``capture_content=True``, each text cut at 200
characters: an execution's task in and answer out; each request's system
instructions, messages and response; each tool call's arguments and result. They
follow the GenAI conventions (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.system_instructions``, ``gen_ai.tool.call.arguments`` / ``.result``, the
messages as JSON), and again as OpenInference's ``input.value`` / ``output.value``
(the text of a task, an answer, a tool's arguments and result; a request's messages
as JSON, ``application/json``), which is what Phoenix shows as a span's input and
output. API keys never: the events carry none, and the providers redact their errors.

Off unless instrumented: an uninstrumented runtime pays nothing (no listener, no
events built); ``close()`` (or leaving the ``with`` block) stops the spans again.
The spans need ``opentelemetry-api``, and exporting them ``opentelemetry-sdk`` (the
extra ``fractor[otel]`` installs both); spans go to the tracer provider given, else
to the global one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import msgspec
import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from fractor.runtime import ActorStop, Budget, Event, EventDetail, Runtime

from .._messages import (
    AssistantMessage,
    DigestMessage,
    Message,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from .._observation._events import (
    ApprovalAsked,
    ApprovalDecision,
    ExecutionEnd,
    ExecutionStart,
    ModelText,
    Refused,
    RequestEnd,
    RequestStart,
    Spawn,
    StepEnd,
    StepStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
)

__all__ = ["Instrumentation", "instrument"]

#: The budget limits recorded on an execution's span (``fractor.budget.<name>``): every
#: field of ``Budget`` (``runtime._budget.FIELDS`` describes each).
_LIMITS = tuple(Budget.__struct_fields__)


log = structlog.get_logger("fractor.otel")

#: How many ended executions' parents are kept for a restart (which follows at once).
_ENDED_KEPT = 1_000
#: How many callers' contexts of tasks not started yet are kept, at most.
CALLERS_KEPT = 10_000
#: Each text recorded is cut at this many characters (as the events cut theirs).
CONTENT_CHARS = 200
#: The fields that hold contents (a task, an answer, a text, messages, a response, a
#: tool call's arguments or result), in a kind this module has no handler for: each
#: recorded only with ``capture_content``, as the handled kinds' contents are.
CONTENT_FIELDS = frozenset(
    {"task", "answer", "text", "message", "messages", "response", "arguments", "result"}
)
#: fractor's model adapters, whose names wrap another model's (``react:openai:gpt-4o``).
_ADAPTERS = ("react:",)
#: The GenAI conventions' finish reasons, by fractor's (``FinishReason``).
_FINISH = {"tool_calls": "tool_call"}


def instrument(
    runtime: Runtime,
    *,
    tracer_provider: TracerProvider | None = None,
    capture_content: bool = False,
) -> Instrumentation:
    """Trace ``runtime``'s agents from now on (see the module); returns the handle
    that stops it (``close()``, or use it as a context manager)."""
    if not isinstance(runtime, Runtime):
        raise TypeError(f"instrument takes a fractor.Runtime, got {type(runtime).__qualname__}")
    return Instrumentation(runtime, tracer_provider, capture_content)


class _Execution:
    """The open spans of one execution."""

    __slots__ = ("calls", "chat", "children", "context", "span", "tools")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.context = trace.set_span_in_context(span, otel_context.Context())
        #: The model request in flight.
        self.chat: Span | None = None
        #: Tool calls running, by call id.
        self.tools: dict[str, Span] = {}
        #: The calls the last model reply asked for, by id and name (a subagent call's
        #: id is found here: its ``spawn`` event names the child, not the call).
        self.calls: list[tuple[str, str]] = []
        #: The node ids of the subagents it spawned.
        self.children: list[str] = []


class Instrumentation:
    """Spans from a runtime's events, until ``close()``."""

    def __init__(
        self, runtime: Runtime, tracer_provider: TracerProvider | None, capture_content: bool
    ) -> None:
        self.runtime = runtime
        self.capture_content = capture_content
        self._tracer = trace.get_tracer("fractor", tracer_provider=tracer_provider)
        bus = runtime.event_bus
        #: Event times are seconds since the runtime started: taken to the epoch once,
        #: at the first event (the runtime may not have started yet).
        self._offset: int | None = None
        self._executions: dict[str, _Execution] = {}
        #: The parent context of each execution running, and of the last ones that
        #: ended (a restart, which follows its end at once, reuses it).
        self._parents: dict[str, otel_context.Context] = {}
        self._ended: dict[str, otel_context.Context] = {}
        #: Subagent calls in flight, by the child's node id: the span and its parent.
        self._spawned: dict[str, tuple[Span, str]] = {}
        #: The caller's context of each task handed over, by its key (``Task.caller``);
        #: the oldest are let go past ``CALLERS_KEPT`` (tasks that never started).
        self._callers: dict[str, otel_context.Context] = {}
        self._previous = bus.on_task
        bus.on_task = self._handed
        if capture_content:
            bus.contents += 1  # the requests' events carry their messages and responses
        self._remove: Callable[[], None] | None = bus.listen(self._on_event)

    def close(self) -> None:
        """Stop making spans (the ones open stay open)."""
        remove, self._remove = self._remove, None
        if remove is None:
            return
        remove()
        bus = self.runtime.event_bus
        if bus.on_task == self._handed:
            bus.on_task = self._previous
        if self.capture_content:
            bus.contents -= 1

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the caller's context ---------------------------------------------------------

    def _handed(self, agent_id: str, key: str) -> None:
        """A task from outside for ``agent_id``: keep the caller's context, which its
        execution's span will have as parent (found by the task's key)."""
        callers = self._callers
        callers[key] = otel_context.get_current()
        if len(callers) > CALLERS_KEPT:
            del callers[next(iter(callers))]
        previous = self._previous
        if previous is not None:
            previous(agent_id, key)

    # -- events to spans ----------------------------------------------------------------

    def _ns(self, event: Event) -> int:
        offset = self._offset
        if offset is None:
            offset = self._offset = time.time_ns() - int(self.runtime.event_bus.now() * 1e9)
        return offset + int(event.at * 1e9)

    def _on_event(self, event: Event) -> None:
        cls = type(event.detail)
        handler = HANDLERS.get(cls)
        if handler is None:
            if cls in IGNORED:
                return
            handler = Instrumentation._event  # any other kind: a span event of its own
        try:
            handler(self, event, event.detail)
        except Exception:  # an observer never fails the agents it observes
            log.exception("otel_span_failed", kind=event.kind, execution_id=event.execution_id)

    def _refused(self, event: Event, detail: Refused) -> None:
        """A task refused before it started (a depth or agents limit): its caller's
        context is let go."""
        self._callers.pop(detail.caller, None)

    def _execution_start(self, event: Event, detail: ExecutionStart) -> None:
        node_id = event.execution_id
        parent = self._parents.get(node_id)
        if parent is None:  # a restart's reuses the ended attempt's
            parent = self._ended.pop(node_id, None)
        if parent is None:
            spawned = self._spawned.get(node_id)
            if spawned is not None:
                parent = trace.set_span_in_context(spawned[0], otel_context.Context())
            else:
                parent = self._callers.pop(detail.caller, None) or otel_context.Context()
        self._parents[node_id] = parent
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "openinference.span.kind": "AGENT",
            "gen_ai.agent.name": event.agent,
            "gen_ai.agent.id": event.agent_id,
            "fractor.agent_id": event.agent_id,
            "fractor.node_id": node_id,
            "fractor.parent_node_id": event.parent_id,
            "fractor.depth": event.depth,
        }
        node = self.runtime.supervisor.nodes.get(node_id)
        limits = node.limits if node is not None else None
        if limits is not None:
            for name in _LIMITS:
                value = getattr(limits, name)
                if value is not None:
                    attributes[f"fractor.budget.{name}"] = value
        if self.capture_content:
            task = detail.task
            attributes["gen_ai.input.messages"] = _json([_message("user", [_text_part(task)])])
            attributes["input.value"] = task
        span = self._tracer.start_span(
            f"invoke_agent {event.agent}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=self._ns(event),
        )
        self._executions[node_id] = _Execution(span)

    def _execution_end(self, event: Event, detail: ExecutionEnd) -> None:
        node_id = event.execution_id
        execution = self._executions.pop(node_id, None)
        parent = self._parents.pop(node_id, None)
        if parent is not None:
            ended = self._ended
            ended[node_id] = parent
            if len(ended) > _ENDED_KEPT:
                del ended[next(iter(ended))]
        at = self._ns(event)
        status, reason = detail.status, detail.reason
        if execution is not None:
            for span in (execution.chat, *execution.tools.values()):
                if span is not None:
                    span.set_status(Status(StatusCode.ERROR, "interrupted"))
                    span.end(end_time=at)
            span = execution.span
            span.set_attribute("fractor.status", status)
            span.set_attribute("fractor.stop_reason", reason)
            span.set_attribute("fractor.steps", detail.steps)
            if self.capture_content:
                answer = detail.answer
                finish = "stop" if status == "completed" else status
                output = [_message("assistant", [_text_part(answer)], finish)]
                span.set_attribute("gen_ai.output.messages", _json(output))
                span.set_attribute("output.value", answer)
            if status != "completed":
                span.set_status(Status(StatusCode.ERROR, f"{status}: {reason}"))
            span.end(end_time=at)
            # Subagent calls of this execution whose child never ended end with it.
            for child_id in execution.children:
                orphan = self._spawned.pop(child_id, None)
                if orphan is not None:
                    orphan[0].set_status(Status(StatusCode.ERROR, "the subagent never answered"))
                    orphan[0].end(end_time=at)
        spawned = self._spawned.pop(node_id, None)
        if spawned is not None:  # this execution answers a subagent call
            call = spawned[0]
            call.set_attribute("fractor.status", status)
            if self.capture_content:
                answer = detail.answer
                call.set_attribute("gen_ai.tool.call.result", answer)
                call.set_attribute("output.value", answer)
            if status != "completed":
                call.set_status(Status(StatusCode.ERROR, f"{status}: {reason}"))
            call.end(end_time=at)

    def _request_start(self, event: Event, detail: RequestStart) -> None:
        execution = self._executions.get(event.execution_id)
        if execution is None:
            return
        provider, model = provider_of(detail.model)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "openinference.span.kind": "LLM",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "fractor.node_id": event.execution_id,
            "fractor.step": detail.step,
            "fractor.attempt": detail.attempt,
            "fractor.purpose": detail.purpose,
        }
        messages = detail.messages
        if self.capture_content and messages is not None:
            system, chat = _request_messages(messages)
            if system:
                attributes["gen_ai.system_instructions"] = _json(system)
            attributes["gen_ai.input.messages"] = attributes["input.value"] = _json(chat)
            attributes["input.mime_type"] = "application/json"
        execution.chat = self._tracer.start_span(
            f"chat {model}",
            context=execution.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=self._ns(event),
        )

    def _request_end(self, event: Event, detail: RequestEnd) -> None:
        execution = self._executions.get(event.execution_id)
        if execution is None or execution.chat is None:
            return
        span, execution.chat = execution.chat, None
        finish = detail.finish_reason
        span.set_attributes(
            {
                "gen_ai.response.model": detail.response_model or detail.model,
                "gen_ai.usage.input_tokens": detail.input_tokens,
                "gen_ai.usage.output_tokens": detail.output_tokens,
                "gen_ai.response.finish_reasons": (finish,),
            }
        )
        error = detail.error
        if error:
            span.set_attribute("error.type", error.partition(":")[0])
            span.set_status(Status(StatusCode.ERROR, error))
        execution.calls = [(str(i), str(n)) for i, n in detail.tool_calls]
        response = detail.response
        if self.capture_content and isinstance(response, ModelResponse):
            parts = [_text_part(response.text)] if response.text else []
            parts.extend(_call_part(call) for call in response.tool_calls)
            finish = _FINISH.get(response.finish_reason, response.finish_reason)
            output = _json([_message("assistant", parts, finish)])
            span.set_attributes(
                {
                    "gen_ai.output.messages": output,
                    "output.value": output,
                    "output.mime_type": "application/json",
                }
            )
        span.end(end_time=self._ns(event))

    def _tool_start(self, event: Event, detail: ToolStart) -> None:
        execution = self._executions.get(event.execution_id)
        if execution is None:
            return
        name, call_id = detail.tool, detail.call_id
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "openinference.span.kind": "TOOL",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "fractor.node_id": event.execution_id,
        }
        if self.capture_content:
            arguments = detail.arguments
            attributes["gen_ai.tool.call.arguments"] = attributes["input.value"] = arguments
        execution.tools[call_id] = self._tracer.start_span(
            f"execute_tool {name}",
            context=execution.context,
            attributes=attributes,
            start_time=self._ns(event),
        )

    def _tool_end(self, event: Event, detail: ToolEnd) -> None:
        execution = self._executions.get(event.execution_id)
        if execution is None:
            return
        span = execution.tools.pop(detail.call_id, None)
        if span is None:
            return
        if self.capture_content:
            result = detail.result
            span.set_attributes({"gen_ai.tool.call.result": result, "output.value": result})
        if detail.is_error:
            span.set_status(Status(StatusCode.ERROR, "the tool call failed"))
        span.end(end_time=self._ns(event))

    def _tool_progress(self, event: Event, detail: ToolProgress) -> None:
        """What a tool reported of its progress: an event of its call's span."""
        execution = self._executions.get(event.execution_id)
        if execution is None:
            return
        span = execution.tools.get(detail.call_id)
        if span is None:
            return
        attributes: dict[str, Any] = {"fractor.progress": detail.progress}
        if detail.total is not None:
            attributes["fractor.total"] = detail.total
        if self.capture_content and detail.message:
            attributes["fractor.message"] = detail.message
        span.add_event("fractor.tool_progress", attributes, timestamp=self._ns(event))

    def _spawn(self, event: Event, detail: Spawn) -> None:
        execution = self._executions.get(event.execution_id)
        if execution is None:
            return
        child, child_id, call_id = detail.child, detail.child_id, detail.call_id
        for index, (asked_id, asked_name) in enumerate(execution.calls):
            if asked_id == call_id or (not call_id and asked_name == child):
                call_id = asked_id
                del execution.calls[index]
                break
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "openinference.span.kind": "TOOL",
            "gen_ai.tool.name": child,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "agent",
            "fractor.node_id": event.execution_id,
            "fractor.child_node_id": child_id,
        }
        if self.capture_content:
            arguments = json.dumps({"task": detail.task})
            attributes["gen_ai.tool.call.arguments"] = attributes["input.value"] = arguments
        span = self._tracer.start_span(
            f"execute_tool {child}",
            context=execution.context,
            attributes=attributes,
            start_time=self._ns(event),
        )
        self._spawned[child_id] = (span, event.execution_id)
        execution.children.append(child_id)

    def _text(self, event: Event, detail: ModelText) -> None:
        if not self.capture_content:
            return
        execution = self._executions.get(event.execution_id)
        if execution is not None:
            execution.span.add_event(
                "gen_ai.assistant.message",
                {"content": detail.text},
                timestamp=self._ns(event),
            )

    def _event(self, event: Event, detail: EventDetail) -> None:
        """A kind with no handler of its own, ignored or not (a retry, a wait for the
        budget, a limit reached, a kind added since): an event of its execution's
        span, named after the kind, its fields as attributes (``_attributes``)."""
        execution = self._executions.get(event.execution_id)
        if execution is None:
            return
        attributes = _attributes(detail, self.capture_content)
        execution.span.add_event(f"fractor.{event.kind}", attributes, timestamp=self._ns(event))


def provider_of(model: str) -> tuple[str, str]:
    """The provider a model's name names, and the model's own name: ``openai:gpt-4o``
    is ``("openai", "gpt-4o")`` (past fractor's adapters: ``react:openai:gpt-4o`` too);
    a name without a provider (``scripted``) is fractor's own model."""
    while model.startswith(_ADAPTERS):
        model = model.partition(":")[2]
    provider, colon, name = model.partition(":")
    if not (colon and provider and name):
        return "fractor", model
    return provider, name


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _attributes(detail: EventDetail, capture_content: bool) -> dict[str, Any]:
    """A detail's fields as a span event's attributes (``fractor.<field>``): a str,
    int, float or bool as it is, any other value as its JSON (else its text), each
    text cut at ``CONTENT_CHARS``; a field that holds contents (``CONTENT_FIELDS``)
    only with ``capture_content``; None and an empty host left out."""
    attributes: dict[str, Any] = {}
    for key in detail.__struct_fields__:
        value = getattr(detail, key)
        if value is None or (key == "host" and not value):
            continue
        if key in CONTENT_FIELDS and not capture_content:
            continue
        if not isinstance(value, str | int | float | bool):
            try:
                value = msgspec.json.encode(value).decode()
            except (TypeError, msgspec.EncodeError):
                value = str(value)
        if isinstance(value, str):
            value = value[:CONTENT_CHARS]
        attributes[f"fractor.{key}"] = value
    return attributes


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text[:CONTENT_CHARS]}


def _call_part(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_call",
        "id": call.id,
        "name": call.name,
        "arguments": call.arguments[:CONTENT_CHARS],
    }


def _message(role: str, parts: list[dict[str, Any]], finish: str = "") -> dict[str, Any]:
    """One GenAI message (an output message has its ``finish_reason``)."""
    message: dict[str, Any] = {"role": role, "parts": parts}
    if finish:
        message["finish_reason"] = finish
    return message


def _request_messages(
    messages: tuple[Message, ...],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A request's messages as the GenAI conventions record them: its system
    instructions (parts), and the chat (messages)."""
    system: list[dict[str, Any]] = []
    chat: list[dict[str, Any]] = []
    for message in messages:
        match message:
            case SystemMessage(content=text):
                system.append(_text_part(text))
            case UserMessage(content=text) | DigestMessage(content=text):
                chat.append(_message("user", [_text_part(text)]))
            case AssistantMessage(content=text, tool_calls=calls):
                parts = [_text_part(text)] if text else []
                parts.extend(_call_part(call) for call in calls)
                chat.append(_message("assistant", parts))
            case ToolResultMessage(call_id=call_id, content=text):
                response = {"type": "tool_call_response", "id": call_id}
                chat.append(_message("tool", [{**response, "response": text[:CONTENT_CHARS]}]))
    return system, chat


#: What each kind of event it treats specially becomes (its detail's class): a span
#: begun or ended, an event of a tool call's span, a caller's context let go. Every
#: other kind not in ``IGNORED`` (a retry, a restart, a compaction, a budget wait or
#: resume, a limit or deadline reached, any kind added since) is an event of its
#: execution's span named after it, its fields as attributes (``_event``): a new kind
#: needs no line here to be seen.
HANDLERS: dict[type[EventDetail], Callable[[Instrumentation, Event, Any], None]] = {
    ExecutionStart: Instrumentation._execution_start,
    ExecutionEnd: Instrumentation._execution_end,
    RequestStart: Instrumentation._request_start,
    RequestEnd: Instrumentation._request_end,
    ToolStart: Instrumentation._tool_start,
    ToolProgress: Instrumentation._tool_progress,
    ToolEnd: Instrumentation._tool_end,
    Spawn: Instrumentation._spawn,
    Refused: Instrumentation._refused,
    ModelText: Instrumentation._text,
}

#: The kinds that make no span nor span event, on purpose: a step is its request's
#: span and its tool calls' (its start and end add nothing), an approval shows as the
#: tool call's span waiting, an actor's stop is the kernel's.
IGNORED: frozenset[type[EventDetail]] = frozenset(
    {StepStart, StepEnd, ApprovalAsked, ApprovalDecision, ActorStop}
)
