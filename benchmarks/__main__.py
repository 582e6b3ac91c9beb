"""Run every benchmark: ``python -m benchmarks [--backend trio] [--quick] [--only PREFIX]``.

Each workload of a run of several runs in a fresh process of its own (this module,
with ``--only`` that workload), so that no figure depends on what ran before it in
the same heap: fractor and its raw baseline are always measured side by side in one
process, a clean one. ``fractor bench`` runs this module in a subprocess: the suite
imports ``actors`` and ``runtime`` to measure them, never the other way round.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import anyio
import msgspec

from . import (
    budget,
    memory,
    multimodal,
    scale,
    w1_fanout,
    w2_steps,
    w3_subagents,
    w4_mailbox,
    whole_path,
)
from ._harness import RESULTS, Row, print_rows, write_results

Workload = tuple[str, Callable[[bool], Awaitable[list[Row]]]]


async def _scaleout(quick: bool) -> list[Row]:
    """Scale-out on Ray: Ray is an extra (``fractor[ray]``), imported only here, and
    without it the workload reports nothing rather than failing the suite."""
    if importlib.util.find_spec("ray") is None:
        print("skipped: Ray is not installed (pip install 'fractor[ray]')", end=" ")
        return []
    from . import scaleout

    return await scaleout.run(quick=quick)


async def _provider(quick: bool) -> list[Row]:
    """Provider path: the OpenAI SDK is an extra (``fractor[openai]``), imported only
    here, and without it the workload reports nothing rather than failing the suite."""
    if importlib.util.find_spec("openai") is None:
        print("skipped: the OpenAI SDK is not installed (pip install 'fractor[openai]')", end=" ")
        return []
    from . import provider

    return await provider.run(quick=quick)


async def _ratelimits(quick: bool) -> list[Row]:
    """Rate limits against the bare SDK's own retries: the OpenAI SDK is an extra, as
    for the provider path."""
    if importlib.util.find_spec("openai") is None:
        print("skipped: the OpenAI SDK is not installed (pip install 'fractor[openai]')", end=" ")
        return []
    from . import ratelimits

    return await ratelimits.run(quick=quick)


async def _web_view(quick: bool) -> list[Row]:
    """W6 with the web view open: its server is an extra (``fractor[ui]``: starlette,
    uvicorn), and without it the workload reports nothing rather than failing."""
    if importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("starlette") is None:
        print("skipped: the web view is not installed (pip install 'fractor[ui]')", end=" ")
        return []
    from . import ui

    return await ui.run(quick=quick)


async def _sweep(quick: bool) -> list[Row]:
    """The tool sweep, which ships with the web view (``fractor[ui]``): without it the
    workload reports nothing rather than failing."""
    if importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("starlette") is None:
        print("skipped: the web view is not installed (pip install 'fractor[ui]')", end=" ")
        return []
    from . import sweep

    return await sweep.run(quick=quick)


WORKLOADS: list[Workload] = [
    ("W1 fan-out", lambda quick: w1_fanout.run(quick=quick)),
    ("W2 sequential steps", lambda quick: w2_steps.run(quick=quick)),
    ("W3 subagents", lambda quick: w3_subagents.run(quick=quick)),
    ("W4 mailbox round trips", lambda quick: w4_mailbox.run(quick=quick)),
    ("Whole K=1 path", lambda quick: whole_path.run(quick=quick)),
    ("W6 with the web view open", _web_view),
    ("Scale", lambda quick: scale.run(quick=quick)),
    ("Budget", lambda quick: budget.run(quick=quick)),
    ("Memory", lambda quick: memory.run(quick=quick)),
    ("Multimodal", lambda quick: multimodal.run(quick=quick)),
    ("Tool sweep", _sweep),
    ("Provider path", _provider),
    ("Rate limits", _ratelimits),
    ("Scale-out on Ray", _scaleout),
]


async def suite(quick: bool, only: str | None = None, backend: str = "asyncio") -> list[Row]:
    """Every workload, with a progress line each; ``only`` picks workloads by prefix.

    One workload runs here; several run each in a process of its own (see above).
    """
    rows: list[Row] = []
    chosen = _chosen(only)
    for index, (name, run) in enumerate(chosen, 1):
        began = time.perf_counter()
        print(f"[{index}/{len(chosen)}] {name} ...", flush=True, end=" ")
        if len(chosen) == 1:
            rows += await run(quick)
        else:
            rows += await _in_own_process(name, quick, backend)
        print(f"{time.perf_counter() - began:.1f} s", flush=True)
    print()
    return rows


def _chosen(only: str | None) -> list[Workload]:
    """The workloads ``only`` names: the one it names in full, else every one whose
    name it starts (so "Scale" is the Scale workload, not "Scale-out on Ray" too: a
    workload in a process of its own is run by its full name)."""
    if only is None:
        return list(WORKLOADS)
    wanted = only.lower()
    exact = [w for w in WORKLOADS if w[0].lower() == wanted]
    return exact or [w for w in WORKLOADS if w[0].lower().startswith(wanted)]


async def _in_own_process(name: str, quick: bool, backend: str) -> list[Row]:
    """The rows of workload ``name``, measured by a fresh ``python -m benchmarks``."""
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "rows.json"
        command = [sys.executable, "-m", "fractor.benchmarks", "--only", name, "--backend", backend]
        command += ["--json", str(path), *(["--quick"] if quick else [])]
        done = await anyio.run_process(command, check=False)
        if not path.exists():
            output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
            raise RuntimeError(f"the benchmark {name!r} wrote no results:\n{output}")
        document = msgspec.json.decode(path.read_bytes())
        return msgspec.convert(document["rows"], list[Row])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    parser.add_argument("--only", help="run the workloads whose name starts with this")
    parser.add_argument(
        "--json", metavar="PATH", type=pathlib.Path, default=RESULTS, help="where to write results"
    )
    # The name a bad option is reported under: `fractor bench` runs the suite through here.
    parser.add_argument("--prog", default=parser.prog, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [name for name, _ in WORKLOADS]
    if args.only is not None and not _chosen(args.only):
        message = f"--only {args.only!r} matches no workload; the workloads: {', '.join(names)}"
        print(f"{args.prog}: {message}", file=sys.stderr)
        return 2
    return run_suite(backend=args.backend, quick=args.quick, only=args.only, path=args.json)


def run_suite(
    *, backend: str, quick: bool, only: str | None = None, path: pathlib.Path = RESULTS
) -> int:
    """Run the suite, print the table, write ``path``; 0 when every target holds, else 1.

    ``fractor bench`` reaches it through ``main`` (with ``--json``), in a subprocess.
    """
    rows = anyio.run(suite, quick, only, backend, backend=backend)
    print_rows(rows)
    write_results(rows, backend, path)
    print(f"\nresults written to {path}")
    return 0 if all(row.holds for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
