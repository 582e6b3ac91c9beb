"""``fractor bench --tool MODULE:FUNCTION --sweep 1,2,4,...,64 [--calls N] [--svg FILE]
[--json FILE] [--ui]``.

The tool is called ``--calls`` times (default ``DEFAULT_CALLS``) at each concurrency
level of ``--sweep`` (``fractor.actors.ui._sweep``); the table of throughput and
p50/p95/p99 latency is printed with the knee, ``--svg FILE`` writes the chart and
``--json FILE`` the measured levels (a ``SweepReport`` as JSON). With ``--ui`` the
chart is also served on 127.0.0.1 (``fractor.actors.ui.serve_sweep``, its URL with
its token said once on stderr): it grows as each level is measured, the level under
way shown with its calls done, the knee marked; once the sweep ended the page stays
until Ctrl-C (or SIGTERM), which also stops a sweep under way.
Bad options (an unknown module or function, a bad level list, a count below 1,
options of the other forms, ``--ui`` without the ui extra) exit with status 2 and a
message, before anything runs.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys
from collections.abc import Callable

import anyio
import msgspec

from ..ui.charts import (
    SweepInputError,
    SweepReport,
    as_tool,
    format_sweep_table,
    parse_levels,
    render_sweep_svg,
    sweep,
)
from ._tool_bench import BenchInputError, check_arguments, load_target
from ._ui import check_ui

__all__ = ["DEFAULT_CALLS", "sweep_command"]

#: Calls per level when ``--calls`` is not given.
DEFAULT_CALLS = 100


def sweep_command(args: argparse.Namespace) -> int:
    """Run a sweep; the exit status (0, or 1 when some call failed or a signal stopped
    it before its end). Starts its own loop."""
    if args.sweep is None:
        given = [f"--{name}" for name in ("svg", "ui") if getattr(args, name) is not None]
        verb = "applies" if len(given) == 1 else "apply"
        return _fail(f"{' and '.join(given)} only {verb} with --sweep LEVELS")
    stray = [f"--{name}" for name in ("fanout", "concurrency") if getattr(args, name)]
    if stray:
        return _fail(f"{', '.join(stray)} do not apply with --sweep (it sets the concurrency)")
    calls: int = DEFAULT_CALLS if args.calls is None else args.calls
    if calls < 1:
        return _fail(f"--calls must be a whole number >= 1, got {calls}")
    arguments: str = "{}" if args.args is None else args.args
    files: dict[str, pathlib.Path] = {}
    for option in ("svg", "json"):
        given = getattr(args, option)
        if given is None:
            continue
        path = files[option] = pathlib.Path(given)
        if path.is_dir() or not path.parent.is_dir():
            where = f"the directory {str(path.parent)!r} does not exist"
            return _fail(f"--{option} {given!r}: " + ("is a directory" if path.is_dir() else where))
    try:
        if args.ui:
            check_ui()
        levels = parse_levels(args.sweep)
        target = load_target(args.tool)
        check_arguments(as_tool(target), arguments)
    except (SweepInputError, BenchInputError, ValueError) as exc:
        return _fail(str(exc))

    def done(report: SweepReport) -> None:
        sys.stdout.write(format_sweep_table(report))
        sys.stdout.flush()
        if "svg" in files:
            files["svg"].write_text(render_sweep_svg(report), encoding="utf-8")
            print(f"wrote the chart to {files['svg']}", file=sys.stderr)
        if "json" in files:
            files["json"].write_bytes(msgspec.json.format(msgspec.json.encode(report)) + b"\n")
            print(f"wrote the levels to {files['json']}", file=sys.stderr)

    run = _run_served if args.ui else _run
    report = anyio.run(run, target, levels, calls, arguments, done, backend=args.backend)
    if report is None:
        print("fractor bench: stopped before the sweep ended", file=sys.stderr)
        return 1
    return 1 if any(level.errors for level in report.levels) else 0


async def _run(
    target: object,
    levels: tuple[int, ...],
    calls: int,
    arguments: str,
    done: Callable[[SweepReport], None],
) -> SweepReport:
    report = await sweep(target, levels, calls=calls, arguments=arguments)
    done(report)
    return report


async def _run_served(
    target: object,
    levels: tuple[int, ...],
    calls: int,
    arguments: str,
    done: Callable[[SweepReport], None],
) -> SweepReport | None:
    """The sweep with its page served; None if a signal stopped it before its end."""
    from ..ui import serve_sweep

    report: SweepReport | None = None
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with (
            serve_sweep(as_tool(target).name, levels, calls=calls) as page,
            anyio.create_task_group() as tg,
        ):

            async def stop_on_signal() -> None:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

            tg.start_soon(stop_on_signal)
            report = await sweep(
                target,
                levels,
                calls=calls,
                arguments=arguments,
                on_call=page.called,
                on_level=page.measured,
            )
            page.finish(report)
            done(report)
            print("the chart stays served until Ctrl-C", file=sys.stderr, flush=True)
            await anyio.sleep_forever()
    return report


def _fail(message: str) -> int:
    print(f"fractor bench: {message}", file=sys.stderr)
    return 2
