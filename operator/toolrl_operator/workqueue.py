"""A work queue of job keys with client-go's semantics, for one asyncio loop.

A key is queued once however often it is added (events of a job and of its children fold into
one sync); a key being processed is never handed to a second worker (syncs of one job are
serialized); a key added while it is processed is processed again once it is done (no event is
lost). Failed keys come back after an exponential backoff (controller-runtime's rate limiter).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, base_delay: float = 1.0, max_delay: float = 300.0) -> None:
        self.base_delay, self.max_delay = base_delay, max_delay
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: K) -> None:
        """Queue `key` now (a pending delayed add of it is then moot)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._queued:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        self._queued.add(key)
        self._ready.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` in `delay` seconds, unless it is queued sooner."""
        if key in self._queued or key in self._timers:
            return
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: K) -> float:
        """Queue `key` again after its next backoff (1 s, 2 s, 4 s ... up to `max_delay`); the delay."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = min(self.base_delay * 2.0 ** (failures - 1), self.max_delay)
        self.add_after(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def succeeded(self, key: K) -> None:
        """`key` synced: its backoff starts over."""
        self._failures.pop(key, None)

    def forget(self, key: K) -> None:
        """`key` is gone (its job was deleted): drop its backoff and any delayed add."""
        self._failures.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def get(self) -> K:
        """The next key to process; call done(key) after."""
        key = await self._ready.get()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
