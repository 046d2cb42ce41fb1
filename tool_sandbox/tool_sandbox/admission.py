"""Backpressure: at most `capacity` calls execute, at most `queue_size` wait; the rest are
rejected at once (429 + Retry-After) instead of piling up in memory."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator


class Rejected(Exception):
    """The queue is full (429), or the server is shutting down (503); retry after `retry_after` seconds."""

    def __init__(self, retry_after: int, message: str = "", status: int = 429) -> None:
        super().__init__(message or f"tool pool at capacity; retry after {retry_after}s")
        self.retry_after = retry_after
        self.status = status


class Admission:
    def __init__(self, capacity: int, queue_size: int) -> None:
        self.capacity = capacity
        self.queue_size = queue_size
        self.inflight = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(capacity)
        self._mean_seconds = 0.05

    def retry_after(self) -> int:
        """Seconds until the queue has probably drained, at least 1."""
        return max(1, math.ceil(self._mean_seconds * (self.waiting + 1) / self.capacity))

    @contextlib.asynccontextmanager
    async def free_slot(self) -> AsyncIterator[bool]:
        """A slot only if one is free now (no call waits): True inside it, else False at once."""
        if self._slots.locked() or self.waiting:
            yield False
            return
        async with self.slot():
            yield True

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._slots.locked() and self.waiting >= self.queue_size:
            raise Rejected(self.retry_after())
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.inflight += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            yield
        finally:
            self.inflight -= 1
            self._slots.release()
            self._mean_seconds = 0.9 * self._mean_seconds + 0.1 * (loop.time() - started)
