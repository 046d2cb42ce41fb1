"""multiprocessing's locks for sandboxed code, made of threading primitives.

Every lock, semaphore, condition, event, queue and `multiprocessing.pool.ThreadPool` of
`multiprocessing` is built on `_multiprocessing.SemLock`, a POSIX named semaphore: `sem_open`
creates a file in /dev/shm. A sandboxed child may not (Landlock grants it its own directory only,
and /dev/shm would be state outliving the call, shared by every call of the uid) and cannot make
another process either (seccomp denies fork and execve), so a process-shared semaphore has
nobody to share with. `install` replaces `_multiprocessing.SemLock` with `ThreadSemLock`: the same
interface and errors (multiprocessing/synchronize.py is its only user), shared between the
threads of one process, which is all a child has."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

RECURSIVE_MUTEX, SEMAPHORE = 0, 1  # multiprocessing.synchronize's kinds
SEM_VALUE_MAX = 2**31 - 1  # Linux's SEM_VALUE_MAX, as _multiprocessing.SemLock.SEM_VALUE_MAX
_handles = itertools.count(1)


class ThreadSemLock:
    """`_multiprocessing.SemLock` for the threads of one process."""

    SEM_VALUE_MAX = SEM_VALUE_MAX

    def __init__(self, kind: int, value: int, maxvalue: int, name: str, unlink: bool) -> None:
        if kind not in (RECURSIVE_MUTEX, SEMAPHORE):
            raise ValueError("unrecognized kind")
        if value < 0 or value > SEM_VALUE_MAX:
            raise ValueError("invalid value")
        self.kind = kind
        self.maxvalue = maxvalue
        self.name = None if unlink else name
        self.handle = next(_handles)
        self._value = value
        self._owner: int | None = None  # the thread holding a recursive mutex
        self._count_held = 0  # acquisitions minus releases in this process (the C one's `count`)
        self._changed = threading.Condition(threading.Lock())

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        me = threading.get_ident()
        if self.kind == RECURSIVE_MUTEX and self._count_held > 0 and self._owner == me:
            self._count_held += 1
            return True
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._changed:
            while self._value == 0:
                if not block:
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            self._value -= 1
            self._owner = me
            self._count_held += 1
        return True

    def release(self) -> None:
        if self.kind == RECURSIVE_MUTEX:
            if self._count_held == 0 or self._owner != threading.get_ident():
                raise AssertionError("attempt to release recursive lock not owned by thread")
            if self._count_held > 1:
                self._count_held -= 1
                return
        with self._changed:
            if self.kind == SEMAPHORE and self._value >= self.maxvalue:
                raise ValueError("semaphore or lock released too many times")
            self._value += 1
            self._count_held -= 1  # as the C one: a semaphore released by another thread goes below 0
            self._changed.notify()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _count(self) -> int:
        return self._count_held

    def _is_mine(self) -> bool:
        return self._count_held > 0 and self._owner == threading.get_ident()

    def _get_value(self) -> int:
        return self._value

    def _is_zero(self) -> bool:
        return self._value == 0

    def _after_fork(self) -> None:
        self._count_held = 0

    @classmethod
    def _rebuild(cls, *state: Any) -> ThreadSemLock:
        raise OSError("a sandboxed program's locks cannot be shared with another process")


def _no_unlink(name: str) -> None:
    """sem_unlink: these locks have no name in the file system."""


def install() -> None:
    """Make multiprocessing build its locks on ThreadSemLock (before or after it is imported:
    multiprocessing.synchronize looks `_multiprocessing.SemLock` up at each lock's creation)."""
    import _multiprocessing

    _multiprocessing.SemLock = ThreadSemLock  # type: ignore[attr-defined,misc]
    _multiprocessing.sem_unlink = _no_unlink  # type: ignore[attr-defined]
