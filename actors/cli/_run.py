"""``fractor run``: one task for an agent on a real model, watched as it runs.

::

    fractor run --model openai:gpt-4.1-mini "Summarize the actor model in 3 lines"
    fractor run --model openai:llama3.2 --base-url http://localhost:11434/v1 "..."
    fractor run --model anthropic:claude-sonnet-4-5 --budget-tokens 20000 "..."
    fractor run --model openai:gpt-4.1-mini --stream "Write a haiku about actors"

``show`` prints the head (the agent, its model and budget, the task) and the end
(status, stop reason, final text, usage). In between, the run is watched with the
live view of ``_live.py``: a live tree on a terminal; elsewhere one plain line
per execution start and end, retry and model step (its tool calls, tokens and time).
With ``--stream`` the answer is printed as it arrives instead (``AgentRef.stream``),
with a line for each tool call and retry. ``--tool MODULE:NAME`` gives the agent a
tool (a ``@tool`` function, or a plain one, of a module in the current directory
or installed: ``_imports.py``); a tool marked
``@tool(approval=True)``, or named by ``--approve``, waits for a person: the command
asks on the terminal (``y`` runs it; anything else denies it, the text as the
reason the model reads), with progress lines instead of the live tree.
``--session NAME`` keeps the agent's conversation in the database (``--db``, as
``fractor trace``): the next run with the same name goes on from it, and each
run ends with the ``fractor trace ID --db PATH`` command that draws its trace;
``--compact-at TOKENS`` (and ``--keep N``) folds its old turns into a summary
(``Compaction``), and ``--resume`` picks up a run that stopped before its answer
(``ask(..., resume=True)``). ``--image FILE`` (PNG, JPEG, WebP, GIF) and ``--file
FILE`` (a PDF, or a WAV or MP3 recording), each repeatable, give the task images,
documents and recordings, read and
checked (their kind from their bytes, their size against ``ContentLimits``) before
anything runs; the head, the progress lines, the live tree and ``fractor trace``
show each as one line (``[image 1024x768 png, 182 KB, sha256:ab12cd34]``), never
its bytes. Exit status: 0 when the task completed, 1 when it ended otherwise
(failed, budget, time), 2 for bad options.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import anyio
import anyio.to_thread

from fractor.runtime import Budget, EventDetail, Runtime, SQLiteStore, Store, Subscription

from .._agent._agent import Agent, AgentRef
from .._agent._policy import RetryPolicy
from .._agent._ref import TaskContent
from .._memory._summarizer import Compaction
from .._messages import Result
from .._observation._events import (
    ApprovalAsked,
    ApprovalDecision,
    BudgetResume,
    BudgetWait,
    CompactionEnd,
    DeadlineReached,
    ExecutionEnd,
    ExecutionStart,
    LimitReached,
    ModelText,
    Restart,
    Retry,
    ToolEnd,
    ToolProgress,
    ToolStart,
)
from .._observation._lines import generic_line
from .._parts import (
    MEDIA_KINDS,
    ContentError,
    ContentLimits,
    Image,
    Media,
    describe_part,
    part_from_file,
)
from .._tools._approval import ApprovalError
from .._tools._tool import Tool, ToolDefinitionError, tool
from ..providers import PROVIDERS, ProviderError, model_from_string, redact
from ._imports import import_spec, is_function_of
from ._live import watch
from ._trace import default_db
from ._ui import check_ui, web_view

__all__ = [
    "STREAM_IGNORED",
    "Event",
    "add_run_parser",
    "load_parts",
    "run_command",
    "show",
    "stream_note",
]


# -- what is shown ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    agent: str
    model: str
    base_url: str
    task: str
    budget: Budget | None
    #: The task's images and documents, each as its one line (``describe_part``).
    parts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    result: Result
    #: Whether the answer's text was already printed as it streamed.
    streamed: bool = False


Event = Started | Finished


def show(event: Event, out: TextIO | None = None) -> None:
    """Print the head or the end of a run as plain lines."""
    out = sys.stdout if out is None else out
    match event:
        case Started(
            agent=agent, model=model, base_url=base_url, task=task, budget=budget, parts=parts
        ):
            limits = _budget_text(budget)
            print(f"agent {agent!r} started on {model} ({base_url}){limits}", file=out)
            print(f"task: {task}", file=out)
            for part in parts:
                print(f"with: {part}", file=out)
        case Finished(result=result, streamed=streamed):
            usage = result.usage
            # (A text that says its stop reason already, a failure's, says it once.)
            reason = result.stop_reason
            said = not streamed and bool(reason) and reason in result.text
            print(f"status: {result.status}" + ("" if said else f" ({reason})"), file=out)
            if not streamed:
                print(result.text, file=out)
            for media in result.parts:
                print(f"with: {describe_part(media)}", file=out)
            print(
                f"usage: {usage.input_tokens} input tokens ({usage.cached_tokens} cached), "
                f"{usage.output_tokens} output tokens, {usage.requests} request(s), "
                f"{usage.tool_calls} tool call(s)",
                file=out,
            )
    out.flush()


def _budget_text(budget: Budget | None) -> str:
    if budget is None:
        return ""
    limits = [
        f"{name}={getattr(budget, name):g}"
        for name in ("tokens", "seconds", "requests")
        if getattr(budget, name) is not None
    ]
    return f", budget {' '.join(limits)}" if limits else ""


# -- the command ------------------------------------------------------------------------


def _whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _whole_number(1)
_non_negative_int = _whole_number(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to the ``fractor`` subcommands (``parser.add_subparsers()``)."""
    run: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="run one task with a real model (OpenAI-compatible or Anthropic)",
        description=(
            "Run one task for an agent on a real model and print its progress. The API key "
            "is read from OPENAI_API_KEY or ANTHROPIC_API_KEY (or --api-key-env); a local "
            "OpenAI-compatible server needs only --base-url."
        ),
    )
    run.add_argument("task", help="what the agent should do")
    run.add_argument(
        "--model",
        required=True,
        metavar="PROVIDER:MODEL",
        help="for example openai:gpt-4.1-mini or anthropic:claude-sonnet-4-5",
    )
    run.add_argument(
        "--base-url",
        metavar="URL",
        help="an OpenAI-compatible server, e.g. http://localhost:11434/v1 (Ollama)",
    )
    run.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="read the API key from this environment variable instead of the provider's",
    )
    run.add_argument("--budget-tokens", type=_positive_int, metavar="N", help="token limit")
    run.add_argument("--budget-seconds", type=_positive_float, metavar="S", help="wall-clock limit")
    run.add_argument(
        "--budget-requests", type=_positive_int, metavar="N", help="model request limit"
    )
    run.add_argument(
        "--max-tokens", type=_positive_int, metavar="N", help="output cap of each request"
    )
    run.add_argument("--instructions", default="", metavar="TEXT", help="the system prompt")
    run.add_argument(
        "--retries",
        type=_non_negative_int,
        default=2,
        metavar="N",
        help="retries of a failed request: rate limits, server errors (default 2)",
    )
    run.add_argument(
        "--timeout",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="seconds one model request may take (default 60)",
    )
    run.add_argument(
        "--tool",
        action="append",
        metavar="MODULE:NAME",
        help="give the agent this tool: a function or @tool of a module in the current "
        "directory or installed, e.g. mytools:search; repeatable",
    )
    run.add_argument(
        "--approve",
        action="append",
        metavar="TOOL",
        help="ask on the terminal before each call of this tool; repeatable",
    )
    run.add_argument(
        "--image",
        action="append",
        metavar="FILE",
        help="give the task this image (PNG, JPEG, WebP or GIF); repeatable",
    )
    run.add_argument(
        "--file",
        action="append",
        metavar="FILE",
        help="give the task this file (a PDF, a WAV or MP3 recording); repeatable",
    )
    run.add_argument(
        "--stream",
        action="store_true",
        help="print the answer as it arrives (instead of the live view)",
    )
    run.add_argument(
        "--ui",
        action="store_true",
        help="serve the web view of the run's tree on 127.0.0.1 while it runs "
        "(its URL, with its token, on stderr; needs fractor[ui])",
    )
    run.add_argument(
        "--session",
        metavar="NAME",
        help="keep the conversation in the database under this name; the next run with "
        "the same name goes on from it",
    )
    run.add_argument(
        "--db", metavar="PATH", help="the database of --session (default $FRACTOR_DB or fractor.db)"
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="pick up the session's last run if it stopped before its answer (needs --session)",
    )
    run.add_argument(
        "--compact-at",
        type=_positive_int,
        metavar="TOKENS",
        help="fold old turns of the conversation into a summary from this size on",
    )
    run.add_argument(
        "--keep",
        type=_non_negative_int,
        default=4,
        metavar="N",
        help="turns kept verbatim when it folds (default 4; with --compact-at)",
    )
    run.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="event loop to run on"
    )
    return run


@asynccontextmanager
async def _store(session: str | None, db: str | None) -> AsyncIterator[Store | None]:
    """The database of a session (none without one)."""
    if not session:
        yield None
        return
    async with SQLiteStore(db or default_db()) as store:
        yield store


def stream_note(detail: EventDetail) -> str | None:
    """The note ``fractor run`` writes on its own line for the detail of a stream's
    event (None: one it does not note, of ``STREAM_IGNORED``; the text itself is
    written as it comes); a kind it has no words for, as it is (``generic_line``)."""
    match detail:
        case ToolStart(tool=tool, arguments=arguments):
            return f"[calling {tool}({arguments})]"
        case ToolProgress(tool=tool, progress=progress, total=total, message=message):
            done = f"{progress:g}" + (f"/{total:g}" if total is not None else "")
            return f"[{tool}: {done}{': ' + message if message else ''}]"
        case ToolEnd(tool=tool, is_error=is_error, seconds=seconds, parts=parts):
            done = f"[{tool} {'failed' if is_error else 'done'} in {seconds:.2f} s]"
            return "\n".join([done, *(f"[{tool} returned {part}]" for part in parts)])
        case Retry(attempt=attempt, error=error, delay=delay):
            return f"[retry {attempt} in {delay:.1f} s: {error}]"
        case Restart(restarts=restarts, reason=reason):
            return f"[restart {restarts}: {reason}]"
        case CompactionEnd(ok=ok, turns=turns, error=error):
            return f"[folded {turns} old turn(s) into the summary]" if ok else f"[{error}]"
        case BudgetWait(reason=reason):
            return f"[waiting: {reason}]"
        case ApprovalAsked(tool=tool, arguments=arguments):
            return f"[{tool}({arguments}) waits for approval]"
        case LimitReached(reason=reason) | DeadlineReached(reason=reason):
            return f"[stopped: {reason}]"
        case _ if type(detail) in STREAM_IGNORED:
            return None
    return f"[{generic_line(detail)}]"


#: The kinds a stream yields that ``fractor run`` notes nothing for, on purpose: the
#: text (it is written as it comes), a wait's end, an approval's decision (the prompt
#: took it), the subagents' starts and ends (``run`` streams one agent).
STREAM_IGNORED: frozenset[type[EventDetail]] = frozenset(
    {ModelText, BudgetResume, ApprovalDecision, ExecutionStart, ExecutionEnd}
)


#: What ``--file`` takes: every kind of part but images (``--image``).
_FILES = " or ".join(
    name for kind in MEDIA_KINDS if kind is not Image for name in kind.media_types.values()
)


def load_parts(images: list[str], files: list[str]) -> tuple[Media, ...]:
    """The images (``--image``) and other parts (``--file``: PDFs, recordings) read
    from their files (their kind by their bytes), in that
    order, checked against the default ``ContentLimits`` (each, and all together); a
    ``ValueError`` naming the option and the file for one missing, unreadable, of
    another kind or too large."""
    limits = ContentLimits()
    parts: list[Media] = []
    for option, paths in (("--image", images), ("--file", files)):
        for path in paths:
            try:
                if option == "--image":
                    parts.append(Image.from_file(path, max_bytes=limits.part))
                else:
                    part = part_from_file(path, max_bytes=limits.part)
                    if type(part) is Image:
                        raise ContentError(
                            f"a --file must be {_FILES}, got bytes of {part.media_type}"
                        )
                    parts.append(part)
            except FileNotFoundError:
                raise ValueError(f"{option} {path!r}: no such file") from None
            except IsADirectoryError:
                raise ValueError(f"{option} {path!r}: a directory, not a file") from None
            except OSError as exc:
                raise ValueError(f"{option} {path!r}: cannot read it: {exc.strerror}") from None
            except ContentError as exc:
                hint = "a PDF goes with --file" if option == "--image" else "an image with --image"
                raise ValueError(f"{option} {path!r}: {exc} ({hint})") from None
    try:
        limits.check(parts, "the task")
    except ContentError as exc:
        raise ValueError(str(exc)) from None
    return tuple(parts)


async def _streamed(
    ref: AgentRef, task: TaskContent, out: TextIO, *, resume: bool = False
) -> tuple[Result, bool]:
    """Run ``task`` streamed: the model's text as it comes, a line per tool call and
    retry. Also whether the answer was printed whole (the text of its last step)."""
    at_line_start = True
    steps: dict[int, str] = {}
    async with ref.stream(task, resume=resume) as run:
        async for event in run:
            detail = event.detail
            if isinstance(detail, ModelText):
                steps[detail.step] = steps.get(detail.step, "") + detail.text
                out.write(detail.text)
                out.flush()
                at_line_start = detail.text.endswith("\n")
                continue
            if isinstance(detail, Retry):
                steps.clear()  # the request's text starts over
            note = stream_note(detail)
            if note is None:
                continue
            out.write(("" if at_line_start else "\n") + note + "\n")
            out.flush()
            at_line_start = True
    if not at_line_start:
        out.write("\n")
        out.flush()
    result = run.result
    last = steps[max(steps)] if steps else ""
    return result, result.ok and last == result.text


async def run_command(args: argparse.Namespace) -> int:
    """Run ``fractor run``; returns the exit status."""
    # The options first, then the key: a wrong option is said before a missing key.
    try:
        if args.resume and not args.session:
            raise ValueError("--resume picks up a session: give its name with --session NAME")
        if args.session is not None and not args.session.strip():
            raise ValueError(f"--session {args.session!r}: a name of its own, not empty")
        parts = load_parts(args.image or [], args.file or [])
        tools = _load_tools(args.tool or [])
        if args.ui:
            check_ui()
    except ValueError as exc:
        print(f"fractor run: {exc}", file=sys.stderr)
        return 2
    task: TaskContent = [args.task, *parts] if parts else args.task
    api_key: str | None = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            print(
                f"fractor run: the environment variable {args.api_key_env} "
                "(--api-key-env) is not set",
                file=sys.stderr,
            )
            return 2
    try:
        model = model_from_string(
            args.model, base_url=args.base_url, api_key=api_key, timeout=args.timeout
        )
    except ProviderError as exc:
        print(f"fractor run: {_in_options(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"fractor run: {exc}", file=sys.stderr)
        return 2
    budget = None
    if any(v is not None for v in (args.budget_tokens, args.budget_seconds, args.budget_requests)):
        budget = Budget(
            tokens=args.budget_tokens, seconds=args.budget_seconds, requests=args.budget_requests
        )
    memory = None
    if args.compact_at is not None:
        memory = Compaction(threshold=args.compact_at, keep=args.keep)
    try:
        agent = Agent(
            name="assistant",
            model=model,
            tools=tools,
            instructions=args.instructions,
            max_tokens=args.max_tokens,
            retry=RetryPolicy(retries=args.retries),
            approval=args.approve or None,
            memory=memory,
        )
        base_url = redact(getattr(model, "base_url", None) or "", ())  # no credentials shown
        show(
            Started(
                agent=agent.name,
                model=model.name,
                base_url=base_url,
                task=args.task,
                budget=budget,
                parts=tuple(map(describe_part, parts)),
            )
        )
        asking = agent.approve is not None
        async with _store(args.session, args.db) as store:
            if args.stream:
                async with (
                    Runtime(budget=budget, store=store) as runtime,
                    web_view(runtime, args.ui, secrets=[api_key or ""]),
                ):
                    ref = await runtime.spawn(agent, id=args.session)
                    async with _approvals_asked(runtime, ref, asking):
                        result, printed = await _streamed(ref, task, sys.stdout, resume=args.resume)
                    kept = await ref.conversation()
                show(Finished(result=result, streamed=printed))
            else:
                plain = True if asking else None
                async with (
                    Runtime(budget=budget, store=store) as runtime,
                    watch(runtime, steps=True, title="fractor run", plain=plain),
                    web_view(runtime, args.ui, secrets=[api_key or ""]),
                ):
                    ref = await runtime.spawn(agent, id=args.session)
                    async with _approvals_asked(runtime, ref, asking):
                        result = await ref.ask(task, resume=args.resume)
                    kept = await ref.conversation()
                show(Finished(result=result))
            if args.session:
                turns = len(kept.messages) // 2
                folded = f", {kept.summarized} more in its summary" if kept.summarized else ""
                db = args.db or default_db()
                # A command to paste into a shell: quoted for it, with the database named.
                shown = shlex.join(["fractor", "trace", result.execution_id, "--db", db])
                print(
                    f"session {args.session!r}: {turns} turn{'' if turns == 1 else 's'}{folded}, "
                    f"kept in {db}; its trace: {shown}"
                )
    finally:
        await model.aclose()
    return 0 if result.ok else 1


def _in_options(error: ProviderError) -> str:
    """What ``error`` says, in this command's options where it gives a library user's
    advice (``api_key=...``, ``base_url=...``): a missing key names ``--api-key-env``
    and ``--base-url``."""
    if error.kind != "no_key":
        return str(error)
    variable = getattr(PROVIDERS.get(error.provider), "env_var", None)
    where = f"the environment variable {variable}" if variable else "the provider's key variable"
    return (
        f"{error.provider}: no API key was given; set {where}, or name the variable that "
        "holds it with --api-key-env VAR; for a local server that needs no key, give its "
        "--base-url URL"
    )


def _load_tools(specs: list[str]) -> list[Tool[..., Any]]:
    """The tools named ``module:name`` (a ``@tool`` function, or a plain one), imported
    as ``_imports.import_spec`` does (the current directory too); a ``ValueError``
    saying which spec is wrong and how."""
    tools: list[Tool[..., Any]] = []
    for spec in specs:
        found = import_spec(
            spec,
            option="--tool",
            example="mytools:search",
            fits=is_function_of,
            kind="functions",
        )
        try:
            tools.append(found if isinstance(found, Tool) else tool(typing.cast(Any, found)))
        except ToolDefinitionError as exc:
            raise ValueError(f"--tool {spec!r}: {exc}") from None
    return tools


@asynccontextmanager
async def _approvals_asked(runtime: Runtime, ref: AgentRef, asking: bool) -> AsyncIterator[None]:
    """While the block runs, ask on the terminal about each call held for approval."""
    if not asking:
        yield
        return
    async with runtime.events() as events, anyio.create_task_group() as tg:
        tg.start_soon(_ask_each, events, ref)
        yield
        tg.cancel_scope.cancel()


async def _ask_each(events: Subscription, ref: AgentRef) -> None:
    async for event in events:
        detail = event.detail
        if not isinstance(detail, ApprovalAsked):
            continue
        prompt = (
            f"approve {detail.tool}({detail.arguments})? "
            "[y to run it; anything else denies it, as the reason] "
        )
        try:
            line = await anyio.to_thread.run_sync(input, prompt, abandon_on_cancel=True)
        except EOFError:
            line = "no answer: the terminal's input is closed"
        answer = line.strip()
        request_id = detail.id
        with contextlib.suppress(ApprovalError):  # ended meanwhile (a deadline, a stop)
            if answer.lower() in ("y", "yes"):
                ref.approve(request_id)
            else:
                reason = answer[1:].strip() if answer.lower().startswith("n ") else answer
                ref.deny(request_id, "" if answer.lower() in ("", "n", "no") else reason)
