"""The README's pictures of the web view, taken as a user would see them.

    python -m tests.actors.ui.readme_shots [--out tests/actors/ui/readme]

Runs ``fractor demo --ui`` slowed down, opens its page in the system's headless
Chromium (``tests/actors/ui/browser.py``) while the researchers work, and takes the live
tree (``live-tree.png``); then serves the demo's stored traces with ``fractor ui
--db`` and takes the timeline of the lead's execution with a step clicked
(``timeline.png``). Nothing is drawn by hand: both come from the commands a user
runs. Needs Chromium (``chromium`` on PATH, or ``FRACTOR_CHROMIUM``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

from .browser import Browser

HERE = pathlib.Path(__file__).parent
#: How long the pages may take to show what the pictures need.
PATIENCE = 60.0
_URL = re.compile(r"http://127\.0\.0\.1:\d+/\S*token=\S+")


def _url_of(process: subprocess.Popen[str]) -> str:
    """The URL a command says on stderr, once (the rest of its stderr is drained)."""
    assert process.stderr is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + PATIENCE
    said = ""
    while time.monotonic() < deadline:
        if selector.select(timeout=0.5):
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                break
            said += line
            found = _URL.search(line)
            if found:
                return found.group(0)
    raise SystemExit(f"no URL said by {process.args!r}; it said:\n{said}")


def _fractor(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fractor.actors.cli", *arguments],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def live_tree(browser: Browser, database: pathlib.Path, out: pathlib.Path) -> None:
    demo = _fractor(
        "demo", "--ui", "--plain", "--speed", "0.15", "--fanout", "4", "--db", str(database)
    )
    try:
        browser.open(_url_of(demo))
        # While the researchers work: one waits on its budget's fact-checker, some
        # stream, the lead waits for them all.
        browser.wait(
            "document.querySelectorAll('.status.running, [data-status=running]').length >= 4"
            " || (document.body.innerText.match(/running/g) || []).length >= 4",
            "four agents running",
            PATIENCE,
        )
        time.sleep(1.5)
        browser.screenshot(out / "live-tree.png")
        demo.wait(timeout=PATIENCE * 3)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def timeline(browser: Browser, database: pathlib.Path, out: pathlib.Path) -> None:
    served = _fractor("ui", "--db", str(database))
    try:
        url = _url_of(served)
        browser.open(url)
        link = browser.wait(
            "(document.querySelector('a[href*=\"/executions/\"]') || {}).href",
            "an execution listed",
            PATIENCE,
        )
        browser.open(link)
        browser.wait("!!document.querySelector('svg g.bar')", "the timeline's bars", PATIENCE)
        browser.evaluate(
            "document.querySelector('svg g.bar.step, svg g.bar')"
            ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        browser.wait(
            "document.querySelector('#details h2') && "
            "!document.getElementById('details').textContent.includes('loading')",
            "the clicked step's details",
            PATIENCE,
        )
        browser.screenshot(out / "timeline.png")
    finally:
        served.terminate()
        served.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "readme")
    args = parser.parse_args(argv)
    chromium = os.environ.get("FRACTOR_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        print("no Chromium on PATH (or FRACTOR_CHROMIUM)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = pathlib.Path(scratch)
        database = folder / "demo.db"
        browser = Browser(chromium, folder / "profile")
        try:
            live_tree(browser, database, args.out)
            timeline(browser, database, args.out)
        finally:
            browser.close()
    for name in ("live-tree.png", "timeline.png"):
        print(args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
