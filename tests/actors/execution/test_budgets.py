"""Budgets that are hard and never premature, end to end (DESIGN.md section 3).

The cases of the budget issue: concurrent children under a shared budget complete
(tokens, output tokens, cost; on the lead and on the Runtime), ReAct corrections are
requests of their own, impossible usage is refused, waits are visible and end at
once on a stop, and 1,000 waiting children do not deadlock.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import msgspec
import pytest

from fractor.actors import (
    Agent,
    AssistantMessage,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    OpenAIModel,
    ReActModel,
    Result,
    ScriptedModel,
    ToolResultMessage,
    Usage,
    call,
    calls,
    reply,
    tool,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Budget, Caps, Event, OutputSharing, Price, Runtime

from ..loopback import LoopbackServer, Reply, json_reply, sse_reply

PRICES = {"worker-model": Price(input_per_million=1.0, output_per_million=4.0)}


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


class Workers:
    """A worker model that takes a few milliseconds per request (a tool call, then an
    answer) and records how many of its requests were in flight at once."""

    def __init__(self, latency: float = 0.003) -> None:
        self.latency = latency
        self.in_flight = 0
        self.most_at_once = 0
        self.model = FunctionModel(self.respond, name="worker-model")

    async def respond(self, request: ModelRequest) -> Turn:
        self.in_flight += 1
        self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            await anyio.sleep(self.latency)
        finally:
            self.in_flight -= 1
        asked = sum(
            isinstance(m, AssistantMessage) and bool(m.tool_calls) for m in request.messages
        )
        if asked == 0:
            return call("lookup", topic="heat pumps")
        return reply("Heat pumps move heat; they do not make it.")


def five_children(workers: Workers, budget: Budget | None = None) -> Agent:
    worker = Agent("worker", workers.model, tools=[lookup])
    lead_model = ScriptedModel(
        [calls(*(call("worker", task=f"topic {i}") for i in range(5))), reply("All done.")] * 2,
        name="worker-model",
    )
    return Agent("lead", lead_model, subagents=[worker], budget=budget)


BUDGETS = [
    pytest.param(Budget(tokens=10_000), id="tokens"),
    pytest.param(Budget(output_tokens=3_000), id="output_tokens"),
    pytest.param(Budget(cost=0.02), id="cost"),
]


@pytest.mark.parametrize("budget", BUDGETS)
async def test_five_concurrent_children_complete_under_a_budget_on_the_lead(
    budget: Budget,
) -> None:
    workers = Workers()
    async with Runtime(prices=PRICES) as rt:
        ref = await rt.spawn(five_children(workers, budget))
        result = await ref.ask("Research five topics.")
        tree = rt.tree()
    assert (result.status, result.text) == ("completed", "All done."), result.stop_reason
    assert [n.status for n in tree.nodes if n.name == "worker"] == ["completed"] * 5
    assert workers.most_at_once == 5  # concurrent, not one after another
    within(result.usage, budget)


@pytest.mark.parametrize("budget", BUDGETS)
async def test_five_concurrent_children_complete_under_a_runtime_budget_and_it_stays_usable(
    budget: Budget,
) -> None:
    workers = Workers()
    async with Runtime(budget=budget, prices=PRICES) as rt:
        ref = await rt.spawn(five_children(workers))
        first = await ref.ask("Research five topics.")
        assert (first.status, first.text) == ("completed", "All done."), first.stop_reason
        # The root was never stopped: a later ask on the same runtime still runs.
        second = await ref.ask("Once more, briefly.")
        root = rt.tree().node("root")
    assert second.status == "completed", second.stop_reason
    assert root.status == "idle"  # the runtime, with nothing running under it
    assert workers.most_at_once == 5
    within(root.usage, budget)


def within(usage: Usage, budget: Budget) -> None:
    if budget.tokens is not None:
        assert usage.total_tokens <= budget.tokens
    if budget.output_tokens is not None:
        assert usage.output_tokens <= budget.output_tokens
    if budget.cost is not None:
        assert usage.cost <= budget.cost


async def test_twenty_children_under_a_runtime_budget_all_finish() -> None:
    # The second case: 20 children under Runtime(Budget(tokens=50_000)) used
    # to stop at 151 tokens with none of them done.
    workers = Workers(latency=0.001)
    worker = Agent("worker", workers.model, tools=[lookup])
    lead = Agent(
        "lead",
        ScriptedModel([calls(*(call("worker", task=str(i)) for i in range(20))), reply("ok")]),
        subagents=[worker],
    )
    async with Runtime(budget=Budget(tokens=50_000)) as rt:
        result = await (await rt.spawn(lead)).ask("go")
        statuses = [n.status for n in rt.tree().nodes if n.name == "worker"]
    assert result.status == "completed", result.stop_reason
    assert statuses == ["completed"] * 20
    assert result.usage.total_tokens <= 50_000


async def test_a_budget_that_is_really_spent_stops_with_need_and_left() -> None:
    workers = Workers(latency=0)
    async with Runtime() as rt:
        ref = await rt.spawn(five_children(workers, Budget(tokens=700)))
        result = await ref.ask("Research five topics.")
        lead = rt.tree().node(result.execution_id)
    assert result.status == "budget_exceeded"
    assert result.stop_reason.startswith("tokens limit of 700 reached: the next request needs")
    assert "output), " in result.stop_reason
    assert " left (budget of lead " in result.stop_reason
    assert lead.usage.total_tokens <= 700
    # Honest: what was left was less than what the next request needed.
    need = int(result.stop_reason.split("needs about ")[1].split(" ")[0].replace(",", ""))
    left = int(result.stop_reason.split("), ")[1].split(" left")[0].replace(",", ""))
    assert need > left == 700 - lead.usage.total_tokens


async def test_a_reply_cut_by_its_share_is_asked_again_not_a_stop() -> None:
    # Four children share 3,200 tokens: the first request of each may take a quarter.
    # The long one runs into its share; asked again with room for twice as much (it
    # waits for the others to settle), it completes: a reservation race is no stop.
    long_answer = "word " * 720  # 900 tokens at 4 characters each

    async def respond(request: ModelRequest) -> Turn:
        await anyio.sleep(0.001)
        task = request.messages[-1].content
        return reply(long_answer if task == "long" else "short answer")

    worker = Agent("worker", FunctionModel(respond))
    tasks = ["long", "a", "b", "c"]
    lead = Agent(
        "lead",
        ScriptedModel([calls(*(call("worker", task=t) for t in tasks)), reply("ok")]),
        subagents=[worker],
    )
    events: list[Event] = []
    async with Runtime(budget=Budget(tokens=3_200), min_output_tokens=64) as rt:
        async with rt.events() as subscription:
            result = await (await rt.spawn(lead)).ask("go")
            while (event := subscription.receive_nowait()) is not None:
                events.append(event)
        workers = [n for n in rt.tree().nodes if n.name == "worker"]
    assert result.status == "completed", result.stop_reason
    assert [n.status for n in workers] == ["completed"] * 4
    cut = [e for e in events if e.kind == "retry" and "cut at" in str(e.detail["error"])]
    assert len(cut) == 1
    assert "by the budget shared with requests in flight" in str(cut[0].detail["error"])
    long_node = next(n for n in workers if n.own_usage.requests == 2)
    assert long_node.own_usage.output_tokens > 900  # the cut reply was charged too
    assert result.usage.total_tokens <= 3_200


def many_workers(count: int) -> tuple[Agent, FunctionModel]:
    """A lead whose first reply calls ``count`` workers at once (far more output than
    the 4,096 tokens reserved for a request that names no max_tokens), then answers."""

    async def lead(request: ModelRequest) -> Turn:
        if any(isinstance(m, ToolResultMessage) for m in request.messages):
            return reply("All done.")
        return calls(*(call("worker", task=f"look into topic number {i}") for i in range(count)))

    model = FunctionModel(lead, name="lead-model")
    worker = Agent("worker", FunctionModel(lambda request: reply("done"), name="worker-model"))
    return Agent("lead", model, subagents=[worker]), model


@pytest.mark.parametrize("sharing", ["fair", "whole"])
async def test_a_generous_budget_does_not_cut_a_reply_the_tree_gets_without_one(
    sharing: OutputSharing,
) -> None:
    # A lead calling 1,000 workers writes some 12,000 output tokens in one reply. With
    # no budget the request goes uncapped and the tree completes; under ten times that
    # demand it was sent capped at the default reservation (4,096) and ended
    # "completed" with "the model stopped (length) without text".
    count = 1_000
    async with Runtime() as rt:
        agent, _ = many_workers(count)
        free = await (await rt.spawn(agent)).ask("go")
    assert (free.status, free.text) == ("completed", "All done."), free.stop_reason
    demand = free.usage.total_tokens
    events: list[Event] = []
    async with Runtime(budget=Budget(tokens=10 * demand), output_sharing=sharing) as rt:
        agent, model = many_workers(count)
        async with rt.events() as subscription:
            result = await (await rt.spawn(agent)).ask("go")
            while (event := subscription.receive_nowait()) is not None:
                events.append(event)
        workers = [n for n in rt.tree().nodes if n.name == "worker"]
    assert (result.status, result.text) == ("completed", "All done."), result.stop_reason
    assert [n.status for n in workers] == ["completed"] * count
    assert result.usage.total_tokens <= 10 * demand
    # The cut replies were asked again with room for twice as much each time (4,096,
    # 8,192, then 16,384, which holds it), and said so.
    sent = [r.max_tokens for r in model.requests]
    assert sent[:3] == [4_096, 8_192, 16_384]
    cut = [e for e in events if e.kind == "retry" and "cut at" in str(e.detail["error"])]
    assert len(cut) == 2
    assert "names no max_tokens" in str(cut[0].detail["error"])


# -- every request goes through the supervisor ------------------------------------------


async def test_react_corrections_are_requests_of_their_own() -> None:
    inner = ScriptedModel(
        [reply("not json at all"), reply('{"thought": "ok", "final": "fine"}')], name="inner"
    )
    agent = Agent("a", ReActModel(inner), tools=[lookup])
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go", budget=Budget(requests=1))
    assert result.status == "budget_exceeded"
    assert result.stop_reason.startswith("requests limit of 1 reached")
    assert result.usage.requests == 1  # the correction was refused before it was sent
    assert len(inner.requests) == 1
    assert result.usage.input_tokens > 0  # the malformed reply was charged


async def test_a_react_format_failure_is_charged_every_attempt() -> None:
    inner = ScriptedModel([reply("no"), reply("still no"), reply("never")], name="inner")
    agent = Agent("a", ReActModel(inner, max_corrections=2), tools=[lookup])
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go")
    assert result.status == "failed"
    assert "MalformedAction" in result.stop_reason
    assert result.usage.requests == 3
    assert result.usage.output_tokens == 1 + 2 + 2  # a token per 4 characters, at least 1


async def test_negative_usage_from_a_model_is_refused_never_refunded() -> None:
    model = ScriptedModel(
        [
            reply("fine", usage=Usage(input_tokens=50, output_tokens=10, requests=1)),
            reply("refund me", usage=Usage(input_tokens=10, output_tokens=-1_000, requests=1)),
        ],
        name="liar",
    )
    agent = Agent("a", model)
    async with Runtime(budget=Budget(tokens=5_000)) as rt:
        ref = await rt.spawn(agent)
        first = await ref.ask("one")
        second = await ref.ask("two")
        root = rt.tree().node("root")
    assert first.status == "completed"
    assert second.status == "failed"
    assert "InvalidUsage: model 'liar' reported impossible usage: output_tokens=-1000" in (
        second.stop_reason
    )
    # Charged the whole reservation, not refunded: usage only ever grows.
    assert second.usage.output_tokens > 0
    assert root.usage.output_tokens == 10 + second.usage.output_tokens
    assert root.usage.input_tokens >= 60


@pytest.mark.parametrize("budget", [None, Budget(tokens=10**7)], ids=["no-budget", "budget"])
async def test_impossible_usage_charges_the_input_estimate_with_or_without_a_budget(
    budget: Budget | None,
) -> None:
    """Usage that cannot be true is charged as the reservation: its input is the
    estimate, made then when no budget needed it before the request."""
    model = ScriptedModel(
        [reply("x", usage=Usage(input_tokens=10, output_tokens=-1, requests=1))], name="liar"
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, instructions="y" * 4_000))
        result = await ref.ask("go", budget=budget)
    assert result.status == "failed"
    assert result.usage.input_tokens == model.estimate_tokens(model.requests[0]) > 1_000


async def test_a_failed_request_is_charged_its_input_estimate() -> None:
    model = FunctionModel(lambda request: _raise(ValueError("bad request shape")))
    async with Runtime() as rt:
        result = await (await rt.spawn(Agent("a", model))).ask("go")
    assert result.status == "failed"
    assert result.usage.requests == 1
    assert result.usage.input_tokens == model.estimate_tokens(model.requests[0])
    assert result.usage.output_tokens == 0


def _raise(error: Exception) -> ModelResponse:
    raise error


async def test_a_request_cut_by_a_deadline_is_charged_its_input_estimate() -> None:
    async def slow(request: ModelRequest) -> Turn:
        await anyio.sleep(10)
        return reply("never")

    model = FunctionModel(slow)
    async with Runtime() as rt:
        result = await (await rt.spawn(Agent("a", model))).ask("go", budget=Budget(seconds=0.05))
    assert result.status == "timed_out"
    assert result.usage.requests == 1
    assert result.usage.input_tokens == model.estimate_tokens(model.requests[0])


async def test_with_no_budget_a_cut_request_is_still_charged_its_input_estimate() -> None:
    """With no budget on the chain the estimate is not made per request (see
    ``actors._requests._budget``), only for a request that failed or was cut off."""
    started = anyio.Event()

    async def slow(request: ModelRequest) -> Turn:
        started.set()
        await anyio.sleep(10)
        return reply("never")

    model = FunctionModel(slow)
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, instructions="x" * 400))
        with anyio.fail_after(5):
            async with ref.stream("go") as run:
                await started.wait()  # leaving the block stops the execution
    assert run.result is not None
    assert run.result.usage.requests == 1
    assert run.result.usage.input_tokens == model.estimate_tokens(model.requests[0]) > 100


# -- waits are visible, interruptible, and never deadlock -------------------------------


def held_up(hold: anyio.Event, budget: Budget | None = None) -> Agent:
    """A lead of three children whose requests hold the budget until ``hold`` is set."""

    async def respond(request: ModelRequest) -> Turn:
        await hold.wait()
        return reply("done", usage=Usage(input_tokens=10, output_tokens=10, requests=1))

    return Agent(
        "lead",
        ScriptedModel([calls(*(call("worker", task=str(i)) for i in range(3))), reply("ok")]),
        subagents=[Agent("worker", FunctionModel(respond))],
        budget=budget,
    )


async def test_a_wait_is_an_event_a_node_state_and_a_statistic() -> None:
    hold = anyio.Event()
    lead = held_up(hold)
    events: list[Event] = []
    outcome: list[Result] = []
    # 800 tokens: each child's request needs its input + 256 output; two fit at once.
    async with Runtime(budget=Budget(tokens=800)) as rt, rt.events() as subscription:
        ref = await rt.spawn(lead)

        async def ask() -> None:
            outcome.append(await ref.ask("go"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            with anyio.fail_after(5):
                async for event in subscription:
                    events.append(event)
                    if event.kind == "budget_wait":
                        waiting = [n for n in rt.tree().nodes if n.waiting]
                        stats = rt.statistics()
                        hold.set()
                    if event.kind == "execution_end" and event.agent == "lead":
                        break
        after = rt.statistics()
    (result,) = outcome
    assert result.status == "completed", result.stop_reason
    assert stats.budget_waiting == len(waiting) == 1
    assert stats.budget_waits == 1
    (node,) = waiting
    assert node.name == "worker"
    assert node.waiting.startswith("waiting for budget: tokens of runtime")
    kinds = [e.kind for e in events]
    assert kinds.count("budget_wait") == kinds.count("budget_resume") == 1
    wait = next(e for e in events if e.kind == "budget_wait")
    assert wait.detail["reason"] == node.waiting
    assert wait.execution_id == node.id
    assert (after.budget_waiting, after.budget_waits) == (0, 1)
    assert after.budget_wait_seconds > 0


async def test_a_deadline_ends_a_wait_at_once() -> None:
    lead = held_up(anyio.Event(), Budget(tokens=1_000, seconds=0.2))
    async with Runtime() as rt:
        with anyio.fail_after(5):
            result = await (await rt.spawn(lead)).ask("go")
        statuses = sorted(n.status for n in rt.tree().nodes if n.name == "worker")
        waiting = rt.statistics().budget_waiting
    assert result.status == "timed_out"
    assert statuses == ["timed_out"] * 3
    assert waiting == 0


async def test_a_thousand_waiting_children_do_not_deadlock() -> None:
    async def respond(request: ModelRequest) -> Turn:
        await anyio.lowlevel.checkpoint()
        return reply("done", usage=Usage(input_tokens=100, output_tokens=20, requests=1))

    worker = Agent("worker", FunctionModel(respond))
    fan_out = calls(*(call("worker", task=str(i)) for i in range(1000)))
    # A thousand calls in one reply: more than the default cap would let through.
    fan_out = msgspec.structs.replace(
        fan_out, usage=Usage(input_tokens=100, output_tokens=1_000, requests=1)
    )
    lead = Agent(
        "lead", ScriptedModel([fan_out, reply("ok")]), subagents=[worker], tool_concurrency=1000
    )
    # Room for a few dozen requests at a time: most children wait, all of them finish.
    async with Runtime(budget=Budget(tokens=160_000), min_output_tokens=200) as rt:
        with anyio.fail_after(60):
            result = await (await rt.spawn(lead)).ask("go")
        stats = rt.statistics()
        statuses = [n.status for n in rt.tree().nodes if n.name == "worker"]
    assert result.status == "completed", result.stop_reason
    assert statuses == ["completed"] * 1000
    assert stats.budget_waits > 0
    assert stats.budget_waiting == 0
    assert result.usage.total_tokens <= 160_000


# -- default caps: a runaway tree ends even with no budget anywhere ---------------------


def _relentless(request: ModelRequest) -> Turn:
    """Always asks for more work, unless a refusal just came back: then it reports it."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage) and last.is_error:
        return reply(f"stopped: {last.content}")
    if isinstance(last, ToolResultMessage) and last.name == "child":
        return reply(last.content)
    names = {spec.name for spec in request.tools}
    return call("child", task="go deeper") if "child" in names else call("lookup", topic="x")


async def test_a_runaway_chain_of_subagents_is_bounded_by_the_default_depth_cap() -> None:
    agent = Agent("child", FunctionModel(_relentless))
    for _ in range(12):  # twelve levels, each delegating to the next
        agent = Agent("child", FunctionModel(_relentless), subagents=[agent])
    async with Runtime() as rt:  # no budget: the default caps hold
        result = await (await rt.spawn(agent)).ask("go")
        depths = {n.depth for n in rt.tree().nodes if n.name == "child"}
    assert result.status == "completed"
    assert max(depths) == 8
    cap = "depth limit of 8 reached: the runtime's default cap on the depth of a tree"
    assert cap in result.text
    assert "Runtime(caps=Caps(depth=...))" in result.text


async def test_a_runaway_loop_of_tool_calls_is_bounded_by_the_default_step_cap() -> None:
    model = FunctionModel(lambda request: call("lookup", topic="again"), record=0)
    async with Runtime() as rt:
        result = await (await rt.spawn(Agent("loop", model, tools=[lookup]))).ask("go")
    assert result.status == "budget_exceeded"
    assert result.stop_reason.startswith(
        "steps limit of 200 reached: the runtime's default cap on the steps of one execution; "
        "raise it or remove it with Runtime(caps=Caps(steps=...))"
    )
    assert result.steps == 200
    assert result.usage.tool_calls == 200


async def test_caps_are_raised_or_removed_explicitly() -> None:
    turns = [call("lookup", topic=str(i)) for i in range(300)] + [reply("done")]
    async with Runtime(caps=Caps(steps=400)) as rt:
        raised = await (await rt.spawn(Agent("a", ScriptedModel(turns), tools=[lookup]))).ask("go")
    async with Runtime(caps=None) as rt:
        removed = await (await rt.spawn(Agent("a", ScriptedModel(turns), tools=[lookup]))).ask("go")
    assert (raised.status, raised.steps) == ("completed", 301)
    assert (removed.status, removed.steps) == ("completed", 301)


async def test_the_agents_cap_counts_the_executions_under_one_top_level_execution() -> None:
    def fan_out(request: ModelRequest) -> Turn:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage) and last.is_error:
            return reply("enough")
        return calls(*(call("child", task=str(i)) for i in range(8)))

    model = FunctionModel(fan_out)
    child = Agent("child", ScriptedModel([reply("ok")] * 100))
    async with Runtime(caps=Caps(agents=20)) as rt:
        ref = await rt.spawn(Agent("lead", model, subagents=[child]))
        first = await ref.ask("fan out")
        second = await ref.ask("again")  # a new top-level execution: 20 of its own
        children = [n for n in rt.tree().nodes if n.name == "child"]
    assert (first.text, second.text) == ("enough", "enough")
    assert len(children) == 40  # 8 + 8 + 4 per top-level execution
    refused = [
        m.content
        for m in model.requests[-1].messages
        if isinstance(m, ToolResultMessage) and m.is_error
    ]
    assert len(refused) == 4
    assert all(
        "agents limit of 20 reached: the runtime's default cap on the agents under one "
        "top-level execution; raise it or remove it with Runtime(caps=Caps(agents=...))" in text
        for text in refused
    )


# -- an estimate is never impossible usage ---------------------------------------------


def _no_usage(text: str, streamed: bool) -> Reply:
    """A chat completion with ``text`` cut at its cap and no usage at all (a local
    server), streamed (a server that ignores ``stream_options``) or in one piece (one
    that ignores ``"stream": true`` too)."""
    if not streamed:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        return json_reply({"object": "chat.completion", "model": "local", "choices": [choice]})
    chunk = {"object": "chat.completion.chunk", "model": "local"}
    pieces = [text[i : i + 100] for i in range(0, len(text), 100)]
    events = [{**chunk, "choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    return sse_reply(events, done=True)


@pytest.mark.parametrize("streamed", [False, True], ids=["one-piece", "streamed"])
async def test_a_dense_reply_without_usage_is_estimated_within_its_cap(
    server: LoopbackServer, streamed: bool
) -> None:
    """A server that sends no usage: the output is estimated (a token per four
    characters), and for text of more characters a token that estimate may pass the
    request's cap. It is an estimate, not a report: clamped to the cap, never
    "impossible usage"."""
    dense = " ".join(str(i % 10) for i in range(400))  # 799 characters: "200 tokens"
    server.queue(_no_usage(dense, streamed))
    model = OpenAIModel("local", base_url=f"{server.url}/v1", api_key="sk-test", timeout=5.0)
    agent = Agent("counter", model, max_tokens=50)
    async with model, Runtime() as rt:
        with anyio.fail_after(10):
            result = await (await rt.spawn(agent)).ask("Count.", budget=Budget(tokens=10_000))
    assert result.status == "completed", result.stop_reason
    assert result.text == dense
    assert result.usage.requests == 1
    assert result.usage.output_tokens == 50  # the cap, not 200
    assert server.requests[0].json()["max_tokens"] == 50


# -- a model that sends several requests in one call never passes a requests limit -----


class SelfRetrying:
    """A model that sends several requests for one (a retry loop of its own) and
    says so in its usage, as the ``Model`` protocol asks."""

    name = "self-retrying"

    def __init__(self, sent: int) -> None:
        self.sent = sent
        self.calls = 0

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        usage = Usage(input_tokens=10, output_tokens=5, requests=self.sent)
        return ModelResponse(text="done", usage=usage, model=self.name)

    def estimate_tokens(self, request: ModelRequest) -> int:
        return 10

    async def aclose(self) -> None:
        pass


class AroundReAct:
    """A user's model around a ``ReActModel``: it calls ``request`` directly, not
    ``request_via`` (so the agent does not see the adapter)."""

    name = "around-react"

    def __init__(self, react: ReActModel) -> None:
        self.react = react

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self.react.request(request)

    def estimate_tokens(self, request: ModelRequest) -> int:
        return self.react.estimate_tokens(request)

    async def aclose(self) -> None:
        await self.react.aclose()


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("where", ["ask", "runtime"])
async def test_requests_a_model_reports_never_pass_a_requests_limit(limit: int, where: str) -> None:
    model = SelfRetrying(sent=3)
    budget = Budget(requests=limit)
    async with Runtime(budget=budget if where == "runtime" else None) as rt:
        ref = await rt.spawn(Agent("a", model))
        result = await ref.ask("go", budget=budget if where == "ask" else None)
        root = rt.tree().node("root")
    assert result.status == "budget_exceeded"
    assert result.stop_reason.startswith(
        f"requests limit of {limit} reached: the model reported 3 requests for one call, "
        f"{3 - limit} more than the budget had room for"
    ), result.stop_reason
    assert result.usage.requests == limit
    assert root.usage.requests == limit
    assert model.calls == 1


async def test_requests_a_model_reports_are_all_counted_within_the_limit() -> None:
    model = SelfRetrying(sent=3)
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model))
        free = await ref.ask("go")
        room = await ref.ask("go", budget=Budget(requests=3))
    assert (free.status, free.usage.requests) == ("completed", 3)
    assert (room.status, room.usage.requests) == ("completed", 3), room.stop_reason


async def test_a_react_model_inside_another_models_request_has_each_request_admitted() -> None:
    """A wrapper that calls ``ReActModel.request`` directly: each inner request after
    the first is admitted by the agent's supervisor before it is sent, so the
    correction that a budget of one request has no room for is never sent."""
    inner = ScriptedModel(
        [reply("not json at all"), reply('{"thought": "ok", "final": "fine"}')], name="inner"
    )
    agent = Agent("a", AroundReAct(ReActModel(inner)), tools=[lookup])
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go", budget=Budget(requests=1))
    assert result.status == "budget_exceeded"
    assert result.stop_reason.startswith("requests limit of 1 reached"), result.stop_reason
    assert result.usage.requests == 1
    assert len(inner.requests) == 1  # the correction was refused before it was sent
    # The malformed reply is charged what it reported, not only the input estimate.
    assert result.usage.output_tokens == 4
    assert result.usage.input_tokens == inner.estimate_tokens(inner.requests[0])


@pytest.mark.parametrize("budget", [None, Budget(requests=2)], ids=["no-budget", "room"])
async def test_a_react_model_inside_another_model_is_charged_each_request_once(
    budget: Budget | None,
) -> None:
    inner = ScriptedModel(
        [reply("not json at all"), reply('{"thought": "ok", "final": "fine"}')], name="inner"
    )
    agent = Agent("a", AroundReAct(ReActModel(inner)), tools=[lookup])
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go", budget=budget)
        root = rt.tree().node("root")
    assert (result.status, result.text) == ("completed", "fine"), result.stop_reason
    assert result.usage.requests == root.usage.requests == 2
    assert len(inner.requests) == 2
