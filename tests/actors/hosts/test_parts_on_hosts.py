"""Images and documents across hosts (issue 30): a subagent placed on a host gets
the parts its task names, and the parts of its answer come back to its parent, each
blob's bytes crossing once per message."""

from __future__ import annotations

import hashlib
import math

import pytest

from fractor.actors import (
    Agent,
    FunctionModel,
    Image,
    LocalHosts,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    ToolResultMessage,
    UserMessage,
    call,
    reply,
)
from fractor.actors._hosts._host import AgentHost
from fractor.actors._hosts._hosts import _LocalLink
from fractor.actors._observation._traces import trace_from_record
from fractor.runtime import MemoryStore, Runtime

from ..parts_data import png

PHOTO = Image(data=png(640, 480))
CHART = Image(data=png(300, 200, fill=7))


def tool_results(request: ModelRequest) -> list[ToolResultMessage]:
    return [m for m in request.messages if isinstance(m, ToolResultMessage)]


async def test_a_worker_on_a_host_sees_the_leads_image_and_hands_one_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What crosses: the Start messages going down, the batches coming up.
    down: list[bytes] = []
    up: list[bytes] = []
    start, drain = _LocalLink.start, AgentHost.drain

    def starting(link: _LocalLink, run_id: int, agent: Agent, data: bytes) -> None:
        down.append(data)
        start(link, run_id, agent, data)

    async def draining(host: AgentHost, timeout: float = math.inf) -> bytes:
        data = await drain(host, timeout)
        up.append(data)
        return data

    monkeypatch.setattr(_LocalLink, "start", starting)
    monkeypatch.setattr(AgentHost, "drain", draining)

    seen: list[ModelRequest] = []

    def draw(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return ModelResponse(text="Here is the chart.", parts=(CHART,))

    worker = Agent("worker", FunctionModel(draw), description="Draws charts.")
    tag = f"sha256:{PHOTO.sha256[:12]}"
    task = f"Chart the photo {tag}; it is the same as {tag}."
    lead_model = ScriptedModel([call("worker", task=task), reply("Done.")])
    store = MemoryStore()
    async with Runtime(hosts=LocalHosts(1), store=store) as rt:
        ref = await rt.spawn(Agent("lead", lead_model, subagents=[worker]))
        result = await ref.ask(["Chart this photo.", PHOTO])
        tree = rt.tree()
    assert result.ok, result.stop_reason
    (node,) = [n for n in tree.nodes if n.name == "worker"]
    assert node.host == "default-0"
    # The worker's model, on the host, saw the photo: the same bytes and media type.
    (request,) = seen
    (user,) = [m for m in request.messages if isinstance(m, UserMessage)]
    assert user.content == task
    (part,) = user.parts
    assert isinstance(part, Image)
    assert part.data == PHOTO.data
    assert part.media_type == "image/png"
    assert (part.sha256, part.width, part.height) == (PHOTO.sha256, 640, 480)
    # Its chart came back: the lead's next request carries it in the tool result.
    (message,) = tool_results(lead_model.requests[1])
    assert message.content == "Here is the chart."
    (chart,) = message.parts
    assert isinstance(chart, Image)
    assert (chart.data, chart.media_type) == (CHART.data, "image/png")
    # Named twice, the photo's bytes went down once; they did not come back up (the
    # driver has them). The chart, in the worker's answer and in its trace, went up
    # once.
    assert len(down) == 1
    assert PHOTO.data is not None
    assert CHART.data is not None
    assert down[0].count(PHOTO.data) == 1
    assert sum(batch.count(PHOTO.data) for batch in up) == 0
    assert sum(batch.count(CHART.data) for batch in up) == 1
    # The worker's trace reached the driver's store whole: both parts by hash, the
    # bytes as blobs.
    record = await store.record(node.id)
    assert record is not None
    trace = trace_from_record(record)
    assert [p.sha256 for p in trace.task_parts] == [PHOTO.sha256]
    assert [p.sha256 for p in trace.parts] == [CHART.sha256]
    blobs = await store.load_blobs({PHOTO.sha256, CHART.sha256})
    assert {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()} == {
        PHOTO.sha256: PHOTO.sha256,
        CHART.sha256: CHART.sha256,
    }


def look(request: ModelRequest) -> ModelResponse:
    """A worker's model that says what images it was given (media type and the
    SHA-256 of the bytes it holds) and answers with the chart."""
    (user,) = [m for m in request.messages if isinstance(m, UserMessage)]
    saw = [
        f"{part.media_type} {hashlib.sha256(part.data).hexdigest()}"
        for part in user.parts
        if isinstance(part, Image) and part.data is not None
    ]
    return ModelResponse(text=f"saw {', '.join(saw)}", parts=(CHART,))


async def test_a_worker_on_a_ray_host_sees_the_image_and_hands_one_back(
    ray_instance: None,
) -> None:
    from fractor.actors.integrations.ray import RayHosts

    worker = Agent("worker", FunctionModel(look), description="Looks at photos.")
    task = f"Look at sha256:{PHOTO.sha256[:8]}."
    lead_model = ScriptedModel([call("worker", task=task), reply("Done.")])
    async with Runtime(hosts=RayHosts(1)) as rt:
        ref = await rt.spawn(Agent("lead", lead_model, subagents=[worker]))
        result = await ref.ask(["Look at this photo.", PHOTO])
        tree = rt.tree()
    assert result.ok, result.stop_reason
    (node,) = [n for n in tree.nodes if n.name == "worker"]
    assert node.host == "default-0"
    (message,) = tool_results(lead_model.requests[1])
    assert message.content == f"saw image/png {PHOTO.sha256}"
    (chart,) = message.parts
    assert isinstance(chart, Image)
    assert (chart.data, chart.media_type, chart.sha256) == (CHART.data, "image/png", CHART.sha256)
