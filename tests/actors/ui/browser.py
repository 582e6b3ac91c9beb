"""A headless Chromium driven over the DevTools protocol, for the web view's tests.

No Playwright and no browser download: the system's ``chromium`` (Debian's package;
``.ci/run`` installs it) is started with ``--remote-debugging-pipe`` (its output in
``chromium.log`` beside the profile), which speaks the protocol as JSON messages
ending in a NUL byte, read from its file descriptor 3 and written to its 4. Calls
block; tests run them in a worker thread (``anyio.to_thread.run_sync``) so the
runtime's loop goes on meanwhile.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import pathlib
import select
import shlex
import shutil
import subprocess
import time
from typing import Any

import pytest

#: Where the screenshots go: a folder git ignores (it holds a .gitignore of ``*``).
SCREENSHOTS = pathlib.Path(__file__).parent / "screenshots"
#: How long one protocol call may take.
CALL_TIMEOUT = 30.0


def find_chromium() -> str:
    """The path of a Chromium, or the test fails (under ``CI=true``) or is skipped
    (elsewhere: a user's ``make test`` on a machine without one), saying so."""
    for name in (os.environ.get("FRACTOR_CHROMIUM", ""), "chromium", "chromium-browser"):
        found = shutil.which(name) if name else None
        if found:
            return found
    message = (
        "no Chromium on this machine (chromium or chromium-browser on PATH, or "
        "FRACTOR_CHROMIUM): the web view's browser tests did not run; install Debian's "
        "chromium package (apt-get install chromium) to run them"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def screenshot_path(name: str) -> pathlib.Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    ignore = SCREENSHOTS / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    return SCREENSHOTS / name


def _above_four(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Browser:
    """One headless Chromium and one page in it (``open``), spoken to over a pipe."""

    def __init__(self, executable: str, profile: pathlib.Path) -> None:
        commands_read, self._commands = os.pipe()
        self._answers, answers_write = os.pipe()
        # Above 4, so that the shell's redirections to 3 and 4 never overwrite one.
        commands_read, answers_write = (_above_four(fd) for fd in (commands_read, answers_write))
        flags = [
            "--headless=new",
            "--no-sandbox",  # as root, in a container
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--window-size=1280,900",
            f"--user-data-dir={profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        line = " ".join(shlex.quote(part) for part in [executable, *flags])
        log = (profile.parent / "chromium.log").open("wb")
        self._process = subprocess.Popen(
            # bash, not sh: dash takes no file descriptor above 9 in a redirection
            ["bash", "-c", f"exec {line} 3<&{commands_read} 4>&{answers_write}"],
            pass_fds=(commands_read, answers_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        os.close(commands_read)
        os.close(answers_write)
        self._ids = itertools.count(1)
        self._buffer = b""
        self.session = ""
        #: The pages opened since it was lent (``lent``): ``close`` closes them.
        self._targets: list[str] = []
        self._lent = False

    def lent(self) -> Browser:
        """This browser for one test, which opens pages of its own in it; its
        ``close`` closes those pages, not the browser (``quit`` does)."""
        self._lent = True
        self._targets.clear()
        self.session = ""
        return self

    def call(self, method: str, params: dict[str, Any] | None = None, *, page: bool = True) -> Any:
        """Send one protocol command (to the page's session unless ``page=False``) and
        return its result; events read meanwhile are dropped."""
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if page and self.session:
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + CALL_TIMEOUT
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == number:
                    if "error" in answer:
                        raise RuntimeError(f"{method}: {answer['error']}")
                    return answer.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer {method} in {CALL_TIMEOUT} s")
            ready, _, _ = select.select([self._answers], [], [], left)
            if ready:
                chunk = os.read(self._answers, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"Chromium exited (code {self._process.poll()})")
                self._buffer += chunk

    def open(self, url: str) -> None:
        """Open ``url`` in a new page and speak to that page from now on."""
        target = self.call("Target.createTarget", {"url": url}, page=False)["targetId"]
        self._targets.append(target)
        attached = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, page=False
        )
        self.session = attached["sessionId"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, what: str, seconds: float = 20.0, every: float = 0.02) -> Any:
        """The value of ``expression`` once it is truthy, read every ``every`` seconds
        (in this thread: call it from a worker thread); AssertionError after
        ``seconds``, with the last value read."""
        deadline = time.monotonic() + seconds
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the page never showed {what} in {seconds} s (last: {value!r})"
                )
            time.sleep(every)

    def screenshot(self, path: pathlib.Path) -> pathlib.Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """The pages a test opened, if it was lent one (``lent``); else the browser."""
        if self._lent:
            for target in self._targets:
                with contextlib.suppress(RuntimeError, TimeoutError, OSError):
                    self.call("Target.closeTarget", {"targetId": target}, page=False)
            self._targets.clear()
            self.session = ""
            return
        self.quit()

    def quit(self) -> None:
        """Close the browser and end its process."""
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close", page=False)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._commands)
        os.close(self._answers)
