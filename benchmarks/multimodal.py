"""Multimodal (issue 30): a 5 MB image from a lead to 100 subagents.

A lead is asked a task that carries one image (a 5 MB PNG, ``IMAGE_BYTES``); in its
one step it calls 100 subagents (``SUBAGENTS``, ``tool_concurrency=100``, all at
once), each task naming the image by its ``sha256:`` prefix, so each worker's
request carries it; fake models, zero latency. The run saves everything to a
``SQLiteStore`` on a temporary file: the lead's conversation and the traces of all
101 executions.

The baseline is a hand-written anyio loop: the same bytes object passed to 100 tasks
of one task group, each of which reads its length after a checkpoint.

The two sides run each in a fresh process of their own (this module run as a
script: ``python -m fractor.benchmarks.multimodal --side fractor``), the same program
with the same imports, so that what differs is the work. Each builds the image's
bytes first (both the same way), then resets its high-water mark of resident memory
(``/proc/self/clear_refs``), does its work and reports its peak resident memory
(``VmHWM`` of ``/proc/self/status``: the whole process, imports and the image
included; where ``/proc`` is missing, ``resource.getrusage``'s ``ru_maxrss``, which
also counts the image's building). Rows:

- peak RSS, fractor against the raw loop: the target is ``<= 1.2 x raw + 10 MiB``
  (the image is not copied per subagent: 100 copies would be 500 MB); and, reported,
  each side's peak above its resident memory at rest (after its imports and the
  image's bytes): what the work itself took;
- the SQLite file's size after the run (its WAL checkpointed on close) against one
  copy of the image plus the text stored (the JSON of the states and records, as the
  store holds them): the target is ``<= 1.1 x`` that.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import resource
import sqlite3
import struct
import sys
import tempfile
import zlib

import anyio
import anyio.lowlevel

from fractor.actors import (
    Agent,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    call,
    calls,
    reply,
)
from fractor.runtime import Runtime, SQLiteStore

from ._harness import Row, single

__all__ = ["IMAGE_BYTES", "RSS_SLACK_MIB", "SUBAGENTS", "png", "run"]

IMAGE_BYTES = 5_000_000
SUBAGENTS = 100
#: Peak RSS target: at most this times the raw loop's, plus ``RSS_SLACK_MIB``.
RSS_RATIO = 1.2
RSS_SLACK_MIB = 10.0
#: SQLite target: the file at most this times one copy of the image plus the text.
SQLITE_RATIO = 1.1
MIB = 1024 * 1024


def png(size: int, *, width: int = 2048, height: int = 1536, seed: int = 0) -> bytes:
    """A PNG of ``size`` bytes in all: its signature, a real IHDR (``width`` x
    ``height``), noise in an ancillary chunk (incompressible, as a photo is), IEND."""
    signature = b"\x89PNG\r\n\x1a\n"

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    head = signature + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    end = chunk(b"IEND", b"")
    body = random.Random(seed).randbytes(max(0, size - len(head) - 12 - len(end)))
    crc = zlib.crc32(body, zlib.crc32(b"noIs")) & 0xFFFFFFFF
    noise = (struct.pack(">I", len(body)), b"noIs", body, struct.pack(">I", crc))
    return b"".join((head, *noise, end))


def _reset_peak() -> None:
    """Start this process's high-water mark of resident memory from now (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass  # ru_maxrss then counts from the process's start


def _status_mib(field: str) -> float | None:
    """A memory figure of ``/proc/self/status`` in MiB (None without ``/proc``)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _peak_mib() -> float:
    """This process's peak resident memory since ``_reset_peak``, in MiB."""
    peak = _status_mib("VmHWM:")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 1024 if sys.platform != "darwin" else maxrss / MIB


def _look(request: ModelRequest) -> ModelResponse:
    return ModelResponse(text="a part of the image, described")


async def fractor_side(data: bytes, subagents: int, db: pathlib.Path) -> dict[str, float]:
    """The lead and its subagents on the image ``data``, saved to a SQLite file at ``db``."""
    size = len(data)
    image = Image(data=data)
    tag = f"sha256:{image.sha256[:12]}"
    worker = Agent("worker", FunctionModel(_look, record=0), description="Describes an image.")
    script = [
        calls(*(call("worker", task=f"Describe part {i} of {tag}.") for i in range(subagents))),
        reply("All described."),
    ]
    lead = Agent(
        "lead", ScriptedModel(script, record=0), subagents=[worker], tool_concurrency=subagents
    )
    async with SQLiteStore(db) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(lead, id="lead")
        result = await ref.ask(["Describe this image, a part per subagent.", image])
        if not result.ok:
            raise RuntimeError(f"multimodal: the lead ended {result.status}: {result.stop_reason}")
        records = await store.records(limit=None)
    if len(records) != subagents + 1:
        raise RuntimeError(f"multimodal: {len(records)} traces stored, not {subagents + 1}")
    files = [p for p in db.parent.iterdir() if p.name.startswith(db.name)]
    with sqlite3.connect(db) as connection:
        (states,) = connection.execute(
            "SELECT coalesce(sum(length(actor_id) + length(state)), 0) FROM states"
        ).fetchone()
        (traces,) = connection.execute(
            "SELECT coalesce(sum(length(id) + length(actor_id) + length(kind)"
            " + length(parent_id) + length(data)), 0) FROM records"
        ).fetchone()
        (blobs, blob_bytes) = connection.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM blobs"
        ).fetchone()
    connection.close()
    return {
        "peak_mib": _peak_mib(),
        "file_bytes": float(sum(p.stat().st_size for p in files)),
        "text_bytes": float(states + traces),
        "image_bytes": float(size),
        "blobs": float(blobs),
        "blob_bytes": float(blob_bytes),
    }


async def raw_side(data: bytes, subagents: int) -> dict[str, float]:
    """The raw loop: one bytes object, passed to ``subagents`` tasks."""
    size = len(data)
    seen: list[int] = []

    async def worker(part: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        seen.append(len(part))

    async with anyio.create_task_group() as tg:
        for _ in range(subagents):
            tg.start_soon(worker, data)
    if seen != [size] * subagents:
        raise RuntimeError("multimodal: the raw loop's tasks did not all see the image")
    return {"peak_mib": _peak_mib()}


async def _side(side: str, subagents: int, size: int, backend: str) -> dict[str, float]:
    """One side, in a fresh process: its figures, read from its one line of JSON."""
    command = [sys.executable, "-m", "fractor.benchmarks.multimodal", "--side", side]
    command += ["--subagents", str(subagents), "--image-bytes", str(size), "--backend", backend]
    done = await anyio.run_process(command, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
        raise RuntimeError(f"multimodal: the {side} side failed:\n{output}")
    figures: dict[str, float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return figures


async def run(
    *,
    quick: bool = False,
    subagents: int = SUBAGENTS,
    size: int = IMAGE_BYTES,
    backend: str = "asyncio",
) -> list[Row]:
    """The two rows, each side measured once in its own process (``quick`` changes
    nothing: the run takes a few seconds)."""
    ours = await _side("fractor", subagents, size, backend)
    raw = await _side("raw", subagents, size, backend)
    return rows(ours, raw, subagents, size)


def rows(ours: dict[str, float], raw: dict[str, float], subagents: int, size: int) -> list[Row]:
    """The rows from both sides' figures."""
    mb = f"{size / 1_000_000:g} MB"
    peak, base = ours["peak_mib"], raw["peak_mib"]
    limit = RSS_RATIO * base + RSS_SLACK_MIB
    once = (ours["image_bytes"] + ours["text_bytes"]) / MIB
    grown, raw_grown = peak - ours.get("rest_mib", 0.0), base - raw.get("rest_mib", 0.0)
    stored = ours["file_bytes"] / MIB
    return [
        single(
            f"Multimodal: a {mb} image from a lead to {subagents} subagents, peak RSS",
            "MiB",
            peak,
            base,
            ratio=base / peak,
            target=f"<= {RSS_RATIO:g} x raw + {RSS_SLACK_MIB:g} MiB ({limit:,.1f} MiB)",
            holds=peak <= limit,
        ),
        single(
            "  peak RSS above the process at rest",
            "MiB",
            grown,
            raw_grown,
            ratio=raw_grown / grown if grown > 0 else 1.0,
            target="reported (at rest: imports and the image)",
            holds=True,
        ),
        single(
            "  SQLite file, every turn and trace of that run stored",
            "MiB",
            stored,
            once,
            ratio=once / stored,
            target=f"<= {SQLITE_RATIO:g} x one image + text ({SQLITE_RATIO * once:,.2f} MiB)",
            holds=stored <= SQLITE_RATIO * once and ours["blobs"] == 1,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fractor.benchmarks.multimodal")
    parser.add_argument("--side", choices=("fractor", "raw"), required=True)
    parser.add_argument("--subagents", type=int, default=SUBAGENTS)
    parser.add_argument("--image-bytes", type=int, default=IMAGE_BYTES)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args(argv)
    data = png(args.image_bytes)
    _reset_peak()
    rest = _status_mib("VmRSS:") or 0.0
    if args.side == "fractor":
        with tempfile.TemporaryDirectory() as folder:
            db = pathlib.Path(folder) / "multimodal.db"
            figures = anyio.run(fractor_side, data, args.subagents, db, backend=args.backend)
    else:
        figures = anyio.run(raw_side, data, args.subagents, backend=args.backend)
    print(json.dumps({**figures, "rest_mib": rest}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
