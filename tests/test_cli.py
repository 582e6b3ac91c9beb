"""The ``fractor`` command: the demo runs on embedded defaults."""

from __future__ import annotations

import subprocess
import sys

import pytest

from actors._cli import main


def test_demo_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workers", "3", "--jobs", "20"]) == 0
    out = capsys.readouterr().out
    assert "spawned 3 workers" in out
    assert "20/20 jobs answered" in out
    assert "failed as a value: job 13" in out
    assert f"sum of squares: {sum(n * n for n in range(20) if n != 13)}" in out
    assert "after the runtime: 0 live actors" in out


def test_demo_runs_on_trio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--backend", "trio", "--jobs", "5"]) == 0
    assert "sum of squares: 30" in capsys.readouterr().out


def test_demo_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "actors._cli", "demo", "--jobs", "4"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "4/4 jobs answered" in done.stdout
