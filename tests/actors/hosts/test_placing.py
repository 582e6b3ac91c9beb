"""The core asks the runtime's hosts what they can do (``Placer.place``), never what
class they are: a new kind of host is written from public names alone (this module
imports nothing private), and hosts that cannot place run every call here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from fractor.actors import (
    Agent,
    ChildReply,
    HostUnavailable,
    LocalHosts,
    Placement,
    Placer,
    Result,
    ScriptedModel,
    Usage,
    call,
    calls,
    reply,
)
from fractor.runtime import Node, Runtime, Supervisor


class _Reply:
    """A child's one reply (``ChildReply``)."""

    error: BaseException | None = None

    def __init__(self) -> None:
        self._result: Result | None = None
        self._callback: Callable[[Any], None] | None = None

    def result(self) -> Result:
        assert self._result is not None
        return self._result

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callback = callback
        if self._result is not None:
            callback(self)

    def settle(self, result: Result) -> None:
        self._result = result
        if self._callback is not None:
            self._callback(self)


class _Answering:
    """A placement on the one host of ``Canned``: it answers the task itself."""

    host = "canned-0"

    def __init__(self, hosts: Canned) -> None:
        self.hosts = hosts

    def launch(
        self, agent: Agent, text: str, node: Node, supervisor: Supervisor, task_group: TaskGroup
    ) -> ChildReply:
        answer = _Reply()

        async def run() -> None:
            await anyio.lowlevel.checkpoint()
            supervisor.close(node, "completed")
            result = Result(
                text=f"{self.host} did {text}",
                status="completed",
                stop_reason="",
                usage=Usage(),
                agent_id=node.id,
            )
            answer.settle(result)

        self.hosts.launched.append((agent.name, text))
        task_group.start_soon(run)
        return answer


class Canned:
    """A new kind of host, subclassing nothing: it takes the calls of agent "far"
    (answering them itself) and leaves every other call here."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.launched: list[tuple[str, str]] = []
        self.running = False

    async def start(self, runtime: Runtime) -> None:
        self.running = True

    async def aclose(self) -> None:
        self.running = False

    def place(self, parent: Node, agent: Agent, supervisor: Supervisor) -> Placement | None:
        self.asked.append(agent.name)
        if agent.name == "far":
            return _Answering(self)
        if agent.name == "pinned":
            raise HostUnavailable("no canned host takes agent 'pinned'")
        return None


def _lead(*names: str) -> Agent:
    workers = [Agent(name, ScriptedModel([reply(f"{name} here")])) for name in names]
    script = [calls(*(call(name, task=f"task {name}") for name in names)), reply("done")]
    return Agent("lead", ScriptedModel(script), subagents=workers)


async def test_a_host_kind_written_from_public_names_places_what_it_chooses() -> None:
    hosts = Canned()
    placer: Placer = hosts  # a Placer by what it can do
    async with Runtime(hosts=hosts) as rt:
        ref = await rt.spawn(_lead("far", "near", "pinned"))
        result = await ref.ask("go")
        outcomes = (await ref.trace())[-1].steps[0].outcomes
        tree = rt.tree()
    assert placer is hosts
    assert (result.status, result.text) == ("completed", "done")
    assert sorted(hosts.asked) == ["far", "near", "pinned"]
    assert hosts.launched == [("far", "task far")]
    contents = {o.call.name: (o.content, o.is_error) for o in outcomes}
    assert contents["far"] == ("canned-0 did task far", False)
    assert contents["near"] == ("near here", False)  # left here: run by a local actor
    content, is_error = contents["pinned"]
    assert is_error
    assert "no canned host takes agent 'pinned'" in content
    statuses = {n.name: n.status for n in tree.nodes}
    assert statuses["far"] == "completed"
    assert statuses["pinned"] == "failed"


class Quiet:
    """Hosts that cannot place (no ``place``): every call runs here."""

    async def start(self, runtime: Runtime) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def test_hosts_that_cannot_place_run_every_call_here() -> None:
    async with Runtime(hosts=Quiet()) as rt:
        ref = await rt.spawn(_lead("far", "near"))
        result = await ref.ask("go")
        tree = rt.tree()
    assert (result.status, result.text) == ("completed", "done")
    assert not any(n.host for n in tree.nodes)


async def test_the_shipped_hosts_are_placers() -> None:
    hosts = LocalHosts(1)
    placer: Placer = hosts  # as is every RemoteHosts
    async with Runtime(hosts=hosts) as rt:
        ref = await rt.spawn(_lead("worker"))
        result = await ref.ask("go")
        tree = rt.tree()
    assert placer is hosts
    assert result.status == "completed"
    assert [n.host for n in tree.nodes if n.name == "worker"] == ["default-0"]
