"""The web view of a tree of 1,000 agents in a real browser (headless Chromium).

A lead fans out to 1,000 children that each wait in a tool until the test lets them
go, so the tree stands still while the page is looked at. The page loads it within a
few seconds with the lead's 1,000 children collapsed (their count shown); a click
shows them; when one child completes, the page touches a few elements, not the tree
(a MutationObserver the test installs counts them); when all complete, the same page,
not reloaded, shows every one completed. Screenshot: ``tests/actors/ui/screenshots/big_tree.png``.
Without a Chromium: skipped or failed, saying so, as in ``test_browser.py``.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import anyio
import anyio.to_thread

from fractor import Agent, Runtime
from fractor.actors import CycleModel, ModelResponse, ToolCall, Usage, tool
from fractor.actors.ui import serve_ui

from .browser import Browser, screenshot_path

CHILDREN = 1_000
USAGE = Usage(input_tokens=10, output_tokens=5, requests=1)


def lead(hold: Any) -> Agent:
    child = Agent(
        "child",
        CycleModel(
            [
                ModelResponse(
                    tool_calls=(ToolCall(id="call_0_0", name="hold", arguments="{}"),),
                    usage=USAGE,
                    finish_reason="tool_calls",
                ),
                ModelResponse(text="done", usage=USAGE),
            ]
        ),
        tools=[hold],
    )
    calls = tuple(
        ToolCall(id=f"call_0_{i}", name="child", arguments=f'{{"task": "part {i}"}}')
        for i in range(CHILDREN)
    )
    turns = [
        ModelResponse(tool_calls=calls, usage=USAGE, finish_reason="tool_calls"),
        ModelResponse(text="merged", usage=USAGE),
    ]
    return Agent("lead", CycleModel(turns), subagents=[child], tool_concurrency=CHILDREN)


#: Counts what changes under #tree: records, and the li.node elements added or removed.
OBSERVE = """
window.touched = { records: 0, nodes: 0, added: 0, removed: 0 };
const isNode = node => node.matches && node.matches("li.node");
new MutationObserver(records => {
  const touched = window.touched;
  for (const record of records) {
    touched.records += 1;
    touched.nodes += record.addedNodes.length + record.removedNodes.length;
    touched.added += [...record.addedNodes].filter(isNode).length;
    touched.removed += [...record.removedNodes].filter(isNode).length;
  }
}).observe(
  document.getElementById("tree"),
  { childList: true, subtree: true, characterData: true, attributes: true },
);
true
"""


async def test_a_tree_of_1000_agents_stays_responsive(
    anyio_backend: str, tmp_path: pathlib.Path, chromium: Browser
) -> None:
    waiting: list[anyio.Event] = []
    all_in = anyio.Event()

    async def _hold() -> str:
        release = anyio.Event()
        waiting.append(release)
        if len(waiting) == CHILDREN:
            all_in.set()
        await release.wait()
        return "released"

    hold = tool(_hold, name="hold")

    async def evaluate(expression: str) -> Any:
        return await anyio.to_thread.run_sync(browser.evaluate, expression)

    async with (
        Runtime() as rt,
        serve_ui(rt, interval=0.1, announce=lambda url: None) as ui,
    ):
        ref = await rt.spawn(lead(hold))
        browser = chromium.lent()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(ref.ask, "fan out")
                with anyio.fail_after(30):
                    await all_in.wait()
                # Every child waits in the tool: the tree stands still from here. Its
                # view is published now, so the page draws no view published while
                # children were still entering the tool: each child such a view shows
                # behind would be redrawn by the next one, counted below against the
                # one child that completes (322 records once under load: 6 + 2 a child).
                ui.publish()
                still = json.loads(ui.view())
                lead_id = next(n.id for n in rt.tree().nodes if n.name == "lead")
                at = f"li.node[data-id={json.dumps(lead_id)}]"
                await anyio.to_thread.run_sync(browser.open, ui.url)
                count = await anyio.to_thread.run_sync(
                    browser.wait,
                    f"document.querySelector('{at} > .row .count')?.textContent",
                    "the lead's count of children",
                )
                assert count == f"{CHILDREN} below (collapsed)"

                # Collapsed: the children have no elements at all (the root and the lead).
                assert await evaluate("document.querySelectorAll('li.node').length") == 2
                await evaluate(f"document.querySelector('{at} > .row .toggle').click()")
                shown = await evaluate(
                    f"[...document.querySelectorAll('{at} > ul > li.node .status')]"
                    ".map(e => e.textContent)"
                )
                assert shown == ["running"] * CHILDREN
                assert await evaluate(
                    f"document.querySelector('{at} > .row .count').textContent"
                ) == (f"{CHILDREN} below")

                # One child completes: a few elements change, no node is drawn again.
                # What the page shows before is the view of the tree standing still
                # (that view or a later one, the same but for its number).
                state = await evaluate("document.getElementById('state').textContent")
                assert int(state.split()[1]) >= still["version"], (state, still["version"])
                assert json.loads(ui.view())["digest"] == still["digest"], "the tree moved"
                assert await evaluate(OBSERVE)

                def ended() -> list[str]:
                    return [
                        n.id for n in rt.tree().nodes if n.name == "child" and n.status != "running"
                    ]

                waiting[0].set()
                with anyio.fail_after(10):
                    while not (done := ended()):  # noqa: ASYNC110
                        await anyio.sleep(0.01)  # the tree is read, not awaited
                assert len(done) == 1
                child = f"li.node[data-id={json.dumps(done[0])}]"
                status = f"document.querySelector('{child} > .row .status')"
                assert await anyio.to_thread.run_sync(
                    browser.wait, f"{status}?.textContent === 'completed'", "the child completed"
                )
                touched = await evaluate("window.touched")
                assert touched["added"] == touched["removed"] == 0, touched
                # Measured: 6 records (the rows of the child, the lead and the root redrawn).
                assert 0 < touched["records"] < 40, touched
                assert touched["nodes"] < 80, touched

                # All complete: the same page, not reloaded, shows them completed.
                for release in waiting:
                    release.set()
            # The ask answered: the lead completed; the page shows it, and every child.
            assert await anyio.to_thread.run_sync(
                browser.wait,
                f"document.querySelectorAll('{at} > ul > li.node > .row .status.completed').length"
                f" === {CHILDREN} && document.querySelector('{at} > .row .status').textContent"
                " === 'completed'",
                "the lead and every child completed",
            )
            assert await evaluate("window.touched.added") == 0  # the same page, not redrawn
            path = await anyio.to_thread.run_sync(
                browser.screenshot, screenshot_path("big_tree.png")
            )
            assert path.stat().st_size > 1_000
        finally:
            await anyio.to_thread.run_sync(browser.close)
