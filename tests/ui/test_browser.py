"""The web view in a real browser: headless Chromium over the DevTools protocol.

Without a Chromium on the machine these tests fail saying so under ``CI=true`` and
are skipped with that reason elsewhere (``browser.find_chromium``). Screenshots are
written to ``tests/ui/screenshots/`` (ignored by git), one per backend:
``live-tree-<backend>-waiting.png`` (an approval pending, the budget bars) and
``live-tree-<backend>-done.png`` (after it was approved in the page).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import pytest

from fractor import Agent, Budget, Runtime, ScriptedModel, call, reply, tool
from fractor.actors.ui import serve_ui

from .browser import Browser, find_chromium, screenshot_path

T = TypeVar("T")
RAN: list[str] = []


@tool(approval=True)
async def send_email(to: str) -> str:
    """Send an email."""
    RAN.append(to)
    return f"sent to {to}"


@pytest.fixture(autouse=True)
def clean() -> None:
    RAN.clear()


async def until(check: Callable[[], T], what: str, seconds: float = 20.0) -> T:
    """Poll the page (in a worker thread) until ``check()`` is truthy."""
    value: T | None = None
    with anyio.move_on_after(seconds):
        while not (value := await anyio.to_thread.run_sync(check)):  # noqa: ASYNC110
            await anyio.sleep(0.05)  # a page's state is read, not awaited
        return value
    raise AssertionError(f"the page never showed {what} in {seconds} s (last: {value!r})")


async def test_the_page_shows_the_tree_live_and_decides_an_approval(
    anyio_backend: str, tmp_path: pathlib.Path
) -> None:
    chromium = find_chromium()
    model = ScriptedModel([call("send_email", to="ana@example.org"), reply("Sent.")])
    agent = Agent("mailer", model, tools=[send_email])
    async with (
        Runtime(budget=Budget(tokens=50_000, tool_calls=5)) as rt,
        serve_ui(rt, interval=0.1, announce=lambda url: None) as ui,
    ):
        ref = await rt.spawn(agent)
        browser = await anyio.to_thread.run_sync(Browser, chromium, tmp_path / "profile")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(ref.ask, "mail Ana")
                await anyio.wait_all_tasks_blocked()
                (request,) = ref.approvals()
                node = next(n for n in rt.tree().nodes if n.name == "mailer")
                await anyio.to_thread.run_sync(browser.open, ui.url)

                def status() -> Any:
                    return browser.evaluate(
                        f"document.querySelector('li.node[data-id={json.dumps(node.id)}]"
                        " > .row .status')?.textContent"
                    )

                assert await until(status, "the mailer's status") == "running"
                shown = await until(
                    lambda: browser.evaluate(
                        f"document.querySelector('.approval[data-id={json.dumps(request.id)}]"
                        " .arguments')?.textContent"
                    ),
                    "the pending approval",
                )
                assert json.loads(shown) == {"to": "ana@example.org"}
                root = rt.tree().node(node.parent_id or "")
                spent = root.usage.input_tokens + root.usage.output_tokens
                numbers = await until(
                    lambda: browser.evaluate(
                        f"[...document.querySelectorAll('li.node[data-id={json.dumps(node.id)}]"
                        " > .bars .numbers')].map(e => e.textContent)"
                    ),
                    "the mailer's budget bars",
                )
                assert f"spent {spent} · reserved 0 · left {50_000 - spent} of 50000" in numbers
                assert "spent 0 · reserved 0 · left 5 of 5" in numbers  # tool_calls
                await anyio.to_thread.run_sync(
                    browser.screenshot, screenshot_path(f"live-tree-{anyio_backend}-waiting.png")
                )
                assert RAN == []
                await anyio.to_thread.run_sync(
                    browser.evaluate,
                    f"document.querySelector('.approval[data-id={json.dumps(request.id)}]"
                    " button.approve').click()",
                )
                # The same page, not reloaded: its status text changes as the tree does.
                assert await until(lambda: status() == "completed", "completed")
            assert RAN == ["ana@example.org"]
            (trace,) = await ref.trace()
            assert trace.steps[0].outcomes[0].approval == "approved"
            gone = await anyio.to_thread.run_sync(
                browser.evaluate, "document.querySelectorAll('.approval').length"
            )
            assert gone == 0
            path = await anyio.to_thread.run_sync(
                browser.screenshot, screenshot_path(f"live-tree-{anyio_backend}-done.png")
            )
            assert path.stat().st_size > 1_000
        finally:
            await anyio.to_thread.run_sync(browser.close)


async def test_the_page_without_the_token_is_refused_in_the_browser(
    tmp_path: pathlib.Path,
) -> None:
    chromium = find_chromium()
    async with Runtime() as rt, serve_ui(rt, announce=lambda url: None) as ui:
        browser = await anyio.to_thread.run_sync(Browser, chromium, tmp_path / "profile")
        try:
            await anyio.to_thread.run_sync(browser.open, ui.url.split("?")[0])
            text = await until(
                lambda: browser.evaluate("document.body && document.body.innerText"),
                "the refusal",
            )
            assert text.startswith("403")
            assert "/api/tree" not in await anyio.to_thread.run_sync(
                browser.evaluate, "document.documentElement.outerHTML"
            )
        finally:
            await anyio.to_thread.run_sync(browser.close)
