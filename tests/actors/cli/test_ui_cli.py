"""``fractor ui --db FILE`` and ``fractor bench --tool M:F --sweep ... --ui``: served on
127.0.0.1 with the token of the URL said once on stderr, until Ctrl-C (SIGINT), which
stops them cleanly; bad input exits 2 before anything is served."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import IO, Any

import anyio
import pytest

from fractor.actors import Agent, ScriptedModel, reply
from fractor.actors.cli import main
from fractor.runtime import Runtime, SQLiteStore

TOOLS = "tests.actors.cli.sweep_tools"
URL = re.compile(r"fractor web view: (http://127\.0\.0\.1:\d+/\?token=\S+)")


def start(*argv: str) -> tuple[subprocess.Popen[bytes], str]:
    """``fractor ARGV`` in a subprocess, and the URL it said on stderr."""
    served = subprocess.Popen(
        [sys.executable, "-m", "fractor.actors.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert served.stderr is not None
    line = served.stderr.readline().decode()
    found = URL.search(line)
    if found is None:
        served.kill()
        raise AssertionError(f"no URL on stderr: {line!r} {served.communicate()[1]!r}")
    return served, found[1]


def fetch(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, None


def stop(served: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """Ctrl-C, as a terminal sends it; what it wrote after."""
    served.send_signal(signal.SIGINT)
    out, err = served.communicate(timeout=20)
    return out, err


def read(stream: IO[bytes] | None) -> str:
    assert stream is not None
    return stream.readline().decode()


async def test_fractor_ui_serves_a_store_until_ctrl_c(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "runs.db"
    async with SQLiteStore(db) as store, Runtime(store=store) as rt:
        result = await (await rt.spawn(Agent("solo", ScriptedModel([reply("hi")])))).ask("go")
    served, url = await anyio.to_thread.run_sync(start, "ui", "--db", str(db))
    try:
        api = url.replace("/?token=", "/api/executions?token=")
        status, listing = await anyio.to_thread.run_sync(fetch, api)
        assert status == 200
        assert [e["execution_id"] for e in listing["executions"]] == [result.execution_id]
        refused, _ = await anyio.to_thread.run_sync(fetch, api.split("?")[0])
        assert refused == 403
    finally:
        _, err = await anyio.to_thread.run_sync(stop, served)
    assert served.returncode == 0, err
    assert err.decode().count("token=") == 0  # said once, before (read by start)
    assert b"stopped" in err


def test_fractor_ui_refuses_a_missing_or_bad_store(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.db"
    assert main(["ui", "--db", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fractor ui: no store at")
    assert str(missing) in err
    assert "token=" not in err
    assert not missing.exists()
    text = tmp_path / "notes.db"
    text.write_text("not a database, " * 100)
    assert main(["ui", "--db", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fractor ui: cannot serve {str(text)!r}")
    assert main(["ui", "--db", str(text), "--port", "70000"]) == 2
    assert "port must be" in capsys.readouterr().err


def test_a_sweep_with_ui_serves_its_chart_as_it_grows(tmp_path: pathlib.Path) -> None:
    saved = tmp_path / "sweep.json"
    argv = ["bench", "--tool", f"{TOOLS}:nap", "--sweep", "1,2,4", "--calls", "8"]
    served, url = start(*argv, "--ui", "--json", str(saved))
    try:
        api = url.replace("/?token=", "/api/sweep?token=")
        deadline = time.monotonic() + 30
        while True:
            status, state = fetch(api)
            assert status == 200
            if state["view"]["finished"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # another process measures: its page is read, not awaited
        view = state["view"]
        assert [level["concurrency"] for level in view["measured"]] == [1, 2, 4]
        assert view["svg"].count('class="throughput"') == 1
        assert read(served.stderr).startswith("wrote the levels to")
        assert read(served.stderr) == "the chart stays served until Ctrl-C\n"
        assert fetch(api.split("?")[0])[0] == 403
    finally:
        out, err = stop(served)
    assert served.returncode == 0, err
    assert "tool nap: 8 calls per level" in out.decode()
    document = json.loads(saved.read_text())
    assert [level["concurrency"] for level in document["levels"]] == [1, 2, 4]
    assert document["tool"] == "nap"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tool", f"{TOOLS}:nap", "--ui"], "--ui only applies with --sweep"),
        (["--tool", f"{TOOLS}:nap", "--ui", "--svg", "x.svg"], "--svg and --ui only apply"),
        (["--ui"], "--ui only apply with --tool"),
        (["--tool", f"{TOOLS}:nap", "--sweep", "1", "--json", "/no/such/dir/x.json"], "--json"),
    ],
)
def test_ui_and_json_of_a_sweep_refuse_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("fractor bench: ")
    assert message in err
