"""The web view's server over HTTP on 127.0.0.1, without a browser (``httpx2``).

Each test runs the runtime on asyncio and on trio; the server runs in its own thread
on its own asyncio loop either way (see ``actors/ui/_server.py``).
"""

from __future__ import annotations

import threading
from urllib.parse import quote

import anyio
import httpx2
import msgspec
import pytest

from fractor import Agent, AgentRef, Budget, Runtime, ScriptedModel, call, reply, tool
from fractor.actors import ApprovalRequest, ModelText, StepEnd, ToolResultMessage
from fractor.actors.ui import UI, TreeView, serve_ui
from fractor.actors.ui._server import _redacted

from ..sample_tools import RAN, send_email


def quiet(url: str) -> None:
    """What ``announce`` gets instead of stderr."""


async def pending(ref: AgentRef) -> ApprovalRequest:
    await anyio.wait_all_tasks_blocked()
    (request,) = ref.approvals()
    return request


async def get_view(client: httpx2.AsyncClient, ui: UI) -> TreeView:
    response = await client.get(f"http://127.0.0.1:{ui.port}/api/tree", params={"token": ui.token})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return msgspec.json.decode(response.content, type=TreeView)


async def test_every_request_without_the_token_is_refused() -> None:
    async with Runtime() as rt, serve_ui(rt, announce=quiet) as ui, httpx2.AsyncClient() as client:
        base = f"http://127.0.0.1:{ui.port}"
        assert ui.url == f"{base}/?token={ui.token}"
        assert len(ui.token) >= 40
        for method, path in [("GET", "/"), ("GET", "/api/tree"), ("POST", "/api/approvals/x")]:
            for params in [{}, {"token": ""}, {"token": ui.token[:-1]}, {"token": "x" + ui.token}]:
                response = await client.request(method, base + path, params=params)
                assert response.status_code == 403, (method, path, params)
                assert "token" in response.text
        page = await client.get(ui.url)
        assert page.status_code == 200
        assert "<script>" in page.text
        assert "/api/tree" in page.text
        by_header = await client.get(base + "/api/tree", headers={"X-Fractor-Token": ui.token})
        assert by_header.status_code == 200


async def refuses_other_hosts_and_origins(
    client: httpx2.AsyncClient, port: int, token: str, paths: list[tuple[str, str]]
) -> None:
    """With the token, a request is still refused unless its ``Host`` names this server
    (127.0.0.1, localhost or [::1], with its port) and its ``Origin``, when sent, is one
    of those: a page of another site, through a name of its own that points here (DNS
    rebinding), reads nothing. Shared by every kind of page (stored traces, the sweep)."""
    base = f"http://127.0.0.1:{port}"
    for method, path in paths:
        for host in [
            "evil.example",
            f"evil.example:{port}",
            f"127.0.0.1:{port + 1}",
            "",
            "localhost",
        ]:
            response = await client.request(
                method, base + path, params={"token": token}, headers={"Host": host}
            )
            assert response.status_code == 403, (method, path, host)
            assert "Host" in response.text, response.text
            assert f"127.0.0.1:{port}" in response.text  # what it answers for
        for origin in ["http://evil.example", f"http://evil.example:{port}", "null"]:
            response = await client.request(
                method, base + path, params={"token": token}, headers={"Origin": origin}
            )
            assert response.status_code == 403, (method, path, origin)
            assert "Origin" in response.text, response.text
    method, path = paths[0]
    for host in [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LocalHost:{port}"]:
        headers = {"Host": host, "Origin": f"http://{host}"}
        response = await client.request(
            method, base + path, params={"token": token}, headers=headers
        )
        assert response.status_code == 200, (method, path, host, response.text)


async def test_a_request_for_another_host_or_from_another_origin_is_refused() -> None:
    async with Runtime() as rt, serve_ui(rt, announce=quiet) as ui, httpx2.AsyncClient() as client:
        paths = [("GET", "/"), ("GET", "/api/tree"), ("POST", "/api/approvals/x")]
        await refuses_other_hosts_and_origins(client, ui.port, ui.token, paths)


async def test_the_page_ships_every_asset_no_cdn() -> None:
    async with Runtime() as rt, serve_ui(rt, announce=quiet) as ui, httpx2.AsyncClient() as client:
        page = (await client.get(ui.url)).text
        assert "src=" not in page
        assert "href=" not in page
        assert "//" not in page.replace("http://", "").split("<script>")[0]


async def test_the_url_is_printed_once_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    async with Runtime() as rt, serve_ui(rt) as ui:
        pass
    assert capsys.readouterr().err == f"fractor web view: {ui.url}\n"


async def test_the_json_tree_matches_rt_tree_with_its_budget_bars() -> None:
    model = ScriptedModel([call("send_email", to="ana@example.org"), reply("Sent.")])
    agent = Agent("mailer", model, tools=[send_email])
    budget = Budget(tokens=50_000, tool_calls=5, requests=9)
    async with (
        Runtime(budget=budget) as rt,
        serve_ui(rt, announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        ref = await rt.spawn(agent)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "mail Ana")
            request = await pending(ref)  # held: the tree stands still
            ui.publish()
            view = await get_view(client, ui)
            snapshot = rt.tree()
            assert [n.id for n in view.nodes] == [n.id for n in snapshot.nodes]
            for shown, node in zip(view.nodes, snapshot.nodes, strict=True):
                assert (shown.agent, shown.status, shown.depth, shown.parent_id) == (
                    node.name,
                    node.status,
                    node.depth,
                    node.parent_id,
                )
                assert shown.usage == node.usage
                assert shown.waiting == node.waiting
            root = next(n for n in view.nodes if n.parent_id is None)
            root_node = snapshot.node(root.id)
            by_field = {bar.field: bar for bar in root.bars}
            assert list(by_field) == ["tokens", "requests", "tool_calls"]
            tokens = by_field["tokens"]
            spent = root_node.usage.input_tokens + root_node.usage.output_tokens
            assert spent > 0
            assert (tokens.limit, tokens.spent, tokens.reserved) == (50_000, spent, 0)
            assert tokens.left == 50_000 - spent
            assert (by_field["requests"].spent, by_field["requests"].left) == (1, 8)
            assert (by_field["tool_calls"].spent, by_field["tool_calls"].left) == (0, 5)
            mailer = next(n for n in view.nodes if n.agent == "mailer")
            assert mailer.status == "running"
            assert mailer.bars == ()  # its budget is the root's, drawn from there
            assert mailer.line == f"… waiting for approval: send_email [{request.id}]"
            (approval,) = view.approvals
            assert (approval.id, approval.tool, approval.path) == (
                request.id,
                "send_email",
                ("mailer",),
            )
            assert msgspec.json.decode(approval.arguments) == {"to": "ana@example.org"}
            ref.approve(request)
        ui.publish()
        view = await get_view(client, ui)
        assert next(n for n in view.nodes if n.agent == "mailer").status == "completed"
        assert view.approvals == ()


async def test_an_approval_decided_by_post_lets_the_tool_run() -> None:
    model = ScriptedModel([call("send_email", to="ana@example.org"), reply("Sent.")])
    async with (
        Runtime() as rt,
        serve_ui(rt, announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        ref = await rt.spawn(Agent("mailer", model, tools=[send_email]))
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                result = await ref.ask("mail Ana")
                assert (result.status, result.text) == ("completed", "Sent.")

            tg.start_soon(ask)
            request = await pending(ref)
            assert RAN == []
            response = await client.post(
                f"http://127.0.0.1:{ui.port}/api/approvals/{request.id}",
                params={"token": ui.token},
                json={"approved": True},
            )
            assert response.status_code == 200, response.text
            assert response.json() == {"id": request.id, "approved": True}
        assert RAN == ["ana@example.org"]
        (trace,) = await ref.trace()
        assert trace.steps[0].outcomes[0].approval == "approved"


async def test_an_approval_of_a_subagent_on_another_host_is_decided_by_post() -> None:
    """A remote subagent's request id names its host (``default-0/approval-1``): the
    page sends it encoded, as one segment (``encodeURIComponent``), and the route
    takes it whole, encoded or not."""
    from fractor.actors import FunctionModel, LocalHosts, ModelRequest
    from fractor.actors._models._turns import Turn

    def mailer_turns(request: ModelRequest) -> Turn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return reply(request.messages[-1].content)
        return call("send_email", to=f"ana{len(RAN)}@example.org")

    mailer = Agent("mailer", FunctionModel(mailer_turns), tools=[send_email])
    lead = Agent(
        "lead",
        ScriptedModel([call("mailer", task="mail"), call("mailer", task="again"), reply("ok")]),
        subagents=[mailer],
    )
    async with (
        Runtime(hosts=LocalHosts(1)) as rt,
        serve_ui(rt, announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        ref = await rt.spawn(lead)

        async def remote(*, after: str = "") -> ApprovalRequest:
            with anyio.fail_after(10):
                while not (requests := [r for r in ref.approvals() if r.id != after]):  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # the host's request crosses its link
            (request,) = requests
            assert request.id.startswith("default-0/")  # it names the host
            return request

        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "go")
            first = await remote()
            encoded = quote(first.id, safe="")  # as the page's encodeURIComponent does
            assert "%2F" in encoded
            response = await client.post(
                f"http://127.0.0.1:{ui.port}/api/approvals/{encoded}",
                params={"token": ui.token},
                json={"approved": True},
            )
            assert response.status_code == 200, response.text
            assert response.json() == {"id": first.id, "approved": True}
            second = await remote(after=first.id)
            response = await client.post(
                f"http://127.0.0.1:{ui.port}/api/approvals/{second.id}",
                params={"token": ui.token},
                json={"approved": False, "reason": "once is enough"},
            )
            assert response.status_code == 200, response.text
            assert response.json() == {"id": second.id, "approved": False}
        assert RAN == ["ana0@example.org"]


async def test_a_denial_by_post_reaches_the_model_with_its_reason() -> None:
    model = ScriptedModel([call("send_email", to="ana@example.org"), reply("Not sent.")])
    async with (
        Runtime() as rt,
        serve_ui(rt, announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        ref = await rt.spawn(Agent("mailer", model, tools=[send_email]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "mail Ana")
            request = await pending(ref)
            url = f"http://127.0.0.1:{ui.port}/api/approvals/{request.id}"
            bad = await client.post(url, params={"token": ui.token}, content=b"{nope")
            assert bad.status_code == 400
            wrong = await client.post(url, params={"token": ui.token}, json={"approved": "yes"})
            assert wrong.status_code == 400
            assert ref.approvals() == (request,)  # nothing decided by a bad body
            response = await client.post(
                url, params={"token": ui.token}, json={"approved": False, "reason": "not Ana"}
            )
            assert response.status_code == 200, response.text
            again = await client.post(url, params={"token": ui.token}, json={"approved": True})
            assert again.status_code == 404
        assert RAN == []
        (result,) = [m for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]
        assert "denied" in result.content
        assert "not Ana" in result.content


async def test_secrets_given_are_masked_in_every_view() -> None:
    key = "sk-live-1234567890abcdef"
    model = ScriptedModel([call("send_email", to=key), reply("Sent.")])
    async with (
        Runtime() as rt,
        serve_ui(rt, announce=quiet, secrets=[key]) as ui,
        httpx2.AsyncClient() as client,
    ):
        ref = await rt.spawn(Agent("mailer", model, tools=[send_email]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "mail")
            request = await pending(ref)
            ui.publish()
            response = await client.get(ui.url.replace("/?", "/api/tree?"))
            assert key.encode() not in response.content
            assert b"[redacted]" in response.content
            ref.deny(request)


def test_redaction_takes_url_credentials_out_of_each_json_string_alone() -> None:
    data = msgspec.json.encode(
        {"a": "http://example.org", "b": "ana@example.org", "c": "https://u:pw@h.io key-1234"}
    )
    shown = msgspec.json.decode(_redacted(data, ("key-1234",)))
    assert shown == {
        "a": "http://example.org",
        "b": "ana@example.org",
        "c": "https://[redacted]@h.io [redacted]",
    }
    plain = msgspec.json.encode({"a": "nothing to hide"})
    assert _redacted(plain, ("key-1234",)) is plain


async def test_a_port_out_of_range_is_refused() -> None:
    async with Runtime() as rt:
        with pytest.raises(ValueError, match="port"):
            serve_ui(rt, port=70_000)
        with pytest.raises(ValueError, match="interval"):
            serve_ui(rt, interval=0)


async def test_leaving_stops_the_server_and_an_error_comes_out_as_itself() -> None:
    async with Runtime() as rt:
        with pytest.raises(KeyError, match="inside"):
            async with serve_ui(rt, announce=quiet) as ui:
                raise KeyError("inside")
        assert not any(thread.name == "fractor-ui" for thread in threading.enumerate())
        async with httpx2.AsyncClient() as client:
            with pytest.raises(httpx2.ConnectError):
                await client.get(ui.url)


async def test_views_are_published_on_their_own_a_few_a_second() -> None:
    async with (
        Runtime() as rt,
        serve_ui(rt, interval=0.05, announce=quiet) as ui,
        httpx2.AsyncClient() as client,
    ):
        first = (await get_view(client, ui)).version
        with anyio.fail_after(10):
            while (await get_view(client, ui)).version < first + 3:  # noqa: ASYNC110
                await anyio.sleep(0.02)  # another thread serves what the runtime publishes


async def test_a_read_naming_the_view_it_drew_gets_304_until_the_tree_changes() -> None:
    async with Runtime() as rt, serve_ui(rt, announce=quiet) as ui, httpx2.AsyncClient() as client:
        address = f"http://127.0.0.1:{ui.port}/api/tree"
        first = await client.get(address, params={"token": ui.token})
        etag = first.headers["etag"]
        assert etag == f'"{msgspec.json.decode(first.content, type=TreeView).digest}"'
        ui.publish()  # a new view of the same tree: the same digest
        same = await client.get(
            address, params={"token": ui.token}, headers={"If-None-Match": etag}
        )
        assert same.status_code == 304
        assert same.content == b""
        other = await client.get(
            address, params={"token": ui.token}, headers={"If-None-Match": '"1"'}
        )
        assert other.status_code == 200
        assert other.headers["etag"] == etag  # sent again to a reader that drew another
        late = await rt.spawn(Agent(name="late", model=ScriptedModel([reply("x")])))
        assert (await late.ask("go")).ok
        ui.publish()
        changed = await client.get(
            address, params={"token": ui.token}, headers={"If-None-Match": etag}
        )
        assert changed.status_code == 200
        assert changed.headers["etag"] != etag
        assert "late" in changed.text


async def test_no_line_is_lost_however_many_events_come_between_two_views() -> None:
    release = anyio.Event()

    @tool
    async def wait() -> str:
        """Wait for the test."""
        await release.wait()
        return "done"

    agent = Agent(name="lead", model=ScriptedModel([call("wait"), reply("ok")]), tools=[wait])
    async with (
        Runtime() as rt,
        serve_ui(rt, announce=quiet, interval=3000) as ui,
        anyio.create_task_group() as group,
    ):
        ref = await rt.spawn(agent)
        group.start_soon(ref.ask, "go")
        await anyio.wait_all_tasks_blocked()
        (node,) = [node for node in rt.tree().nodes if node.name == "lead"]
        for step in range(5_000):  # far more than any buffer of events would hold
            rt.event_bus.emit(StepEnd(step=step), execution_id=node.id)
        rt.event_bus.emit(ModelText(text="the line after them", step=1), execution_id=node.id)
        ui.publish()
        view = msgspec.json.decode(ui.view(), type=TreeView)
        (shown,) = [shown for shown in view.nodes if shown.id == node.id]
        assert shown.line == "the line after them"
        release.set()
