"""The isolation layers a freshly forked child puts on itself before it reads any code.

Order matters: what needs privilege (changing uid) comes first; then no_new_privs, Landlock and
seccomp, after which the child can only lose rights. Everything that can be is prepared by the
worker before fork: a forked child pays a page copy for every page it touches."""

from __future__ import annotations

import io
import math
import os
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass

from tool_sandbox.sandbox import landlock, seccomp
from tool_sandbox.sandbox.libc import PR_SET_PDEATHSIG, libc

REQUEST_FD = 3
CONTROL_FD = 4


@dataclass(frozen=True)
class Layers:
    """What the worker prepared once for all its children."""

    landlock: landlock.Prepared | None  # None: Landlock unavailable or disabled
    static_filter: seccomp.Program
    self_only_filter: seccomp.Program
    parent_pid: int  # the forker: a child whose parent is gone exits at once


@dataclass(frozen=True)
class Limits:
    """Per-call resource limits, applied after the code arrives."""

    timeout_seconds: float
    memory_mib: int
    file_size_mib: int
    open_files: int
    processes: int


def prepare_stdio() -> None:
    """Line-buffered text streams on fds 0-2, made in the worker so children inherit them:
    a child only swaps the descriptors underneath."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        setattr(sys, name, stream)


def enter(layers: Layers, workdir: str, uid: int | None, fds: tuple[int, int, int, int]) -> None:
    """Isolate the calling (just forked) process.

    `fds` are the request pipe (read), stdout, stderr and control pipe (write) ends, all above
    fd 4; they become fds 3, 1, 2 and 4, and every other inherited descriptor is closed."""
    os.setsid()
    request, stdout, stderr, control = fds
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.dup2(request, REQUEST_FD)
    os.dup2(control, CONTROL_FD)
    os.chdir(workdir)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != layers.parent_pid:
        os._exit(1)  # the forker died while we were forking
    seccomp.no_new_privs()
    if layers.landlock is not None:
        layers.landlock.enforce(os.open(".", os.O_PATH | os.O_CLOEXEC))
    layers.static_filter.install()
    layers.self_only_filter.install_for(os.getpid())
    os.closerange(CONTROL_FD + 1, os.sysconf("SC_OPEN_MAX"))
    os.environ["HOME"] = workdir
    os.environ["TMPDIR"] = workdir
    tempfile.tempdir = workdir


def apply_limits(limits: Limits, vm_bytes: int) -> None:
    """Set hard and soft rlimits for one call; memory counts on top of the inherited image and
    CPU seconds on top of what this (pre-forked) process used before the call."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(usage.ru_utime + usage.ru_stime + limits.timeout_seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = vm_bytes + (limits.memory_mib << 20)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_size_mib << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
