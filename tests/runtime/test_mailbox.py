"""The bounded mailbox: ordering, backpressure, statistics."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.abc import TaskStatus
from anyio.lowlevel import checkpoint

from fractor.runtime import MailboxFull, Runtime
from fractor.runtime._mailbox import Mailbox
from fractor.runtime._messages import Envelope

from .helpers import Gate, Recorder


async def test_per_sender_order_is_kept_with_many_senders() -> None:
    senders, per_sender = 5, 40
    async with Runtime() as rt:
        recorder = Recorder()
        ref = await rt.spawn(recorder, mailbox_size=4)

        async def send_all(sender: int) -> None:
            for seq in range(per_sender):
                await ref.tell((sender, seq))
                if seq % 7 == 0:
                    await checkpoint()

        async with anyio.create_task_group() as tg:
            for sender in range(senders):
                tg.start_soon(send_all, sender)
        seen = await ref.ask("dump")
    assert len(seen) == senders * per_sender
    for sender in range(senders):
        assert [seq for s, seq in seen if s == sender] == list(range(per_sender))
    # Interleaving happened: the senders did not simply run one after another.
    assert [s for s, _ in seen[:per_sender]] != [seen[0][0]] * per_sender


async def test_full_mailbox_blocks_tell_and_tell_nowait_raises() -> None:
    async with Runtime() as rt:
        gate = Gate()
        ref = await rt.spawn(gate, mailbox_size=2)
        await ref.tell("first")  # taken by the handler, which now blocks
        await gate.entered.wait()
        await ref.tell("queued-1")
        await ref.tell("queued-2")
        assert ref.statistics().queued == 2
        with pytest.raises(MailboxFull, match="is full \\(2 messages queued\\)"):
            ref.tell_nowait("overflow")
        with pytest.raises(MailboxFull):
            ref.ask_nowait("overflow")

        sent = anyio.Event()

        async def blocked_sender(*, task_status: TaskStatus[None]) -> None:
            task_status.started()
            await ref.tell("waits-for-room")
            sent.set()

        async with anyio.create_task_group() as tg:
            await tg.start(blocked_sender)
            await wait_all_tasks_blocked()
            assert not sent.is_set(), "tell went through a full mailbox"
            stats = ref.statistics()
            assert (stats.queued, stats.waiting_senders) == (2, 1)
            gate.release.set()
        assert sent.is_set()
        assert await ref.ask("sync") == "sync"  # everything before it was handled
        stats = ref.statistics()
        assert (stats.queued, stats.waiting_senders, stats.handled) == (0, 0, 5)


async def test_mailbox_statistics_count_handled_and_failed() -> None:
    from .helpers import Faulty

    async with Runtime() as rt:
        ref = await rt.spawn(Faulty())
        for i in range(3):
            assert await ref.ask(i) == i
        with pytest.raises(ValueError, match="boom"):
            await ref.ask("boom")
        stats = ref.statistics()
        assert (stats.handled, stats.failed, stats.queued, stats.closed) == (3, 1, 0, False)
        with pytest.raises(AttributeError):
            stats.handled = 10  # type: ignore[misc]


def test_mailbox_rejects_bad_capacity() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="at least 1"):
            Mailbox("x", bad)  # type: ignore[arg-type]


async def test_closed_mailbox_keeps_queued_messages_and_refuses_new() -> None:
    box = Mailbox("m", 4)
    box.send_nowait(Envelope(message=1))
    box.send_nowait(Envelope(message=2))
    box.close("stopped")
    from fractor.runtime import ActorStopped

    with pytest.raises(ActorStopped, match="'m' is stopped \\(stopped\\)"):
        box.send_nowait(Envelope(message=3))
    first = await box.receive()
    second = await box.receive()
    assert first is not None
    assert second is not None
    assert (first.message, second.message) == (1, 2)
    assert await box.receive() is None
    assert box.discard() == []


async def test_cancelled_waiting_sender_passes_its_turn_and_nothing_is_lost() -> None:
    box = Mailbox("m", 1)
    box.send_nowait(Envelope(message="first"))
    delivered: list[str] = []
    doomed = anyio.CancelScope()

    async def sender(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            await box.send(Envelope(message=name))
            delivered.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sender, "a", doomed)
        await wait_all_tasks_blocked()
        tg.start_soon(sender, "b", anyio.CancelScope())
        await wait_all_tasks_blocked()
        assert box.statistics().waiting_senders == 2
        # Cancel "a", then take a message before "a" runs (the take wakes "a", first
        # in line): the freed slot must go to "b", which would otherwise wait forever.
        doomed.cancel()
        taken = box.receive_nowait()
        with anyio.fail_after(1):
            while not delivered:
                await checkpoint()
    assert taken is not None
    assert taken.message == "first"
    assert delivered == ["b"]
    last = box.receive_nowait()
    assert last is not None
    assert last.message == "b"
    assert box.statistics().waiting_senders == 0


async def test_closing_wakes_waiting_senders_with_actor_stopped() -> None:
    from fractor.runtime import ActorStopped

    box = Mailbox("m", 1)
    box.send_nowait(Envelope(message=0))
    errors: list[BaseException] = []

    async def sender() -> None:
        try:
            await box.send(Envelope(message=1))
        except ActorStopped as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(sender)
        await wait_all_tasks_blocked()
        box.close("stopped")
    assert len(errors) == 3
    assert len(box) == 1  # what was queued before the close stays


async def test_long_queue_keeps_fifo_order_across_compactions() -> None:
    box = Mailbox("m", 500)
    taken: list[int] = []
    sent = 0
    # Keep the queue from ever emptying so the list is compacted, not cleared.
    for _ in range(40):
        for _ in range(25):
            box.send_nowait(Envelope(message=sent))
            sent += 1
        for _ in range(20):
            envelope = await box.receive()
            assert envelope is not None
            taken.append(envelope.message)
    assert len(box) == sent - len(taken)
    assert len(box._queue) < 2 * 500  # compacted: taken slots are not kept forever
    box.close("stopped")
    while (envelope := await box.receive()) is not None:
        taken.append(envelope.message)
    assert taken == list(range(sent))


async def test_busy_actor_lets_others_run_and_sees_its_cancellation() -> None:
    """Queued messages are taken without waiting, with a checkpoint every few."""
    handled = 0

    class Busy(Recorder):
        async def receive(self, message: object) -> None:  # never awaits
            nonlocal handled
            handled += 1

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await checkpoint()

    async with Runtime() as rt, anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        ref = await rt.spawn(Busy(), mailbox_size=1_000)
        for i in range(1_000):
            ref.tell_nowait(i)
        before = ticks
        await ref.stop()
        assert handled == 1_000
        assert ticks - before >= 1_000 // 16 - 2  # the ticker ran while it drained
        tg.cancel_scope.cancel()
