"""Stored traces and a sweep served over HTTP (``serve_stored``, ``serve_sweep``), without
a browser (``httpx2``): the token on every new route, the list of a SQLite store's
top-level executions, a timeline page with its steps' details, attempts as ``fractor
trace`` shows them, and a sweep's chart growing level by level.
"""

from __future__ import annotations

import pathlib
import threading

import anyio
import httpx2
import msgspec
import pytest

from fractor.actors import (
    Agent,
    ExecutionTrace,
    RestartPolicy,
    ScriptedModel,
    call,
    calls,
    collect_trace_tree,
    fail,
    reply,
    tool,
)
from fractor.actors.ui import StoredUI, SweepView, serve_stored, serve_sweep
from fractor.actors.ui._stored import ExecutionDetail
from fractor.actors.ui.charts import SweepLevel, SweepReport, find_knee
from fractor.runtime import Runtime, SQLiteStore, StoreError

from .test_server import refuses_other_hosts_and_origins


@tool
async def slow(x: int) -> str:
    """Answer ``x`` after 20 ms."""
    await anyio.sleep(0.02)
    return f"slow {x}"


def quiet(url: str) -> None:
    """What ``announce`` gets instead of stderr."""


async def store_with(path: pathlib.Path, *agents: Agent) -> list[tuple[ExecutionTrace, ...]]:
    """Each agent asked once, its traces saved in the SQLite store at ``path``."""
    found = []
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        for agent in agents:
            result = await (await rt.spawn(agent)).ask("go")
            found.append(await collect_trace_tree(store, result.execution_id))
    return found


def lead() -> Agent:
    helper = Agent("helper", ScriptedModel([reply("helped")]))
    model = ScriptedModel(
        [calls(call("slow", x=1), call("slow", x=2), call("helper", task="help")), reply("done")]
    )
    return Agent("lead", model, tools=[slow], subagents=[helper])


async def get(client: httpx2.AsyncClient, ui: StoredUI, path: str) -> httpx2.Response:
    return await client.get(f"http://127.0.0.1:{ui.port}{path}", params={"token": ui.token})


async def test_every_new_route_needs_the_token(tmp_path: pathlib.Path) -> None:
    ((trace, *_),) = await store_with(tmp_path / "f.db", lead())
    quoted = trace.execution_id.replace("#", "%23")
    stored = serve_stored(tmp_path / "f.db", announce=quiet)
    sweeping = serve_sweep("slow", (1, 2), calls=4, announce=quiet)
    async with stored, sweeping, httpx2.AsyncClient() as client:
        for ui, paths in [
            (
                stored,
                ["/", "/api/executions", f"/executions/{quoted}", f"/api/executions/{quoted}"],
            ),
            (sweeping, ["/", "/api/sweep"]),
        ]:
            base = f"http://127.0.0.1:{ui.port}"
            assert ui.url == f"{base}/?token={ui.token}"
            for path in paths:
                for params in [{}, {"token": ""}, {"token": ui.token[:-1]}]:
                    refused = await client.get(base + path, params=params)
                    assert refused.status_code == 403, (path, params)
                    assert "token" in refused.text
                served = await client.get(base + path, params={"token": ui.token})
                assert served.status_code == 200, (path, served.text)
                header = await client.get(base + path, headers={"X-Fractor-Token": ui.token})
                assert header.status_code == 200


async def test_no_route_answers_another_host_or_origin(tmp_path: pathlib.Path) -> None:
    ((trace, *_),) = await store_with(tmp_path / "f.db", lead())
    quoted = trace.execution_id.replace("#", "%23")
    stored = serve_stored(tmp_path / "f.db", announce=quiet)
    sweeping = serve_sweep("slow", (1, 2), calls=4, announce=quiet)
    async with stored, sweeping, httpx2.AsyncClient() as client:
        routes = ["/", "/api/executions", f"/executions/{quoted}", f"/api/executions/{quoted}"]
        paths = [("GET", path) for path in routes]
        await refuses_other_hosts_and_origins(client, stored.port, stored.token, paths)
        paths = [("GET", "/"), ("GET", "/api/sweep")]
        await refuses_other_hosts_and_origins(client, sweeping.port, sweeping.token, paths)


async def test_the_list_a_timeline_and_its_steps_details(tmp_path: pathlib.Path) -> None:
    first, second = await store_with(tmp_path / "f.db", lead(), Agent("solo", ScriptedModel([])))
    top = first[0]
    async with (
        serve_stored(tmp_path / "f.db", announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        listing = (await get(client, ui, "/api/executions")).json()
        assert listing["store"] == str(tmp_path / "f.db")
        # Top-level executions only, the latest first; the helper is under the lead.
        shown = [(e["agent"], e["execution_id"], e["status"]) for e in listing["executions"]]
        assert shown == [
            ("solo", second[0].execution_id, second[0].status),
            ("lead", top.execution_id, "completed"),
        ]
        row = listing["executions"][1]
        assert (row["task"], row["steps"], row["seconds"]) == ("go", 2, top.seconds)
        assert row["usage"]["input_tokens"] == top.usage.input_tokens
        assert row["saved_at"] > 0
        quoted = top.execution_id.replace("#", "%23")
        page = (await get(client, ui, f"/executions/{quoted}")).text
        assert page.count('class="bar tool"') == 2
        assert 'class="bar subagent"' in page
        assert f'data-execution="{top.execution_id}"' in page
        assert "src=" not in page
        assert "//" not in page.split("<svg")[0].replace("http://", "")
        assert "helper [" in page  # the text fractor trace prints, the subagent nested
        response = await get(client, ui, f"/api/executions/{quoted}")
        details = msgspec.json.decode(response.content, type=tuple[ExecutionDetail, ...])
        assert [d.execution_id for d in details] == [t.execution_id for t in first]
        step = details[0].steps[0]
        assert step.usage == top.steps[0].usage
        assert [c.name for c in step.calls] == ["slow", "slow", "helper"]
        assert (step.calls[0].arguments, step.calls[0].content) == ('{"x":1}', "slow 1")
        missing = await get(client, ui, "/api/executions/nobody%231")
        assert missing.status_code == 404


async def test_an_attempt_reads_as_fractor_trace_says_it(tmp_path: pathlib.Path) -> None:
    model = ScriptedModel([fail(RuntimeError("boom")), reply("done")], name="lead")
    agent = Agent("lead", model, restart=RestartPolicy(max_restarts=1))
    ((task, attempt),) = await store_with(tmp_path / "f.db", agent)
    async with (
        serve_stored(tmp_path / "f.db", announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        (row,) = (await get(client, ui, "/api/executions")).json()["executions"]
        assert (row["execution_id"], row["attempt"]) == (task.execution_id, 2)
        quoted = task.execution_id.replace("#", "%23")
        page = (await get(client, ui, f"/executions/{quoted}")).text
        assert f"attempt 1 [{attempt.execution_id}] failed" in page
        details = (await get(client, ui, f"/api/executions/{quoted}")).json()
        assert [(d["attempt"], d["attempt_of"]) for d in details] == [
            (2, ""),
            (1, task.execution_id),
        ]
        assert "boom" in details[1]["steps"][0]["error"]


async def test_a_missing_file_or_no_store_is_an_error_before_serving(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(FileNotFoundError, match="no store at"):
        async with serve_stored(tmp_path / "missing.db", announce=quiet):
            pass
    (tmp_path / "text.db").write_text("not a database, " * 100)
    with pytest.raises(StoreError):
        async with serve_stored(tmp_path / "text.db", announce=quiet):
            pass
    assert not (tmp_path / "missing.db").exists()
    assert not any(thread.name == "fractor-ui" for thread in threading.enumerate())


async def test_an_empty_store_lists_nothing(tmp_path: pathlib.Path) -> None:
    async with SQLiteStore(tmp_path / "empty.db") as store:
        await store.open()
    async with (
        serve_stored(tmp_path / "empty.db", announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        listing = (await get(client, ui, "/api/executions")).json()
        assert listing["executions"] == []
        page = (await get(client, ui, "/")).text
        assert "Nothing is stored in" in page


def level(concurrency: int, throughput: float, p95: float) -> SweepLevel:
    return SweepLevel(
        concurrency=concurrency,
        calls=10,
        errors=0,
        wall_seconds=10 / throughput,
        throughput=throughput,
        p50=p95 / 2,
        p95=p95,
        p99=p95,
    )


async def test_the_sweep_chart_grows_with_each_level_and_marks_the_knee() -> None:
    async with (
        serve_sweep("slow", (1, 2, 4), calls=10, announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):

        async def state() -> tuple[dict[str, int], SweepView]:
            response = await client.get(ui.url.replace("/?", "/api/sweep?"))
            assert response.status_code == 200
            body = response.json()
            return body["progress"], msgspec.convert(body["view"], SweepView)

        progress, view = await state()
        assert (view.measured, view.svg, view.finished) == ((), "", False)
        ui.called(1, 3)
        progress, view = await state()
        assert progress == {"concurrency": 1, "done": 3}
        levels = [level(1, 100, 0.01), level(2, 200, 0.01), level(4, 205, 0.04)]
        for count, measured in enumerate(levels, 1):
            ui.measured(measured)
            _, view = await state()
            assert len(view.measured) == count
            assert view.svg.count("<circle") == 2 * count
            assert view.svg.startswith("<svg")
        assert view.knee == 2 == find_knee(levels)
        assert 'class="knee"' in view.svg
        ui.finish(SweepReport(tool="slow", levels=tuple(levels), knee=2))
        _, view = await state()
        assert view.finished
