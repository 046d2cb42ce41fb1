"""What the sandbox refuses, said in the error a program gets (issue 35).

The kernel refuses (seccomp, EPERM) every change of permissions or ownership, on a call's own files too
(seccomp cannot see paths; in the pod every child shares the server's uid, so a chmod allowed on its own
files would be allowed on the worker's directories), and every new process. A plain
`PermissionError: [Errno 1] Operation not permitted` reads like a bug of the program; `install` makes
the same error say what the sandbox refuses, why, and what to use instead. It changes no behaviour: the
same calls run, fail with the same errno and type, and the kernel's filter is what refuses them."""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from typing import Any

PERMISSIONS = (
    "the sandbox refuses chmod and chown, on the call's own files too (it cannot tell them from other"
    " calls' files); shutil.copy and copy2 fail at this step: use shutil.copyfile"
)
PROCESSES = (
    "the sandbox refuses new processes (fork, exec, subprocess, multiprocessing.Pool); use threads:"
    " concurrent.futures.ThreadPoolExecutor or multiprocessing.pool.ThreadPool"
)


def _explained(function: Callable[..., Any], why: str) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except PermissionError as exc:
            if exc.errno != errno.EPERM:
                raise
            named = () if exc.filename is None else (exc.filename,)
            raise PermissionError(errno.EPERM, f"{exc.strerror}: {why}", *named) from None

    return call


def install() -> None:
    """Wrap the os functions the sandbox refuses (in the worker, before any child is forked)."""
    for name in ("chmod", "fchmod", "lchmod", "chown", "fchown", "lchown"):
        if hasattr(os, name):
            setattr(os, name, _explained(getattr(os, name), PERMISSIONS))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve"):
        if hasattr(os, name):
            setattr(os, name, _explained(getattr(os, name), PROCESSES))
    import subprocess

    subprocess._fork_exec = _explained(subprocess._fork_exec, PROCESSES)  # type: ignore[attr-defined]
