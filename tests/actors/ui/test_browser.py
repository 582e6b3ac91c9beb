"""The web view in a real browser: headless Chromium over the DevTools protocol.

Without a Chromium on the machine these tests fail saying so under ``CI=true`` and
are skipped with that reason elsewhere (``browser.find_chromium``). Screenshots are
written to ``tests/actors/ui/screenshots/`` (ignored by git): ``live-tree-<backend>-waiting.png``
(an approval pending, the budget bars) and ``live-tree-<backend>-done.png`` (after it
was approved in the page), ``timeline.png`` (a stored execution's timeline, a step
clicked) and ``sweep.png`` (a sweep's chart with its knee). The demo's own page
(``fractor demo --ui``) is opened from the URL it says.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import pytest
from rich.console import Console

from fractor import Agent, Budget, Runtime, ScriptedModel, call, reply, tool
from fractor.actors import calls, collect_trace_tree
from fractor.actors._observation._traces import usage_text
from fractor.actors.cli._scenario import DemoOptions, run_demo
from fractor.actors.ui import serve_stored, serve_sweep, serve_ui
from fractor.actors.ui.charts import SweepLevel, SweepReport, find_knee
from fractor.runtime import SQLiteStore

from ..sample_tools import RAN, send_email
from .browser import Browser, screenshot_path

T = TypeVar("T")


async def until(check: Callable[[], T], what: str, seconds: float = 20.0) -> T:
    """Poll the page (in a worker thread) until ``check()`` is truthy."""
    value: T | None = None
    with anyio.move_on_after(seconds):
        while not (value := await anyio.to_thread.run_sync(check)):  # noqa: ASYNC110
            await anyio.sleep(0.05)  # a page's state is read, not awaited
        return value
    raise AssertionError(f"the page never showed {what} in {seconds} s (last: {value!r})")


#: The characters of the page's text that no font on the machine has, each with the
#: font it is set in: drawn on a canvas in that font, such a character gives the very
#: pixels of U+E000 (private use: no font has it), the box of a missing glyph.
MISSING_GLYPHS = r"""(() => {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 48;
  const context = canvas.getContext("2d", { willReadFrequently: true });
  const drawn = (text, font) => {
    context.clearRect(0, 0, 48, 48);
    context.font = font;
    context.fillText(text, 4, 36);
    return context.getImageData(0, 0, 48, 48).data.join(",");
  };
  const missing = new Map();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const style = getComputedStyle(node.parentElement);
    const font = `${style.fontStyle} ${style.fontWeight} 32px ${style.fontFamily}`;
    const box = drawn("\uE000", font);
    for (const character of new Set(node.textContent)) {
      if (character.trim() && drawn(character, font) === box) {
        missing.set(`${character} U+${character.codePointAt(0).toString(16).toUpperCase()}`, font);
      }
    }
  }
  return [...missing];
})()"""


async def test_the_page_shows_the_tree_live_and_decides_an_approval(
    anyio_backend: str, tmp_path: pathlib.Path, chromium: Browser
) -> None:
    model = ScriptedModel([call("send_email", to="ana@example.org"), reply("Sent.")])
    agent = Agent("mailer", model, tools=[send_email])
    async with (
        Runtime(budget=Budget(tokens=50_000, tool_calls=5)) as rt,
        serve_ui(rt, interval=0.1, announce=lambda url: None) as ui,
    ):
        ref = await rt.spawn(agent)
        browser = chromium.lent()
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
                line = await until(
                    lambda: browser.evaluate(
                        f"document.querySelector('li.node[data-id={json.dumps(node.id)}]"
                        " > .line')?.textContent"
                    ),
                    "the mailer's line",
                )
                assert "waiting for approval: send_email" in line
                # Every character drawn with a glyph of a font the machine has (⧗,
                # U+29D7, was a box in Debian's Chromium: no font of it has one).
                assert await anyio.to_thread.run_sync(browser.evaluate, MISSING_GLYPHS) == []
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


async def test_the_page_decides_an_approval_of_a_subagent_on_another_host(
    tmp_path: pathlib.Path, chromium: Browser
) -> None:
    # Its id names the host (``default-0/approval-1``): the page's own request, its
    # Approve button, reaches the route with it whole.
    from fractor.actors import FunctionModel, LocalHosts, ModelRequest, ToolResultMessage
    from fractor.actors._models._turns import Turn

    def mailer_turns(request: ModelRequest) -> Turn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return reply(request.messages[-1].content)
        return call("send_email", to="ana@example.org")

    mailer = Agent("mailer", FunctionModel(mailer_turns), tools=[send_email])
    lead = Agent(
        "lead", ScriptedModel([call("mailer", task="mail"), reply("ok")]), subagents=[mailer]
    )
    async with (
        Runtime(hosts=LocalHosts(1)) as rt,
        serve_ui(rt, interval=0.1, announce=lambda url: None) as ui,
    ):
        ref = await rt.spawn(lead)
        browser = chromium.lent()
        try:
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    assert (await ref.ask("go")).text == "ok"

                tg.start_soon(ask)
                await anyio.to_thread.run_sync(browser.open, ui.url)
                shown = await until(
                    lambda: browser.evaluate(
                        "[...document.querySelectorAll('.approval')].map(e => e.dataset.id)"
                    ),
                    "the host's pending approval",
                )
                (request,) = ref.approvals()
                assert shown == [request.id]
                assert request.id.startswith("default-0/")
                await anyio.to_thread.run_sync(
                    browser.evaluate,
                    f"document.querySelector('.approval[data-id={json.dumps(request.id)}]"
                    " button.approve').click()",
                )
                with anyio.fail_after(20):
                    while not RAN:  # noqa: ASYNC110
                        await anyio.sleep(0.02)  # the decision crosses to the host
            assert RAN == ["ana@example.org"]
        finally:
            await anyio.to_thread.run_sync(browser.close)


async def test_the_page_loads_the_demo_s_tree_as_it_runs(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], chromium: Browser
) -> None:
    # ``fractor demo --ui``, run as the command runs it: its page, opened from the URL
    # it says on stderr, shows the demo's lead and researchers while they work.
    agents = "[...document.querySelectorAll('li.node .agent')].map(e => e.textContent)"
    said: list[str] = []
    found: list[list[str]] = []
    browser = chromium.lent()
    try:

        async def look() -> None:
            while not said:
                await anyio.sleep(0.02)
                said.extend(
                    re.findall(r"http://127\.0\.0\.1:\d+/\?token=\S+", capsys.readouterr().err)
                )
            await anyio.to_thread.run_sync(browser.open, said[0])
            shown = await until(
                lambda: (
                    (names := browser.evaluate(agents))
                    and sum(name.startswith("researcher-") for name in names) >= 3
                    and names
                ),
                "the demo's researchers",
            )
            found.append(shown)

        async with anyio.create_task_group() as group:
            group.start_soon(look)
            run = await run_demo(
                DemoOptions(speed=1.5, db=None), console=Console(file=io.StringIO()), ui=True
            )
            group.cancel_scope.cancel()  # (found, or not: the asserts say)
    finally:
        await anyio.to_thread.run_sync(browser.close)
    assert run.result.status == "completed"
    assert len(said) == 1
    (shown,) = found
    assert "lead" in shown
    assert len(run.researchers) == 3
    assert set(run.researchers) <= set(shown)


async def test_the_page_without_the_token_is_refused_in_the_browser(
    tmp_path: pathlib.Path, chromium: Browser
) -> None:
    async with Runtime() as rt, serve_ui(rt, announce=lambda url: None) as ui:
        browser = chromium.lent()
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


@tool
async def slow(x: int) -> str:
    """Answer ``x`` after 50 ms."""
    await anyio.sleep(0.05)
    return f"slow {x}"


#: The box of each tool call's bar in the page: left, right, top (CSS pixels).
BOXES = (
    "[...document.querySelectorAll('g.bar.tool > rect')].map(r => {"
    " const b = r.getBoundingClientRect(); return [b.left, b.right, b.top]; })"
)


def click(selector: str) -> str:
    """JavaScript clicking the first element of ``selector`` (an SVG one too: it has
    no ``click()``), as a user's click does: an event that bubbles."""
    return (
        f"document.querySelector({json.dumps(selector)})"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
    )


async def test_a_stored_timeline_shows_parallel_calls_and_a_step_s_usage_on_click(
    tmp_path: pathlib.Path, chromium: Browser
) -> None:
    db = tmp_path / "runs.db"
    model = ScriptedModel([calls(call("slow", x=1), call("slow", x=2)), reply("done")])
    async with SQLiteStore(db) as store, Runtime(store=store) as rt:
        result = await (await rt.spawn(Agent("lead", model, tools=[slow]))).ask("go")
        (trace,) = await collect_trace_tree(store, result.execution_id)
    async with serve_stored(db, announce=lambda url: None) as ui:
        browser = chromium.lent()
        try:
            await anyio.to_thread.run_sync(browser.open, ui.url)
            link = await until(
                lambda: browser.evaluate("document.querySelector('tr.execution a')?.textContent"),
                "the stored execution in the list",
            )
            assert link == f"lead [{trace.execution_id}]"
            await anyio.to_thread.run_sync(
                browser.evaluate, "document.querySelector('tr.execution a').click()"
            )

            def tool_boxes() -> Any:
                found = browser.evaluate(BOXES)
                return found if len(found) == 2 else None

            boxes = await until(tool_boxes, "two tool calls on the timeline")
            (left_a, right_a, top_a), (left_b, right_b, top_b) = boxes
            # They ran at once: side by side, their spans overlapping.
            assert left_a < right_b
            assert left_b < right_a
            assert top_a != top_b  # on lanes of their own
            step = trace.steps[0]
            await anyio.to_thread.run_sync(browser.evaluate, click("g.bar.step"))

            def usage() -> Any:
                shown = browser.evaluate("document.querySelector('#details .usage')?.textContent")
                if not shown:  # the details were still on their way: click again
                    browser.evaluate(click("g.bar.step"))
                return shown

            assert await until(usage, "the step's usage") == usage_text(step.usage)
            asked = await anyio.to_thread.run_sync(
                browser.evaluate,
                "[...document.querySelectorAll('#details .call .asked')].map(e => e.textContent)",
            )
            assert asked == ['slow({"x":1})', 'slow({"x":2})']
            assert await anyio.to_thread.run_sync(browser.evaluate, MISSING_GLYPHS) == []
            path = await anyio.to_thread.run_sync(
                browser.screenshot, screenshot_path("timeline.png")
            )
            assert path.stat().st_size > 1_000
            quoted = trace.execution_id.replace("#", "%23")
            for route in ["/", "/api/executions", f"/executions/{quoted}"]:
                await refused(browser, f"http://127.0.0.1:{ui.port}{route}")
            await refused(browser, f"http://127.0.0.1:{ui.port}/api/executions/{quoted}")
        finally:
            await anyio.to_thread.run_sync(browser.close)


async def refused(browser: Browser, url: str) -> None:
    """``url`` opened without the token shows the 403 and nothing else."""
    await anyio.to_thread.run_sync(browser.open, url)
    text = await until(
        lambda: browser.evaluate("document.body && document.body.innerText"), "the refusal"
    )
    assert text.startswith("403"), (url, text)


def level(concurrency: int, throughput: float, p95: float) -> SweepLevel:
    return SweepLevel(
        concurrency=concurrency,
        calls=20,
        errors=0,
        wall_seconds=20 / throughput,
        throughput=throughput,
        p50=p95 / 2,
        p95=p95,
        p99=p95 * 1.2,
    )


async def test_the_sweep_chart_grows_in_the_page_and_marks_its_knee(
    tmp_path: pathlib.Path, chromium: Browser
) -> None:
    levels = [level(1, 20, 0.05), level(2, 40, 0.05), level(4, 80, 0.05), level(8, 82, 0.1)]
    async with serve_sweep("search", (1, 2, 4, 8), calls=20, announce=lambda url: None) as ui:
        browser = chromium.lent()
        try:
            await anyio.to_thread.run_sync(browser.open, ui.url)
            ui.called(1, 7)
            status = await until(
                lambda: browser.evaluate(
                    "(document.getElementById('status')?.textContent || '').includes('7 of 20') "
                    "&& document.getElementById('status').textContent"
                ),
                "the progress of the first level",
            )
            assert status == "measuring concurrency 1: 7 of 20 calls (level 1 of 4)"
            points = (
                "[...document.querySelectorAll('#chart svg polyline.throughput')]"
                ".map(p => p.getAttribute('points').trim().split(/\\s+/).length)"
            )
            for count, measured in enumerate(levels, 1):
                ui.measured(measured)
                shown = await until(
                    lambda: browser.evaluate(points) == [count] and count,  # noqa: B023
                    f"{count} level(s) on the chart",
                )
                assert shown == count
            knee = find_knee(levels)
            assert knee == 4
            ui.finish(SweepReport(tool="search", levels=tuple(levels), knee=knee))
            marker = await until(
                lambda: browser.evaluate(
                    "document.querySelector('#chart svg g.knee')?.textContent"
                ),
                "the knee marker",
            )
            assert marker == "knee at concurrency 4knee: 4"
            status = await until(
                lambda: browser.evaluate(
                    "(document.getElementById('status')?.textContent || '').startsWith('done')"
                    " && document.getElementById('status').textContent"
                ),
                "the sweep done",
            )
            assert status == "done: 4 level(s), 20 calls each"
            dots = await anyio.to_thread.run_sync(
                browser.evaluate, "document.querySelectorAll('#chart svg circle').length"
            )
            assert dots == 2 * len(levels)  # a point per level, for throughput and p95
            done = await anyio.to_thread.run_sync(
                browser.evaluate, "document.getElementById('bar').value"
            )
            assert done == 4 * 20
            assert await anyio.to_thread.run_sync(browser.evaluate, MISSING_GLYPHS) == []
            path = await anyio.to_thread.run_sync(browser.screenshot, screenshot_path("sweep.png"))
            assert path.stat().st_size > 1_000
            for route in ["/", "/api/sweep"]:
                await refused(browser, f"http://127.0.0.1:{ui.port}{route}")
        finally:
            await anyio.to_thread.run_sync(browser.close)
