"""Reaping orphans: the server is pid 1 in its container, so every process orphaned below it
(a worker's forker and children once the worker died) becomes its child. asyncio waits only for
the workers it started; without this, the rest stay zombies until the pod's pids limit stops
restarts. The server also makes itself a child subreaper, so it is the same outside a container."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection

PR_SET_CHILD_SUBREAPER = 36


def zombie_children(parent: int) -> list[int]:
    """Pids of `parent`'s children that have exited and wait to be reaped."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat", "rb") as stat:
                state, ppid = stat.read().rsplit(b")", 1)[1].split()[:2]
            if state == b"Z" and int(ppid) == parent:
                found.append(int(entry))
    return found


def reap_orphans(own: Collection[int]) -> int:
    """Reap zombie children other than `own` (the processes asyncio waits for); how many."""
    reaped = 0
    for pid in zombie_children(os.getpid()):
        if pid in own:
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
            reaped += 1
    return reaped
