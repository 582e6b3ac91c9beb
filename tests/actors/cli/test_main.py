"""``fractor`` itself (``actors/cli/__init__.py``): what it answers before any command."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

#: The console script of this environment, and the module form of the same command.
COMMANDS = {
    "console script": [str(Path(sys.executable).parent / "fractor")],
    "python -m": [sys.executable, "-m", "fractor.actors.cli"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_version_prints_the_installed_distributions_version(command: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [*COMMANDS[command], "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"fractor {importlib.metadata.version('fractor')}\n"
    assert done.stderr == ""
