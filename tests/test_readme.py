"""Every Python example in the README runs, and prints what it says it prints."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int) -> None:
    source = BLOCKS[index]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, f"README.md example {index}", "exec"), {"__name__": "readme"})
    printed = out.getvalue().splitlines()
    # "print(...)  # text" promises that text; check each promise in order.
    promises = re.findall(r"print\(.*\)\s+# (.+)", source)
    assert len(printed) >= len(promises)
    lines = iter(printed)  # each promise in a later line than the one before
    for promise in promises:
        assert any(promise.strip() in line for line in lines), (promise, printed)
