"""The Runtime: spawning, structured shutdown, cancellation, statistics."""

from __future__ import annotations

import math
from typing import Any

import anyio
import msgspec
import pytest
from anyio import wait_all_tasks_blocked

from fractor.runtime import (
    Actor,
    ActorRef,
    ActorStopped,
    DuplicateActor,
    Runtime,
    RuntimeClosed,
    TreeSnapshot,
)

from .helpers import Gate, Recorder, Sleeper


def task_count() -> int:
    return len(anyio.get_running_tasks())


class SlowStarter(Actor):
    def __init__(self) -> None:
        self.ready = False

    async def on_start(self) -> None:
        await anyio.sleep(0.01)
        self.ready = True

    async def receive(self, message: Any) -> Any:
        return self.ready


class Parent(Actor):
    """Spawns ``n`` sleeping children on its first message."""

    def __init__(self) -> None:
        self.children: list[ActorRef] = []
        self.sleepers: list[Sleeper] = []

    async def receive(self, message: Any) -> Any:
        for _ in range(message):
            sleeper = Sleeper()
            self.sleepers.append(sleeper)
            child = await self.context.spawn(sleeper, name="child")
            self.children.append(child)
        return [child.id for child in self.children]


async def test_spawn_returns_only_once_the_actor_is_ready() -> None:
    async with Runtime() as rt:
        actor = SlowStarter()
        ref = await rt.spawn(actor)
        assert actor.ready
        assert await ref.ask("ready?") is True


async def test_failing_on_start_fails_the_spawn() -> None:
    class Broken(Actor):
        async def on_start(self) -> None:
            raise OSError("no such resource")

    async with Runtime() as rt:
        with pytest.raises(OSError, match="no such resource"):
            await rt.spawn(Broken())
        assert rt.statistics().live_actors == 0


async def test_no_task_outlives_the_runtime() -> None:
    before = task_count()
    async with Runtime(grace=0.05) as rt:
        sleepers = [Sleeper() for _ in range(5)]
        refs = [await rt.spawn(s) for s in sleepers]
        for ref in refs:
            await ref.tell("sleep")
        parent_actor = Parent()
        parent = await rt.spawn(parent_actor)
        await parent.ask(3)
        for s in sleepers:
            await s.entered.wait()
        assert task_count() >= before + 5 + 1 + 3
    assert task_count() == before
    assert rt.statistics().live_actors == 0
    assert all(ref.stopped for ref in refs)
    assert all(child.stopped for child in parent_actor.children)


async def test_leaving_the_block_drains_queued_messages_within_grace() -> None:
    recorder = Recorder()
    async with Runtime(grace=5) as rt:
        ref = await rt.spawn(recorder, mailbox_size=100)
        for i in range(50):
            ref.tell_nowait(i)
    assert recorder.seen == list(range(50))


async def test_cancelling_the_whole_runtime_from_outside() -> None:
    before = task_count()
    outcome: list[BaseException] = []
    with anyio.CancelScope() as outer:
        async with Runtime() as rt:
            sleeper = Sleeper()
            ref = await rt.spawn(sleeper)

            async def asker() -> None:
                try:
                    await ref.ask("forever")
                except BaseException as exc:
                    outcome.append(exc)
                    raise

            rt_task_group = anyio.create_task_group()
            async with rt_task_group:
                rt_task_group.start_soon(asker)
                await sleeper.entered.wait()
                await wait_all_tasks_blocked()
                outer.cancel()
            pytest.fail("cancellation was swallowed")  # pragma: no cover
    assert outer.cancelled_caught
    assert task_count() == before
    assert ref.stopped
    assert len(outcome) == 1
    assert isinstance(outcome[0], anyio.get_cancelled_exc_class())


async def test_exception_in_the_body_cancels_actors_at_once() -> None:
    sleeper = Sleeper()
    refs = []

    async def body() -> None:
        async with Runtime(grace=60) as rt:
            ref = await rt.spawn(sleeper)
            refs.append(ref)
            await ref.tell("sleep")
            await sleeper.entered.wait()
            raise ZeroDivisionError("from the body")

    with anyio.fail_after(5), pytest.raises(ZeroDivisionError, match="from the body"):
        await body()
    assert refs[0].stopped


async def test_children_stop_when_their_parent_stops() -> None:
    async with Runtime() as rt:
        parent_actor = Parent()
        parent = await rt.spawn(parent_actor)
        ids = await parent.ask(4)
        assert len(ids) == 4
        assert rt.statistics().live_actors == 5
        for sleeper, child in zip(parent_actor.sleepers, parent_actor.children, strict=True):
            await child.tell("sleep")
            await sleeper.entered.wait()
        parent.cancel()
        await parent.wait_stopped()
        for child in parent_actor.children:
            await child.wait_stopped()
            with pytest.raises(ActorStopped):
                await child.ask("x")
        assert rt.statistics().live_actors == 0


async def test_spawn_outside_the_block_is_a_clear_error() -> None:
    rt = Runtime()
    with pytest.raises(RuntimeClosed, match="not started"):
        await rt.spawn(Recorder())
    async with rt:
        pass
    with pytest.raises(RuntimeClosed, match="closed"):
        await rt.spawn(Recorder())
    with pytest.raises(RuntimeClosed):
        async with rt:
            pass  # pragma: no cover


async def test_ids_are_unique_and_checked() -> None:
    async with Runtime() as rt:
        a = await rt.spawn(Recorder(), id="alpha")
        assert a.id == "alpha"
        assert rt.ref("alpha") == a
        with pytest.raises(DuplicateActor, match="'alpha' is already running"):
            await rt.spawn(Recorder(), id="alpha")
        with pytest.raises(ValueError, match="non-empty string"):
            await rt.spawn(Recorder(), id="")
        b = await rt.spawn(Recorder(), name="rec")
        c = await rt.spawn(Recorder(), name="rec")
        assert b.id != c.id
        assert b.id.startswith("rec-")
        with pytest.raises(KeyError, match="no live actor"):
            rt.ref("nobody")


async def test_the_runtime_knows_which_ids_it_made_up_and_skips_those_given() -> None:
    """An id given at spawn is ``named`` whatever its shape, and the runtime's own
    ``name-N`` ids go past a live one given in that shape instead of colliding."""
    async with Runtime() as rt:
        given = [Recorder(), Recorder()]
        await rt.spawn(given[0], id="rec-1")
        await rt.spawn(given[1], id="rec-2")
        made = Recorder()
        ref = await rt.spawn(made, name="rec")
    assert ref.id not in ("rec-1", "rec-2")
    assert ref.id.startswith("rec-")
    assert [actor.context.named for actor in given] == [True, True]
    assert not made.context.named


async def test_the_trees_root_is_the_runtime_idle_when_nothing_runs_under_it() -> None:
    """The root of ``rt.tree()`` is the runtime itself, which never ends: ``idle`` with
    no execution under it, ``running`` while one runs, ``idle`` again once every one
    has ended (each keeping its own end status); a snapshot round-trips as it is."""
    async with Runtime() as rt:
        supervisor = rt.supervisor
        before = rt.tree()
        first = supervisor.open(supervisor.root, name="job", limits=None)
        second = supervisor.open(supervisor.root, name="job", limits=None)
        running = rt.tree()
        supervisor.close(first, "completed")
        one_left = rt.tree()
        supervisor.close(second, "failed", "no")
        after = rt.tree()
    assert before.node("root").status == "idle"
    assert running.node("root").status == "running"
    assert one_left.node("root").status == "running"
    assert after.node("root").status == "idle"
    assert [after.node(n.id).status for n in (first, second)] == ["completed", "failed"]
    for codec in (msgspec.json, msgspec.msgpack):
        assert codec.decode(codec.encode(after), type=TreeSnapshot) == after


async def test_an_actor_instance_is_spawned_once() -> None:
    async with Runtime() as rt:
        actor = Recorder()
        await rt.spawn(actor)
        with pytest.raises(ValueError, match="already spawned"):
            await rt.spawn(actor)


async def test_runtime_statistics_snapshot() -> None:
    async with Runtime() as rt:
        gate = Gate()
        ref = await rt.spawn(gate)
        other = await rt.spawn(Recorder())
        await other.ask("a")
        reply = ref.ask_nowait("held")
        await gate.entered.wait()
        stats = rt.statistics()
        assert (stats.live_actors, stats.spawned, stats.handled, stats.pending_asks) == (2, 2, 1, 1)
        gate.release.set()
        await reply.wait()
        await other.stop()
        stats = rt.statistics()
        assert (stats.live_actors, stats.stopped, stats.handled, stats.pending_asks) == (1, 1, 2, 0)


def test_runtime_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="grace"):
        Runtime(grace=-1)
    with pytest.raises(ValueError, match="mailbox_size"):
        Runtime(mailbox_size=0)


class Scoped(Actor):
    """On ``n``, spawns ``n`` children with ``spawn_soon`` in a task group of its
    handler, asks each, and answers with their replies (or their errors)."""

    spawns_children = False  # spawn_soon needs no group of the actor's own

    def __init__(self, child: type[Actor]) -> None:
        self.child = child
        self.ids: list[str] = []

    async def receive(self, message: Any) -> Any:
        answers: list[object] = []
        async with anyio.create_task_group() as tg:
            replies = []
            for i in range(message):
                ref = self.context.spawn_soon(self.child(), task_group=tg, name="kid")
                self.ids.append(ref.id)
                replies.append(ref.ask_nowait(i))  # queued before the child starts
                ref.stop_nowait()  # its only message: it answers, then stops
            for reply in replies:
                try:
                    answers.append(await reply.wait())
                except ActorStopped as exc:
                    answers.append(exc)
        return answers


class Doubler(Actor):
    async def receive(self, message: Any) -> Any:
        await anyio.lowlevel.checkpoint()
        return message * 2


async def test_spawn_soon_children_answer_and_end_inside_the_handlers_block() -> None:
    async with Runtime() as rt:
        parent = Scoped(Doubler)
        ref = await rt.spawn(parent)
        assert await ref.ask(5) == [0, 2, 4, 6, 8]
        # Every child ended with the block that owned it: only the parent is live.
        assert rt.statistics().live_actors == 1
        assert len(set(parent.ids)) == 5
        for child_id in parent.ids:
            with pytest.raises(KeyError):
                rt.ref(child_id)


async def test_spawn_soon_child_failing_to_start_fails_its_asks_not_the_parent() -> None:
    class BrokenKid(Actor):
        async def on_start(self) -> None:
            raise OSError("no such resource")

    async with Runtime() as rt:
        ref = await rt.spawn(Scoped(BrokenKid))
        answers = await ref.ask(2)
        assert len(answers) == 2
        for answer in answers:
            assert isinstance(answer, ActorStopped)
            assert "failed to start: OSError('no such resource')" in str(answer)
        assert await ref.ask(0) == []  # the parent is fine
        assert rt.statistics().live_actors == 1


async def test_spawn_soon_children_are_cancelled_with_their_block() -> None:
    class Blocker(Actor):
        async def receive(self, message: Any) -> Any:
            await anyio.sleep_forever()

    async with Runtime() as rt:
        parent = Scoped(Blocker)
        ref = await rt.spawn(parent)
        errors: list[ActorStopped] = []

        async def ask() -> None:
            try:
                await ref.ask(3)
            except ActorStopped as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await wait_all_tasks_blocked()
            assert rt.statistics().live_actors == 4
            ref.cancel()  # one cancellation: the parent, its block and its children
        assert rt.statistics().live_actors == 0
        assert len(errors) == 1
        assert "cancelled" in str(errors[0])


class Blocking(Actor):
    """Sleeps forever on every message; stop and cancel are what end it."""

    async def receive(self, message: Any) -> Any:
        await anyio.sleep_forever()


class KeepsOne(Actor):
    """On a message, spawns one blocking child with ``spawn_soon``, asks it, and
    answers with what that ask ended with."""

    spawns_children = False

    def __init__(self) -> None:
        self.child: ActorRef | None = None
        self.started = anyio.Event()

    async def receive(self, message: Any) -> Any:
        async with anyio.create_task_group() as tg:
            self.child = self.context.spawn_soon(Blocking(), task_group=tg, name="kid")
            reply = self.child.ask_nowait(message)
            self.started.set()
            try:
                return await reply.wait()
            except ActorStopped as exc:
                return exc


@pytest.mark.parametrize("how", ["cancel", "grace"])
async def test_a_spawn_soon_child_can_be_cancelled_or_stopped_with_grace(how: str) -> None:
    async with Runtime() as rt:
        parent = KeepsOne()
        ref = await rt.spawn(parent)
        async with anyio.create_task_group() as tg:
            answers: list[object] = []

            async def ask() -> None:
                answers.append(await ref.ask("wait"))

            tg.start_soon(ask)
            await parent.started.wait()
            await wait_all_tasks_blocked()
            child = parent.child
            assert child is not None
            if how == "cancel":
                child.cancel()
            else:
                with anyio.fail_after(5):
                    await child.stop(grace=0.01)
        assert child is not None
        assert child.stopped
        (answer,) = answers
        assert isinstance(answer, ActorStopped)
        expected = "cancelled" if how == "cancel" else "cancelled after a 0.01 s grace"
        assert expected in str(answer)
        assert rt.statistics().live_actors == 1  # the parent goes on
        assert not ref.stopped


async def test_spawn_soon_refuses_a_closed_runtime_and_duplicate_ids() -> None:
    class Spawner(Actor):
        async def receive(self, message: Any) -> Any:
            async with anyio.create_task_group() as tg:
                self.context.spawn_soon(Doubler(), task_group=tg, id="same")
                with pytest.raises(DuplicateActor):
                    self.context.spawn_soon(Doubler(), task_group=tg, id="same")
                rt.ref("same").stop_nowait()
            return "ok"

    async with Runtime() as rt:
        assert await (await rt.spawn(Spawner())).ask(None) == "ok"
        grabbed = Spawner()
        await rt.spawn(grabbed)
    async with anyio.create_task_group() as tg:
        with pytest.raises(RuntimeClosed):
            grabbed.context.spawn_soon(Doubler(), task_group=tg)


@pytest.mark.parametrize("grace", [math.nan, math.inf, -1.0, "5", True])
def test_grace_must_be_a_finite_number_of_seconds(grace: object) -> None:
    with pytest.raises(ValueError, match="grace must be a finite number of seconds >= 0, got"):
        Runtime(grace=grace)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"mailbox_size": True}, ValueError, "mailbox_size must be a whole number >= 1"),
        ({"prices": 5}, TypeError, "prices must be a mapping of model names to fractor.Price"),
        ({"prices": {"m": 1.0}}, TypeError, "prices must map model names (str) to fractor.Price"),
        ({"store": "db.sqlite"}, TypeError, "store must implement fractor.Store"),
        ({"log_events": "yes"}, TypeError, "log_events must be a bool, got 'yes'"),
    ],
)
def test_runtime_refuses_options_of_the_wrong_kind(
    options: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as caught:
        Runtime(**options)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("spawnable", "options", "error", "fragment"),
    [
        (5, {}, TypeError, "spawn takes an Actor instance or a definition"),
        (Recorder, {}, TypeError, "got the class Recorder"),
        (None, {"name": 5}, ValueError, "actor name must be a non-empty string or None, got 5"),
        (None, {"name": ""}, ValueError, "actor name must be a non-empty string or None"),
        # A lone surrogate cannot be stored, logged as UTF-8 or sent to a host: refused
        # at the door, not deep in a store's SQL (UnicodeEncodeError).
        (None, {"id": "bad\udc80"}, ValueError, "actor id must encode as UTF-8"),
        (None, {"name": "bad\udc80"}, ValueError, "actor name must encode as UTF-8"),
        (None, {"mailbox_size": 0}, ValueError, "mailbox_size must be a whole number >= 1"),
        (None, {"mailbox_size": 1.5}, ValueError, "mailbox_size must be a whole number >= 1"),
    ],
)
async def test_spawn_refuses_bad_values_before_making_an_actor(
    spawnable: object, options: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    async with Runtime() as rt:
        with pytest.raises(error) as caught:
            await rt.spawn(spawnable if spawnable is not None else Recorder(), **options)  # type: ignore[arg-type]
        assert fragment in str(caught.value)
        assert rt.statistics().spawned == 0
