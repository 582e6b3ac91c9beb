"""Run every benchmark: ``python -m benchmarks [--backend trio] [--quick]``."""

from __future__ import annotations

import argparse
import sys
import time

import anyio

from . import w4_mailbox
from ._harness import RESULTS, Row, print_rows, write_results


async def _suite(quick: bool) -> list[Row]:
    rows: list[Row] = []
    scale = 10 if quick else 1
    started = time.perf_counter()
    print("[1/1] W4 mailbox round trips ...", flush=True)
    rows += await w4_mailbox.run(round_trips=20_000 // scale, repeats=3 if quick else 5)
    print(f"done in {time.perf_counter() - started:.1f} s\n", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    args = parser.parse_args()
    rows = anyio.run(_suite, args.quick, backend=args.backend)
    print_rows(rows)
    write_results(rows, args.backend)
    print(f"\nresults written to {RESULTS}")
    return 0 if all(row.holds for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
