"""``fractor bench``: the benchmark suite, or one of your own tools under the runtime.

::

    fractor bench [--quick] [--only PREFIX] [--backend trio] [--json PATH]
    fractor bench --tool mypackage.tools:search --args '{"query": "actors"}' \\
        --fanout 20 --concurrency 8 --calls 500

The first form runs the suite of ``benchmarks``: ``python -m benchmarks`` in a
subprocess (the suite measures the product, so the product never imports it), its
output streamed as it comes. It prints the table and writes it as JSON (default
``fractor-bench.json`` in the current directory); exit status 0 when every target
holds, 1 otherwise.

The second form imports ``FUNCTION`` from ``MODULE`` (a plain function, async or sync,
or a ``@tool``; the current directory is searched) and measures it under an agent:
``--fanout`` calls per step, at most ``--concurrency`` at once, until ``--calls`` calls
ran (see ``_tool_bench.py``). It reports throughput, latency percentiles, errors
and the peak concurrency reached, with a progress bar on a terminal (plain lines
otherwise, on stderr); ``--json PATH`` also writes the report. Exit status 0 when
every call succeeded, 1 when some failed.

Bad options (an unknown module or function, arguments that do not fit the tool's
schema, a count below 1) exit with status 2 and a message on stderr, before anything
runs.
"""

from __future__ import annotations

import argparse
import codecs
import functools
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, TextIO

import anyio
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._tool_bench import BenchInputError, ToolReport, load_target, measure, prepare

__all__ = ["DEFAULT_JSON", "add_bench_parser", "bench_command", "print_report"]

#: Where ``fractor bench`` writes the suite's results unless ``--json`` says otherwise.
DEFAULT_JSON = "fractor-bench.json"
#: ``--fanout`` and ``--calls`` when not given (``--concurrency`` defaults to the fan-out).
DEFAULT_FANOUT = 10
DEFAULT_CALLS = 200
_SUITE_ONLY = ("quick", "only")
_TOOL_ONLY = ("args", "fanout", "concurrency", "calls", "sweep", "svg", "ui")
#: The suite's package, run as ``python -m benchmarks``: never imported from here.
_SUITE = "fractor.benchmarks"
#: Worker threads anyio's default limiter lets sync tools use at once.
_THREADS = 40


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to the ``fractor`` subcommands (``parser.add_subparsers()``)."""
    bench: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="run the benchmark suite, or measure your own tool under the runtime",
        description=(
            "Without --tool: run fractor's benchmark suite, each figure beside a raw anyio "
            "loop, and check its targets. With --tool: measure your own tool under an "
            "agent (throughput, latency p50/p95/p99, errors, peak concurrency), to size "
            "its concurrency limits before you deploy."
        ),
    )
    suite = bench.add_argument_group("the suite")
    suite.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    suite.add_argument(
        "--only", metavar="PREFIX", help="run the workloads whose name starts with this, e.g. W1"
    )
    mine = bench.add_argument_group("your tool")
    mine.add_argument(
        "--tool",
        metavar="MODULE:FUNCTION",
        help="the function (async or sync) or @tool to measure, e.g. mypackage.tools:search",
    )
    mine.add_argument(
        "--args", metavar="JSON", help="the arguments of every call, a JSON object (default {})"
    )
    mine.add_argument(
        "--fanout",
        type=int,
        metavar="K",
        help=f"tool calls the model asks for per step (default {DEFAULT_FANOUT})",
    )
    mine.add_argument(
        "--concurrency",
        type=int,
        metavar="C",
        help="the agent's tool_concurrency: calls of one step run at once (default K)",
    )
    mine.add_argument(
        "--calls",
        type=int,
        metavar="N",
        help=f"tool calls to run in all (default {DEFAULT_CALLS})",
    )
    mine.add_argument(
        "--sweep",
        metavar="LEVELS",
        help="measure the tool at each concurrency, e.g. 1,2,4,...,64 (--calls calls per "
        "level, made directly with anyio): throughput, p50/p95/p99 and the knee",
    )
    mine.add_argument(
        "--svg", metavar="FILE", help="with --sweep: also write the chart as an SVG file"
    )
    mine.add_argument(
        "--ui",
        action="store_const",
        const=True,
        default=None,
        help="with --sweep: serve the chart on 127.0.0.1 as it grows, level by level, "
        "until Ctrl-C (the ui extra)",
    )
    bench.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="event loop to run on"
    )
    bench.add_argument(
        "--json",
        metavar="PATH",
        help=f"write the results as JSON (the suite's default: {DEFAULT_JSON})",
    )
    return bench


def bench_command(args: argparse.Namespace) -> int:
    """Run ``fractor bench``; the exit status. Starts its own event loop."""
    if args.backend == "trio" and not _trio_installed():
        return _fail("--backend trio needs the trio package: pip install trio")
    if args.tool is None:
        return _suite(args)
    if args.sweep is not None or args.svg is not None or args.ui is not None:
        from ._bench_sweep import sweep_command

        return sweep_command(args)
    return _tool(args)


def _trio_installed() -> bool:
    return importlib.util.find_spec("trio") is not None


# -- the suite ----------------------------------------------------------------------------


def _suite(args: argparse.Namespace) -> int:
    stray = [f"--{name}" for name in _TOOL_ONLY if getattr(args, name) is not None]
    if stray:
        return _fail(f"{', '.join(stray)} only apply with --tool MODULE:FUNCTION")
    if importlib.util.find_spec(_SUITE) is None:
        return _fail(f"the benchmark suite is not installed with this fractor (no {_SUITE!r})")
    path = _json_path(args.json or DEFAULT_JSON)
    if isinstance(path, int):
        return path
    # The suite checks --only itself (it knows its workloads) and reports a bad one
    # under our name, with exit status 2.
    command = [sys.executable, "-m", _SUITE, "--prog", "fractor bench"]
    command += ["--backend", args.backend, "--json", str(path)]
    if args.quick:
        command.append("--quick")
    if args.only is not None:
        command += ["--only", args.only]
    return _relay(command)


def _relay(command: list[str]) -> int:
    """Run ``command``, its output and errors copied to ours as they come; its exit status."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None
        assert child.stderr is not None
        errors = threading.Thread(target=_copy, args=(child.stderr, sys.stderr), daemon=True)
        errors.start()
        _copy(child.stdout, sys.stdout)
        errors.join()
        return child.wait()


def _copy(source: IO[bytes], target: TextIO) -> None:
    """Copy ``source`` to ``target`` until it ends, each chunk as soon as it is read
    (the suite's progress lines end in mid-line while a workload runs)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(source.fileno(), 65536):
        target.write(decoder.decode(chunk))
        target.flush()
    target.write(decoder.decode(b"", final=True))


# -- your tool ----------------------------------------------------------------------------


def _tool(args: argparse.Namespace) -> int:
    stray = [f"--{name}" for name in _SUITE_ONLY if getattr(args, name) not in (None, False)]
    if stray:
        return _fail(f"{', '.join(stray)} only apply to the suite, not with --tool")
    fanout: int = DEFAULT_FANOUT if args.fanout is None else args.fanout
    concurrency: int = fanout if args.concurrency is None else args.concurrency
    calls: int = DEFAULT_CALLS if args.calls is None else args.calls
    for option, value in (("--fanout", fanout), ("--concurrency", concurrency), ("--calls", calls)):
        if value < 1:
            return _fail(f"{option} must be a whole number >= 1, got {value}")
    arguments: str = "{}" if args.args is None else args.args
    try:
        subject, gauge = prepare(load_target(args.tool), arguments)
    except BenchInputError as exc:
        return _fail(str(exc))
    path = None if args.json is None else _json_path(args.json)
    if isinstance(path, int):
        return path
    run = functools.partial(
        measure, subject, gauge, arguments, fanout=fanout, concurrency=concurrency, calls=calls
    )
    console = Console(stderr=True, highlight=False)
    if console.is_terminal and not console.is_dumb_terminal:
        with Progress(
            TextColumn(f"[bold]{subject.name}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("calls"),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("calls", total=calls)
            report = anyio.run(
                functools.partial(run, progress=lambda done, _: bar.update(task, completed=done)),
                backend=args.backend,
            )
    else:
        report = anyio.run(
            functools.partial(run, progress=_plain_progress(subject.name)), backend=args.backend
        )
    print_report(report, args.backend)
    if path is not None:
        document = {"backend": args.backend, **msgspec.to_builtins(report)}
        try:
            path.write_text(json.dumps(document, indent=2) + "\n")
        except OSError as exc:
            return _fail(f"cannot write {str(path)!r}: {exc}")
        print(f"report written to {path}")
    return 0 if report.errors == 0 and not report.incomplete else 1


def _plain_progress(name: str) -> Callable[[int, int], None]:
    """A progress line on stderr at every tenth of the calls."""
    shown = -1

    def show(done: int, total: int) -> None:
        nonlocal shown
        tenth = done * 10 // total
        if tenth > shown:
            shown = tenth
            print(f"bench {name}: {done}/{total} calls", file=sys.stderr, flush=True)

    return show


def print_report(report: ToolReport, backend: str) -> None:
    """The report of ``fractor bench --tool`` as plain lines on stdout."""
    limit = min(report.fanout, report.concurrency, report.calls)
    lines = [
        f"tool {report.tool!r} ({report.kind}), arguments {report.arguments}",
        f"  plan              {report.calls} calls, {report.fanout} per step, "
        f"tool_concurrency {report.concurrency}, on {backend}",
        f"  wall time         {_seconds(report.wall_seconds)} ({report.executions} execution(s))",
        f"  throughput        {report.throughput:,.1f} calls/s",
        f"  latency           p50 {_seconds(report.p50)}  p95 {_seconds(report.p95)}  "
        f"p99 {_seconds(report.p99)}  max {_seconds(report.max)}",
        f"  errors            {report.errors} of {report.calls}",
        f"  peak concurrency  {report.peak_concurrency} (the most that could run at once: {limit})",
    ]
    if report.first_error:
        lines.insert(-1, f"  first error       {report.first_error}")
    if report.kind == "sync" and report.peak_concurrency <= _THREADS < limit:
        lines.append(
            f"  note: sync tools run in worker threads, at most {_THREADS} at once by default;\n"
            "        give @tool a limiter=anyio.CapacityLimiter(n) to allow more"
        )
    if report.incomplete:
        lines.append(f"  stopped early: {report.incomplete}")
    print("\n".join(lines))


def _seconds(value: float) -> str:
    if value < 0.001:
        return f"{value * 1e6:,.0f} us"
    if value < 1:
        return f"{value * 1000:,.2f} ms"
    return f"{value:,.2f} s"


def _json_path(text: str) -> pathlib.Path | int:
    """``text`` as a path to write, or the exit status of a clear error if it cannot be."""
    path = pathlib.Path(text)
    if path.is_dir():
        return _fail(f"--json {text!r} is a directory; give a file path")
    if not path.parent.is_dir():
        return _fail(f"--json {text!r}: the directory {str(path.parent)!r} does not exist")
    return path


def _fail(message: str) -> int:
    print(f"fractor bench: {message}", file=sys.stderr)
    return 2
