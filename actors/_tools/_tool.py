"""Tools: typed Python functions that a model can call, and the toolbox that runs them.

``@tool`` turns a typed function, async or sync, into a ``Tool``. Everything the
model needs is read once, at decoration time, from the function itself:

- the name (the function's, or ``name=``), checked against what provider APIs accept;
- the description: the docstring's text before its first Google-style section
  (``Args:``, ``Returns:``, ``Raises:`` ...), or ``description=``;
- the JSON schema of the arguments: a msgspec Struct built from the signature (types
  from the annotations, defaults from the defaults, descriptions from ``Args:``).

Anything a schema cannot be built for fails right there, with ``ToolDefinitionError``.

``Tool.invoke`` runs one ``ToolCall`` and always answers with a ``ToolOutcome``, never
with an exception: bad JSON, arguments that do not match the schema, a tool that
raises or times out all become error outcomes whose text tells the model what went
wrong and what was expected (a tool's own ``BaseException`` too: ``own_failure``).
Cancellation is never swallowed, nor what ends the program. Async tools run in the
caller's task; sync tools run in a worker thread (a timed-out thread is abandoned,
not killed: Python cannot stop a thread). Results are text: ``str`` as is, ``None`` as
the empty string, anything else as JSON, cut to ``max_result_chars`` with a visible
marker.

A ``Toolbox`` is the set of tools of one agent definition: unique names, the specs
offered to the model, and ``run``, which also answers calls to unknown tools.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
from collections.abc import Callable
from contextvars import ContextVar
from time import perf_counter
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

import anyio
import anyio.to_thread
import msgspec

from .._messages import ToolCall, ToolOutcome, ToolSpec, exception_text, safe_text
from .._parts import ContentError, ContentLimits, MediaPart, Text, split_content
from ._schema import (
    ToolDefinitionError,
    build_arguments,
    check_options,
    describe,
    introspect,
    parse_docstring,
)

__all__ = [
    "DEFAULT_MAX_RESULT_CHARS",
    "EXECUTION_ORIGIN",
    "Tool",
    "ToolDefinitionError",
    "own_failure",
    "tool",
    "truncate",
]

P = ParamSpec("P")
R = TypeVar("R")

#: Default cap on the text of one tool result, in characters.
DEFAULT_MAX_RESULT_CHARS = 20_000
_result_encoder = msgspec.json.Encoder()

#: When the execution whose tool calls run in this task began (``perf_counter``
#: seconds), set by the execution as it begins: an outcome's ``started`` is its
#: call's start after it (the start the outcome's ``seconds`` is measured from, no
#: clock read more). None outside an execution (a tool invoked on its own): no
#: ``started`` then.
EXECUTION_ORIGIN: ContextVar[float | None] = ContextVar("fractor_execution_origin", default=None)


#: What ends the program, never a call's failure.
_ENDINGS = (KeyboardInterrupt, SystemExit, GeneratorExit)


def own_failure(error: BaseException) -> bool:
    """Whether ``error``, raised by a tool or a model, is its own failure: that call
    fails (an error outcome, a failed request) and the tree goes on. Every
    ``Exception`` is; so is a ``BaseException`` of the user's (``class
    Abort(BaseException)``), or a group of such. Never a cancellation (the current
    backend's: asyncio's or trio's), a ``KeyboardInterrupt``, a ``SystemExit`` or a
    ``GeneratorExit``, alone or in a group: those go on, to end what they end."""
    if isinstance(error, Exception):
        return True
    if isinstance(error, BaseExceptionGroup):
        return all(map(own_failure, error.exceptions))
    return not isinstance(error, (*_ENDINGS, anyio.get_cancelled_exc_class()))


class Tool(Generic[P, R]):
    """A function the model can call: its spec, its options and ``invoke``.

    Still callable like the function it wraps. Build one with ``@tool``.
    """

    __slots__ = (
        "_attempts",
        "_decoder",
        "_expected",
        "_invalid_prefix",
        "_positional",
        "_timed_out",
        "approval",
        "arguments_type",
        "description",
        "direct",
        "fn",
        "is_async",
        "limiter",
        "max_result_chars",
        "name",
        "retries",
        "retry_delay",
        "spec",
        "timeout",
    )

    fn: Callable[P, R]
    name: str
    description: str
    spec: ToolSpec
    timeout: float | None
    retries: int
    retry_delay: float
    max_result_chars: int
    limiter: anyio.CapacityLimiter | None
    #: Whether each call waits for a person's approval (``AgentRef.approve``).
    approval: bool
    is_async: bool
    #: The msgspec Struct the JSON arguments are decoded (and validated) into.
    arguments_type: type[msgspec.Struct]

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        retries: int = 0,
        retry_delay: float = 0.0,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        limiter: anyio.CapacityLimiter | None = None,
        approval: bool = False,
    ) -> None:
        candidate: object = fn
        subject = f"cannot make a tool of {describe(candidate)}"
        if isinstance(candidate, Tool):
            raise ToolDefinitionError(
                subject,
                f"it is already the tool {candidate.name!r}",
                "apply @tool once, with every option, to the plain function",
            )
        if not callable(candidate) or isinstance(candidate, type):
            hint = (
                f" (did you mean @tool(name={candidate!r})?)" if isinstance(candidate, str) else ""
            )
            raise ToolDefinitionError(
                subject,
                "it is a class" if isinstance(candidate, type) else "it is not callable",
                f"decorate a function, async or sync{hint}",
            )
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise ToolDefinitionError(
                subject,
                "it is a generator function",
                "a tool returns its result once: return a list instead of yielding",
            )
        hints_source, doc, default_name = introspect(fn)
        name = default_name if name is None else name
        check_options(
            subject,
            name=name,
            timeout=timeout,
            retries=retries,
            retry_delay=retry_delay,
            max_result_chars=max_result_chars,
            limiter=limiter,
        )
        summary, param_docs = parse_docstring(doc or "")
        if description is not None and not isinstance(description, str):
            raise ToolDefinitionError(
                subject, f"description={description!r} is not text", "description is a str"
            )
        struct, parameters = build_arguments(fn, subject, name, hints_source, param_docs)

        self.fn = fn
        self.name = name
        self.description = safe_text(summary if description is None else description)
        self.timeout = None if timeout is None else float(timeout)
        self.retries = retries
        self.retry_delay = float(retry_delay)
        self.max_result_chars = max_result_chars
        self.limiter = limiter
        if not isinstance(approval, bool):
            raise ToolDefinitionError(subject, f"approval={approval!r}", "give True or False")
        self.approval = approval
        self.is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )
        self.arguments_type = struct
        self.spec = ToolSpec(name=name, description=self.description, parameters=parameters)
        self._decoder = msgspec.json.Decoder(struct)
        self._attempts = retries + 1
        self._invalid_prefix = f"invalid arguments for tool {name!r}: "
        self._expected = f"Expected arguments: {msgspec.json.encode(parameters).decode()}"
        self._timed_out = f"tool {name!r} timed out after {self.timeout:g} s" if timeout else ""
        #: An async tool with no timeout and no retries: its caller may await it
        #: itself (``arguments``, the call, then ``succeeded`` or ``failed``), one
        #: frame less per call than ``invoke``.
        self.direct = self.is_async and self.timeout is None and retries == 0
        #: Whether the arguments may be given by position (see ``call_arguments``).
        self._positional = _by_position(fn, struct.__struct_fields__)

    @property
    def __wrapped__(self) -> Callable[P, R]:
        return self.fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def with_function(self, fn: Callable[..., Any]) -> Tool[..., Any]:
        """The same options (name, description, timeout, retries, result cap, limiter)
        around another function, e.g. one that wraps this tool's own to measure it."""
        return Tool(
            fn,
            name=self.name,
            description=self.description,
            timeout=self.timeout,
            retries=self.retries,
            retry_delay=self.retry_delay,
            max_result_chars=self.max_result_chars,
            limiter=self.limiter,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference when it is what its module names (``@tool`` on a
        module-level function: imported again there), else as its function and
        options (for an agent shipped to another host: its compiled decoders are
        rebuilt there). A tool of ``__main__`` (the script run as ``python app.py``)
        goes as its function too, which cloudpickle sends by value: another process's
        ``__main__`` is not that script. A limiter bounds calls in this process only:
        a tool with one stays here."""
        if self.limiter is not None:
            raise TypeError(
                f"tool {self.name!r} has a limiter, which bounds calls in one process: it "
                "cannot run on another host (give the agent there a tool of its own)"
            )
        module_name = getattr(self.fn, "__module__", None)
        qualname = getattr(self.fn, "__qualname__", "")
        module = sys.modules.get(module_name) if module_name and module_name != "__main__" else None
        if module is not None and "." not in qualname and getattr(module, qualname, None) is self:
            return (_named, (module_name, qualname))
        options = {
            "name": self.name,
            "description": self.description,
            "timeout": self.timeout,
            "retries": self.retries,
            "retry_delay": self.retry_delay,
            "max_result_chars": self.max_result_chars,
            "approval": self.approval,
        }
        return (_rebuilt, (self.fn, options))

    def __repr__(self) -> str:
        kind = "async" if self.is_async else "sync"
        return (
            f"<Tool {self.name!r} ({kind}) timeout={self.timeout!r} retries={self.retries}"
            f" max_result_chars={self.max_result_chars}>"
        )

    async def invoke(self, call: ToolCall) -> ToolOutcome:
        """Run ``call`` and describe what happened; never raises an ``Exception``.

        Arguments are validated first (no attempt is made with invalid ones); then up
        to ``1 + retries`` attempts, each under ``timeout``, with an exponential pause
        of ``retry_delay * 2**(n-1)`` seconds after the n-th failed attempt.
        The outcome's ``seconds`` run from here, and within an execution its
        ``started`` says when this was (see ``EXECUTION_ORIGIN``).
        """
        start = perf_counter()
        kwargs = self.arguments(call, start)
        if isinstance(kwargs, ToolOutcome):
            return kwargs
        timeout = self.timeout
        fn: Callable[..., Any] = self.fn
        failure: BaseException | None = None
        for attempt in range(1, self._attempts + 1):
            if attempt > 1 and self.retry_delay:
                await anyio.sleep(self.retry_delay * 2 ** (attempt - 2))
            try:
                if timeout is None:
                    # An async tool is awaited here, not through _attempt: a frame less.
                    value = await (fn(**kwargs) if self.is_async else self._attempt(kwargs))
                else:
                    with anyio.move_on_after(timeout) as scope:
                        value = await self._attempt(kwargs)
                    if scope.cancelled_caught:
                        failure = None
                        continue
            except Exception as exc:
                failure = exc
                continue
            except BaseException as exc:  # a user's Abort(BaseException): a failure too
                if not own_failure(exc):
                    raise  # a cancellation, or the program's end
                failure = exc
                continue
            return self.succeeded(call, value, start, attempt)
        return self.failed(call, failure, start, self._attempts)

    def arguments(self, call: ToolCall, start: float) -> dict[str, Any] | ToolOutcome:
        """The keyword arguments ``call`` names, validated; or the error outcome that
        answers a call whose arguments are invalid (no attempt is made)."""
        decoded = self._decoded(call, start)
        if isinstance(decoded, ToolOutcome):
            return decoded
        return msgspec.structs.asdict(decoded)

    def call_arguments(
        self, call: ToolCall, start: float
    ) -> tuple[tuple[Any, ...], dict[str, Any] | None] | ToolOutcome:
        """``arguments`` for a caller that awaits the tool itself (``direct``): the
        positional arguments and None when every parameter may be given by position
        (no dict of keywords to build and match), else no positional arguments and
        the keyword arguments; or the error outcome, as ``arguments`` gives it."""
        decoded = self._decoded(call, start)
        if isinstance(decoded, ToolOutcome):
            return decoded
        if self._positional:
            return msgspec.structs.astuple(decoded), None
        return (), msgspec.structs.asdict(decoded)

    def _decoded(self, call: ToolCall, start: float) -> msgspec.Struct | ToolOutcome:
        """``call``'s arguments in the tool's arguments struct, validated; or the
        error outcome that answers it (no attempt is made)."""
        raw = call.arguments
        if not raw or raw.isspace():  # stops at the first character of real JSON
            raw = "{}"
        try:
            decoded: msgspec.Struct = self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            problem = str(exc)
        except msgspec.DecodeError as exc:
            problem = f"the arguments are not valid JSON ({exc})"
        except Exception as exc:  # e.g. a __post_init__ of a nested type raising
            problem = exception_text(exc)
        else:
            return decoded
        return self._finish(call, f"{self._invalid_prefix}{problem}. {self._expected}", 0, start)

    def succeeded(self, call: ToolCall, value: object, start: float, attempts: int) -> ToolOutcome:
        """The outcome of a call that returned ``value`` (as text, cut to the cap).

        A tool may return a part (``Image``, ``Document``, ``Audio``) or a list or tuple mixing
        text and parts: the text pieces (joined by a newline) are the result's
        content, the images and documents its ``parts``, checked against the
        default ``ContentLimits`` (too large: an error result saying so).
        """
        if type(value) is str:
            return self._outcome(call, safe_text(value), False, attempts, start)
        if type(value) is int and _INT_MIN <= value < _UINT_END:
            # (what the encoder writes for it: its digits, with no look for parts)
            return self._outcome(call, str(value), False, attempts, start)
        if _has_parts(value):
            text, parts = split_content(value, f"the result of tool {self.name!r}", joiner="\n")
            try:
                _LIMITS.check(parts, f"the result of tool {self.name!r}")
            except ContentError as exc:
                return self._finish(call, f"tool {self.name!r} failed: {exc}", attempts, start)
            outcome = self._outcome(call, safe_text(text), False, attempts, start)
            return msgspec.structs.replace(outcome, parts=parts)
        return self._outcome(call, _to_text(value), False, attempts, start)

    def failed(
        self, call: ToolCall, failure: BaseException | None, start: float, attempts: int
    ) -> ToolOutcome:
        """The outcome of a call whose last attempt raised ``failure`` (None: timed out)."""
        text = self._timed_out
        if failure is not None:
            text = f"tool {self.name!r} failed: {exception_text(failure)}"
        if attempts > 1:
            text = f"{text} (gave up after {attempts} attempts)"
        return self._finish(call, text, attempts, start)

    async def _attempt(self, kwargs: dict[str, Any]) -> Any:
        fn: Callable[..., Any] = self.fn
        if self.is_async:
            return await fn(**kwargs)
        return await anyio.to_thread.run_sync(
            functools.partial(fn, **kwargs), limiter=self.limiter, abandon_on_cancel=True
        )

    def _finish(self, call: ToolCall, error: str, attempts: int, start: float) -> ToolOutcome:
        return self._outcome(call, error, True, attempts, start)

    def _outcome(
        self, call: ToolCall, content: str, is_error: bool, attempts: int, start: float
    ) -> ToolOutcome:
        """``content`` (cut to the result cap) as the outcome of ``call``."""
        if len(content) > self.max_result_chars:
            content = truncate(content, self.max_result_chars)
        origin = EXECUTION_ORIGIN.get()
        return ToolOutcome(
            call=call,
            content=content,
            is_error=is_error,
            seconds=perf_counter() - start,
            attempts=attempts,
            started=None if origin is None else start - origin,
        )


def _by_position(fn: Callable[..., Any], names: tuple[str, ...]) -> bool:
    """Whether a tool's arguments (``names``, the fields of its arguments struct, in
    order) may be passed to ``fn`` by position: a plain function whose own
    parameters, as its code has them (whatever signature it shows: a wrapper's
    ``__wrapped__`` or ``__signature__``), are exactly these, none keyword-only or
    positional-only, with no ``*args`` or ``**kwargs``. Anything else gets them
    by keyword."""
    if not isinstance(fn, types.FunctionType):
        return False
    code = fn.__code__
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        return False
    if code.co_kwonlyargcount or code.co_posonlyargcount:
        return False
    return code.co_varnames[: code.co_argcount] == names


_LIMITS = ContentLimits()
#: The ints a tool's result gives as their digits at once (``succeeded``): those the
#: JSON encoder writes as 64-bit numbers, the same digits.
_INT_MIN, _UINT_END = -(1 << 63), 1 << 64
_PART_TYPES = (Text, MediaPart)


def _has_parts(value: object) -> bool:
    """Whether a tool's return value is a part or a list or tuple holding one."""
    if isinstance(value, _PART_TYPES):
        return True
    return isinstance(value, list | tuple) and any(isinstance(v, _PART_TYPES) for v in value)


def _to_text(value: object) -> str:
    """A tool's return value as the text the model reads."""
    if isinstance(value, str):
        return safe_text(value)
    if value is None:
        return ""
    try:
        return _result_encoder.encode(value).decode()
    except Exception:
        try:
            return repr(value)
        except Exception:
            return f"<{type(value).__qualname__} object that cannot be shown>"


def truncate(content: str, limit: int) -> str:
    """Cut ``content`` to at most ``limit`` characters, ending with a visible marker."""
    total = len(content)
    # The marker's length depends on the number cut; size it for the largest number
    # (``total``), then report the exact count, which is never longer.
    keep = limit - len(f"\n[... truncated {total:,} characters of {total:,}]")
    return f"{content[:keep]}\n[... truncated {total - keep:,} characters of {total:,}]"


def _named(module: str, name: str) -> Tool[..., Any]:
    """A module-level tool, by its module and name (``Tool.__reduce__``)."""
    found: Tool[..., Any] = getattr(importlib.import_module(module), name)
    return found


def _rebuilt(fn: Callable[..., Any], options: dict[str, Any]) -> Tool[..., Any]:
    """A tool again, from what ``Tool.__reduce__`` kept."""
    return Tool(fn, **options)


class _ToolDecorator(Protocol):
    def __call__(self, fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    fn: Callable[P, R],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    retries: int = 0,
    retry_delay: float = 0.0,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    limiter: anyio.CapacityLimiter | None = None,
    approval: bool = False,
) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    retries: int = 0,
    retry_delay: float = 0.0,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    limiter: anyio.CapacityLimiter | None = None,
    approval: bool = False,
) -> _ToolDecorator: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    retries: int = 0,
    retry_delay: float = 0.0,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    limiter: anyio.CapacityLimiter | None = None,
    approval: bool = False,
) -> Tool[..., Any] | _ToolDecorator:
    """Turn a typed function, async or sync, into a ``Tool``; bare or with options.

    ::

        @tool
        async def get_weather(city: str, days: int = 1) -> str:
            \"\"\"Weather forecast for a city.

            Args:
                city: The city, e.g. "Paris".
                days: How many days ahead.
            \"\"\"

        @tool(timeout=5, retries=2)
        def read_file(path: str) -> str: ...

    Options: ``name`` and ``description`` override what is read from the function;
    ``timeout`` (seconds, per attempt); ``retries`` (extra attempts after an exception
    or a timeout) with ``retry_delay`` (seconds, doubled after each failed attempt);
    ``max_result_chars`` caps the result text; ``limiter`` bounds how many calls of a
    sync tool run in threads at once (default: anyio's default thread limiter);
    ``approval=True`` makes each call wait for a person's approval. Raises
    ``ToolDefinitionError`` when the function or an option cannot work.
    """

    def decorate(fn: Callable[P, R], /) -> Tool[P, R]:
        return Tool(
            fn,
            name=name,
            description=description,
            timeout=timeout,
            retries=retries,
            retry_delay=retry_delay,
            max_result_chars=max_result_chars,
            limiter=limiter,
            approval=approval,
        )

    if fn is None:
        return decorate
    return decorate(fn)
