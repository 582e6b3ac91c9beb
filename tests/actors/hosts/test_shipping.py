"""An agent definition shipped to a Ray host: rebuilt there, or refused clearly.

A host rebuilds an agent's model and tools from the pickle the driver sends. A tool of
the script run as ``python app.py`` lives in ``__main__``, which a host's process is
not: it must travel by value. What a host still cannot rebuild is refused before it
is sent, naming what and why; and what fails to rebuild there makes just its subtree
answer ``failed``, never the batch it came with (a sibling in it still answers).
"""

from __future__ import annotations

import sys
import types

import anyio
import pytest

from fractor.actors import (
    Agent,
    FunctionModel,
    ModelRequest,
    RemoteHosts,
    ScriptedModel,
    call,
    calls,
    reply,
    tool,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Runtime

from .trees import researcher

pytestmark = pytest.mark.usefixtures("ray_instance")

#: A module of tools that only this process can import (a host has no such module).
DRIVER_ONLY = '''
from fractor.actors import tool

@tool
async def probe(site: str) -> str:
    """Probe a site."""
    return f"{site}: probed"
'''


@pytest.fixture
def driver_only(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("fractor_driver_only_tools")
    exec(DRIVER_ONLY, module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _ray_hosts(count: int) -> RemoteHosts:
    from fractor.actors.integrations.ray import RayHosts

    return RayHosts(count)


def _lead(*workers: Agent) -> Agent:
    script = [calls(*(call(w.name, task=f"task of {w.name}") for w in workers)), reply("done")]
    return Agent("lead", ScriptedModel(script), subagents=list(workers))


async def _probing(request: ModelRequest) -> Turn:
    if len(request.messages) == 1:
        return call("probe", site="north")
    return reply(str(request.messages[-1].content))


async def test_a_subtree_its_host_cannot_rebuild_answers_failed_and_its_batch_goes_on(
    driver_only: types.ModuleType,
) -> None:
    broken = Agent("prober", FunctionModel(_probing), tools=[driver_only.probe])
    healthy = researcher("researcher")
    # One host: both subtrees go to it in one batch.
    with anyio.fail_after(30):
        async with Runtime(hosts=_ray_hosts(1)) as rt:
            ref = await rt.spawn(_lead(broken, healthy))
            result = await ref.ask("go")
            outcomes = (await ref.trace())[-1].steps[0].outcomes
            nodes = {n.name: n for n in rt.tree().nodes}
    assert (result.status, result.text) == ("completed", "done"), result.stop_reason
    failed, answered = outcomes
    assert answered.content == "found task of researcher"
    assert failed.is_error
    assert nodes["prober"].status == "failed"
    reason = nodes["prober"].stop_reason
    assert "the host 'default-0' could not rebuild agent 'prober'" in reason, reason
    assert "No module named 'fractor_driver_only_tools'" in reason, reason
    assert "runtime_env" in reason, reason
    assert reason in failed.content
    assert nodes["researcher"].status == "completed"


class _NamedModel:
    """A model pickled by name, as pickle does an object its module names (its
    ``__reduce__`` says which)."""

    name = "named"

    def __init__(self, attribute: str) -> None:
        self.attribute = attribute

    def __reduce__(self) -> str:
        return self.attribute

    async def request(self, request: ModelRequest) -> object:
        raise AssertionError("never asked")

    def estimate_tokens(self, request: ModelRequest) -> int:
        return 1

    async def aclose(self) -> None:
        pass


async def test_an_agent_that_names_what_is_in_main_is_refused_before_it_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As a script's module-level object: ``__main__.shared_model``, which a host's
    # ``__main__`` (Ray's worker) does not have.
    model = _NamedModel("shared_model")
    monkeypatch.setattr(_NamedModel, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "shared_model", model, raising=False)
    scripted = Agent("scripted", model)  # type: ignore[arg-type]
    healthy = researcher("researcher")
    with anyio.fail_after(30):
        async with Runtime(hosts=_ray_hosts(1)) as rt:
            ref = await rt.spawn(_lead(scripted, healthy))
            result = await ref.ask("go")
            outcomes = (await ref.trace())[-1].steps[0].outcomes
            nodes = {n.name: n for n in rt.tree().nodes}
            started = rt.hosts.links[0].placed  # type: ignore[union-attr]
    assert result.status == "completed", result.stop_reason
    refused, answered = outcomes
    assert answered.content == "found task of researcher"
    assert refused.is_error
    assert nodes["scripted"].status == "failed"
    reason = nodes["scripted"].stop_reason
    assert "agent 'scripted' cannot be sent to a host" in reason, reason
    assert "__main__.shared_model" in reason, reason
    assert "a module the hosts can import" in reason, reason
    assert reason in refused.content
    assert started == 1  # only the healthy one went


async def _measure(site: str) -> str:
    """Measure a site."""
    return f"{site}: 42"


async def test_a_tool_of_the_script_run_as_main_runs_on_a_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What ``@tool`` at the top of ``python app.py`` makes: ``__main__.measure``.
    monkeypatch.setattr(_measure, "__module__", "__main__")
    monkeypatch.setattr(_measure, "__qualname__", "measure")
    measure = tool(_measure)
    monkeypatch.setattr(sys.modules["__main__"], "measure", measure, raising=False)
    worker = Agent(
        "surveyor",
        ScriptedModel([call("measure", site="north"), reply("north: 42")]),
        tools=[measure],
    )
    with anyio.fail_after(30):
        async with Runtime(hosts=_ray_hosts(1)) as rt:
            ref = await rt.spawn(_lead(worker))
            result = await ref.ask("go")
            outcomes = (await ref.trace())[-1].steps[0].outcomes
    assert result.status == "completed", result.stop_reason
    assert [o.content for o in outcomes] == ["north: 42"]
    assert not outcomes[0].is_error
