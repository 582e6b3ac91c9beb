"""A user's ``MODULE:NAME``, imported the one way every command does (``_imports.py``).

``fractor run --tool``, ``fractor bench --tool`` and ``fractor mcp-serve`` import the
user's module with the current directory importable (as ``python -m`` does), and
refuse a spec that names nothing with exit status 2 and one line saying what is
wrong. The import from the current directory is checked through the console script
(whose own ``sys.path`` starts at the script's folder, not the current directory);
the messages in process, from a temporary working directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fractor.actors.cli import main

from ..loopback import LoopbackServer, json_reply
from ..providers.wires import completion, wire_call

#: The console script of this environment, run as a user runs ``fractor``.
FRACTOR = str(Path(sys.executable).parent / "fractor")

#: The user's modules, written to the working directory of each test.
MODULES = {
    "mine": '''
from fractor.actors import Agent, ScriptedModel, reply

LIMIT = 3


def count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


helper = Agent(name="helper", model=ScriptedModel([reply("hi")]))
''',
    "broken": "1 / 0\n",
    "needs_dep": "import not_installed_anywhere_xyz\n",
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` as the working directory, holding ``MODULES``; what importing them
    adds to ``sys.path`` and ``sys.modules`` is taken back after the test."""
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name, None)


def fractor(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FRACTOR, *argv], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


# -- the current directory is importable, for each command ---------------------------------


def test_run_uses_a_tool_from_the_current_directory(workdir: Path, server: LoopbackServer) -> None:
    server.queue(
        json_reply(completion(None, (wire_call("c1", "count", '{"text": "a b c"}'),))),
        json_reply(completion("Three words.")),
    )
    url = f"{server.url}/v1"
    done = fractor(
        "run",
        "--model",
        "openai:test",
        "--base-url",
        url,
        "--tool",
        "mine:count",
        "go",
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr
    assert "Three words." in done.stdout
    first, second = (request.json() for request in server.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["count"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "3"}


def test_bench_measures_a_tool_from_the_current_directory(workdir: Path) -> None:
    argv = ("--args", '{"text": "a b"}', "--fanout", "2", "--calls", "4", "--json", "out.json")
    done = fractor("bench", "--tool", "mine:count", *argv, cwd=workdir)
    assert done.returncode == 0, done.stderr
    report = json.loads((workdir / "out.json").read_text())
    assert (report["tool"], report["calls"], report["errors"]) == ("count", 4, 0)


def test_mcp_serve_serves_an_agent_from_the_current_directory(workdir: Path) -> None:
    # Its stdin closed at once: the server starts, finds no client, and stops cleanly.
    done = fractor("mcp-serve", "mine:helper", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "serving agent 'helper' over stdio" in done.stderr


# -- a spec that names nothing: exit 2, one line, the same words for every command ---------

COMMANDS = {
    "run": (
        ["run", "--model", "openai:test", "--base-url", "http://127.0.0.1:9/v1", "--tool"],
        "--tool ",
    ),
    "bench": (["bench", "--tool"], "--tool "),
    "mcp-serve": (["mcp-serve"], ""),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            "nowhere:count",
            "cannot import module 'nowhere': no module named 'nowhere' in the current "
            "directory ({cwd}) nor among the installed packages",
        ),
        ("mine:nope", "module 'mine' has no attribute 'nope'; {listing}"),
        ("broken:count", "importing module 'broken' raised ZeroDivisionError: division by zero"),
        (
            "needs_dep:count",
            "importing module 'needs_dep' failed: No module named 'not_installed_anywhere_xyz'",
        ),
    ],
)
def test_a_spec_that_names_nothing_exits_2_saying_what_is_wrong(
    command: str, spec: str, problem: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, label = COMMANDS[command]
    listing = "its agents: helper" if command == "mcp-serve" else "its functions: count"
    assert main([*argv, spec, *(["go"] if command == "run" else [])]) == 2
    out, err = capsys.readouterr()
    said = problem.format(cwd=workdir, listing=listing)
    assert err == f"fractor {command}: {label}{spec!r}: {said}\n"
    assert out == ""  # nothing started


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_spec_without_a_colon_exits_2(
    command: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, label = COMMANDS[command]
    assert main([*argv, "mine", *(["go"] if command == "run" else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fractor {command}: {label}'mine': expected MODULE:"), err


def test_run_refuses_a_tool_that_is_not_a_function(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, _ = COMMANDS["run"]
    assert main([*argv, "mine:LIMIT", "go"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fractor run: --tool 'mine:LIMIT': cannot make a tool of 3 (int)"), err
