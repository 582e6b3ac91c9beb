"""Talking to actors: ask, tell, timeouts, failures, stopped actors."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from fractor.runtime import ActorStopped, AskTimeout, Runtime, UnknownMessage

from .helpers import Add, Counter, Faulty, Gate, Get, Sleeper, StopOnFailure


async def test_ask_returns_the_handlers_answer_and_state_is_private() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Counter())
        await ref.tell(Add(amount=2))
        assert await ref.ask(Add(amount=3)) == 5
        assert await ref.ask(Get()) == 5


async def test_ask_timeout_raises_ask_timeout_and_late_reply_is_dropped() -> None:
    async with Runtime() as rt:
        gate = Gate()
        ref = await rt.spawn(gate)
        with pytest.raises(AskTimeout, match=r"did not answer a str within 0\.05 s") as info:
            await ref.ask("slow", timeout=0.05)
        assert isinstance(info.value, TimeoutError)
        assert rt.statistics().pending_asks == 0
        gate.release.set()
        # The actor is still healthy and answers the next ask.
        assert await ref.ask("next", timeout=5) == "next"


async def test_raising_handler_fails_the_ask_with_that_error_and_actor_goes_on() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Faulty())
        with pytest.raises(ValueError, match="boom on purpose"):
            await ref.ask("boom")
        await ref.tell("boom")  # a failing tell is logged, not lost silently
        assert await ref.ask("still here") == "still here"
        assert ref.statistics().failed == 2


async def test_stop_policy_stops_the_actor_and_fails_queued_asks_once() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(StopOnFailure())
        first = ref.ask_nowait("boom")
        second = ref.ask_nowait("queued behind the failure")
        with pytest.raises(ValueError, match="boom"):
            await first.wait()
        with pytest.raises(ActorStopped, match="failed: ValueError") as info:
            await second.wait()
        assert info.value.actor_id == ref.id
        await ref.wait_stopped()
        assert ref.stopped
        with pytest.raises(ActorStopped):
            await ref.ask("after")


async def test_stopped_actor_fails_every_pending_ask_exactly_once() -> None:
    async with Runtime() as rt:
        sleeper = Sleeper()
        ref = await rt.spawn(sleeper, mailbox_size=16)
        outcomes: list[BaseException | object] = []

        async def ask_and_record(i: int) -> None:
            try:
                outcomes.append(await ref.ask(i))
            except ActorStopped as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(ask_and_record, i)
            await sleeper.entered.wait()
            await wait_all_tasks_blocked()
            assert rt.statistics().pending_asks == 10
            ref.cancel()
        assert len(outcomes) == 10
        assert all(isinstance(o, ActorStopped) for o in outcomes)
        assert all("cancelled" in str(o) for o in outcomes)
        assert rt.statistics().pending_asks == 0
        with pytest.raises(ActorStopped):
            await ref.tell("late")
        with pytest.raises(ActorStopped):
            ref.tell_nowait("late")


async def test_graceful_stop_handles_queued_messages_then_refuses_new() -> None:
    async with Runtime() as rt:
        gate = Gate()
        ref = await rt.spawn(gate)
        replies = [ref.ask_nowait(i) for i in range(3)]
        await gate.entered.wait()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.stop)
            await wait_all_tasks_blocked()
            with pytest.raises(ActorStopped):
                await ref.ask("refused")
            gate.release.set()
        assert [await r.wait() for r in replies] == [0, 1, 2]
        assert ref.stopped


async def test_stop_with_grace_cancels_a_stuck_handler() -> None:
    async with Runtime() as rt:
        sleeper = Sleeper()
        ref = await rt.spawn(sleeper)
        pending = ref.ask_nowait("stuck")
        await sleeper.entered.wait()
        with anyio.fail_after(5):
            await ref.stop(grace=0.01)
        with pytest.raises(ActorStopped, match=r"cancelled after a 0\.01 s grace"):
            await pending.wait()


async def test_unknown_message_type_is_refused_at_the_sender() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Counter())
        with pytest.raises(
            UnknownMessage, match="does not handle messages of type str; it accepts Add or Get"
        ):
            await ref.tell("not a counter message")
        with pytest.raises(TypeError):
            await ref.ask(42)
        assert ref.statistics().handled == 0


async def test_unknown_message_without_accepts_fails_the_ask() -> None:
    from fractor.runtime import Actor

    async with Runtime() as rt:
        ref = await rt.spawn(Actor())
        with pytest.raises(UnknownMessage, match="does not handle messages of type int"):
            await ref.ask(1)


async def test_pending_reply_result_before_and_after() -> None:
    async with Runtime() as rt:
        gate = Gate()
        ref = await rt.spawn(gate)
        reply = ref.ask_nowait("x")
        assert not reply.done()
        with pytest.raises(RuntimeError, match="no reply yet"):
            reply.result()
        gate.release.set()
        assert await reply.wait(timeout=5) == "x"
        assert reply.done()
        assert reply.result() == "x"


async def test_actor_cannot_await_its_own_stop_but_can_request_it() -> None:
    from typing import Any

    from fractor.runtime import Actor

    class SelfStopper(Actor):
        async def receive(self, message: Any) -> Any:
            if message == "await":
                await self.context.ref.stop()
            self.context.stop()
            return "bye"

    async with Runtime() as rt:
        ref = await rt.spawn(SelfStopper())
        with pytest.raises(RuntimeError, match="cannot await its own stop"):
            await ref.ask("await")
        assert await ref.ask("stop") == "bye"
        await ref.wait_stopped()
        assert ref.stopped


async def test_done_callback_runs_once_on_answer_error_or_at_once() -> None:
    from fractor.runtime import PendingReply

    seen: list[tuple[str, object]] = []

    def record(reply: PendingReply) -> None:
        try:
            seen.append(("value", reply.result()))
        except Exception as exc:
            seen.append(("error", type(exc).__name__))

    async with Runtime() as rt:
        ref = await rt.spawn(Faulty())
        answered = ref.ask_nowait("hi")
        answered.add_done_callback(record)
        assert seen == []  # not before the actor has answered
        assert await answered.wait() == "hi"
        failed = ref.ask_nowait("boom")
        failed.add_done_callback(record)
        with pytest.raises(ValueError, match="boom"):
            await failed.wait()
        answered.set_result("late")  # settled already: no second call
        late = ref.ask_nowait("again")
        await late.wait()
        late.add_done_callback(record)  # settled: called at once
        with pytest.raises(RuntimeError, match="already has a done callback"):
            late.add_done_callback(record)
    assert seen == [("value", "hi"), ("error", "ValueError"), ("value", "again")]


async def test_ask_refuses_a_timeout_that_is_no_number_before_sending() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Counter())
        with pytest.raises(ValueError, match="timeout must be a number of seconds or None"):
            await ref.ask(Add(amount=1), timeout=float("nan"))
        with pytest.raises(TypeError, match="timeout must be a number of seconds or None, got '1'"):
            await ref.ask(Add(amount=1), timeout="1")  # type: ignore[arg-type]
        assert await ref.ask(Get()) == 0  # neither was delivered
        assert rt.statistics().pending_asks == 0
