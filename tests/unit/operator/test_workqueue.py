"""The work queue: one entry per key, one worker per key, nothing lost, backoff on failure."""

from __future__ import annotations

import asyncio

from toolrl_operator.workqueue import WorkQueue


async def test_a_key_added_many_times_is_queued_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert [await queue.get(), await queue.get()] == ["a", "b"]


async def test_a_key_being_processed_is_not_handed_out_again_but_processed_after() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add("a")  # an event while a worker syncs it
    assert len(queue) == 0, "a second worker must not get it"
    queue.done(key)
    assert len(queue) == 1, "the event is not lost"
    assert await asyncio.wait_for(queue.get(), 1) == "a"


async def test_retries_back_off_exponentially_and_success_resets() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
    assert [queue.retry("a") for _ in range(4)] == [0.01, 0.02, 0.04, 0.04]
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    queue.done("a")
    queue.succeeded("a")
    assert queue.retry("a") == 0.01


async def test_a_forgotten_key_does_not_come_back() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01)
    queue.retry("a")
    queue.forget("a")
    await asyncio.sleep(0.05)
    assert len(queue) == 0
