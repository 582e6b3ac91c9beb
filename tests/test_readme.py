"""Every Python example in the README runs, and prints what it says it prints: in this
process, and as the script a reader saves it as (``python app.py``, where what it
defines lives in ``__main__``: what a Ray host must rebuild from it differs)."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
#: How long one example may take as a script (a Ray one starts and stops Ray).
SCRIPT_SECONDS = 120
#: The examples also run in this process: all but those that start Ray, which run as
#: scripts only (the way a reader runs them; a second Ray beside it would cost ~20 s).
IN_PROCESS = [index for index, source in enumerate(BLOCKS) if "RayHosts" not in source]
#: Those that start Ray take ~15 s, mostly waiting on Ray's processes: they start with
#: the session's first test (``early_readme_scripts`` in conftest.py), the rest here.
STARTING_RAY = [index for index in range(len(BLOCKS)) if index not in IN_PROCESS]


def check_promises(source: str, printed: list[str]) -> None:
    """``print(...)  # text`` promises that text; each one in a later line than the
    one before."""
    promises = re.findall(r"print\(.*\)\s+# (.+)", source)
    assert len(printed) >= len(promises), (promises, printed)
    lines = iter(printed)
    for promise in promises:
        assert any(promise.strip() in line for line in lines), (promise, printed)


@contextlib.contextmanager
def started(
    indexes: list[int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, subprocess.Popen[str]]]:
    """These examples saved as scripts and started at once, each in a fresh temporary
    folder (the package imported as installed, never from this checkout's folder);
    killed at the exit if still running."""
    env = {**os.environ, "PYTHONPATH": ""}
    with contextlib.ExitStack() as stack:
        processes = {}
        for index in indexes:
            folder = tmp_path_factory.mktemp(f"example{index}")
            (folder / "app.py").write_text(BLOCKS[index])
            process = stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-W", "error", "app.py"],  # warnings are errors
                    cwd=folder,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            stack.callback(process.kill)  # before its exit closes its pipes and waits
            processes[index] = process
        yield processes


@pytest.fixture(scope="module")
def scripts(
    tmp_path_factory: pytest.TempPathFactory,
    early_readme_scripts: dict[int, subprocess.Popen[str]],
) -> Iterator[list[subprocess.Popen[str]]]:
    """Every example run as a script: those that start Ray were started with the
    session; the others start here at once, and run beside one another and beside
    the tests in this process."""
    rest = [index for index in range(len(BLOCKS)) if index not in early_readme_scripts]
    with started(rest, tmp_path_factory) as processes:
        everyone = {**early_readme_scripts, **processes}
        yield [everyone[index] for index in range(len(BLOCKS))]


def test_readme_has_examples() -> None:
    assert BLOCKS


@pytest.mark.usefixtures("scripts")  # started first: they run while these tests do
@pytest.mark.parametrize("index", IN_PROCESS)
def test_readme_example_runs(index: int) -> None:
    source = BLOCKS[index]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, f"README.md example {index}", "exec"), {"__name__": "readme"})
    check_promises(source, out.getvalue().splitlines())


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_as_a_script(index: int, scripts: list[subprocess.Popen[str]]) -> None:
    process = scripts[index]
    try:
        out, err = process.communicate(timeout=SCRIPT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"`python app.py` of example {index} did not end in {SCRIPT_SECONDS} s:\n{err}")
    assert process.returncode == 0, err
    # Nothing failed on the side (an error only in a log, an exception ignored).
    assert "Traceback" not in err, err
    assert "Exception ignored" not in err, err
    check_promises(BLOCKS[index], out.splitlines())


#: A path of the repository the README names, in backquotes or as a picture's link.
_PATH = re.compile(r"(?:`|\]\()((?:actors|benchmarks|runtime|tests)/[^`)\s]*)")


def test_every_path_the_readme_names_is_in_the_repository() -> None:
    """A file or folder the README points a reader to is one a clone has, unless the
    README says, just before it, that a run writes it there (a benchmark's results,
    the browser tests' screenshots: files git ignores)."""
    root = README.parent
    listed = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    tracked = set(listed.stdout.splitlines())
    folders = {f"{folder}/" for path in tracked for folder in pathlib.PurePosixPath(path).parents}
    text = README.read_text()
    missing = []
    for found in _PATH.finditer(text):
        path = found[1]
        if path in tracked or path.rstrip("/") + "/" in folders:
            continue
        said = text[max(0, found.start() - 120) : found.start()]
        if not re.search(r"\b(writes|written|leaves)\b", said):
            missing.append(path)
    assert missing == [], f"the README names paths a clone does not have: {missing}"
