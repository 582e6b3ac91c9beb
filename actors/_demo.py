"""``fractor demo``: the kernel at work, on embedded defaults.

A dispatcher actor hands jobs to worker actors over their bounded mailboxes; each
worker answers every job, one failing job shows an error becoming a value at the
actor boundary, and the runtime's statistics are printed at the end.
"""

from __future__ import annotations

import msgspec

from runtime import Actor, ActorRef, Runtime

__all__ = ["run_kernel_demo"]


class Job(msgspec.Struct, frozen=True, kw_only=True):
    number: int


class Done(msgspec.Struct, frozen=True, kw_only=True):
    number: int
    square: int
    worker: str


class Worker(Actor):
    accepts = (Job,)

    async def receive(self, message: Job) -> Done:
        if message.number == 13:
            raise ValueError("13 is unlucky: this job fails on purpose")
        return Done(number=message.number, square=message.number**2, worker=self.context.id)


async def run_kernel_demo(workers: int, jobs: int) -> None:
    async with Runtime() as rt:
        pool: list[ActorRef] = [await rt.spawn(Worker(), name="worker") for _ in range(workers)]
        print(f"spawned {len(pool)} workers: {', '.join(ref.id for ref in pool)}")
        total = 0
        failures: list[str] = []
        step = max(1, jobs // 4)
        for number in range(jobs):
            worker = pool[number % len(pool)]
            try:
                done: Done = await worker.ask(Job(number=number))
            except ValueError as exc:
                failures.append(f"job {number} on {worker.id}: {exc}")
                continue
            total += done.square
            if (number + 1) % step == 0:
                print(f"  {number + 1}/{jobs} jobs answered")
        for failure in failures:
            print(f"  failed as a value: {failure}")
        stats = rt.statistics()
        print(f"sum of squares: {total}")
        print(
            f"runtime: {stats.live_actors} live actors, {stats.handled} messages handled, "
            f"{stats.failed} failed"
        )
    print(f"after the runtime: {rt.statistics().live_actors} live actors")
