"""The isolation layers a freshly forked child puts on itself before it reads any code.

Order matters: everything that needs privilege (opening the Landlock paths, changing uid) comes
first; then no_new_privs, Landlock and seccomp, after which the child can only lose rights."""

from __future__ import annotations

import ctypes
import fcntl
import io
import math
import os
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass

from tool_sandbox.sandbox import landlock, seccomp

REQUEST_FD = 3
CONTROL_FD = 4
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Layers:
    """What the worker decided once for all its children."""

    uid: int | None  # None: keep the worker's uid (the server does not run as root)
    gid: int | None
    landlock_abi: int  # 0: Landlock unavailable
    read_only_paths: tuple[str, ...]
    static_bpf: bytes
    worker_pid: int


@dataclass(frozen=True)
class Limits:
    """Per-call resource limits, applied after the code arrives."""

    timeout_seconds: float
    memory_mib: int
    file_size_mib: int
    open_files: int
    processes: int


def enter(layers: Layers, workdir: str, fds: tuple[int, int, int, int]) -> int:
    """Isolate the calling (just forked) process; returns its address-space size in bytes.

    `fds` are the request pipe (read), stdout, stderr and control pipe (write) ends; they end
    up as fds 3, 1, 2 and 4, and every other inherited descriptor is closed."""
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    _arrange_fds(fds)
    os.chdir(workdir)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    vm_bytes = _vm_size()
    rules = None
    if layers.landlock_abi:
        rules = landlock.ruleset(layers.read_only_paths, (workdir,), layers.landlock_abi)
    if layers.uid is not None:
        os.setgroups([])
        os.setresgid(layers.gid, layers.gid, layers.gid)
        os.setresuid(layers.uid, layers.uid, layers.uid)
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != layers.worker_pid:
        os._exit(1)  # the worker died while we were forking
    seccomp.no_new_privs()
    if rules is not None:
        landlock.enforce(rules)
    seccomp.install(layers.static_bpf)
    seccomp.install(seccomp.self_only_filter(os.getpid()))
    _scrub_environment(workdir)
    return vm_bytes


def apply_limits(limits: Limits, vm_bytes: int) -> None:
    """Set hard and soft rlimits for one call; memory counts on top of the inherited image."""
    cpu = math.ceil(limits.timeout_seconds) + 1
    for kind, value in (
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, vm_bytes + (limits.memory_mib << 20)),
        (resource.RLIMIT_FSIZE, limits.file_size_mib << 20),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes),
    ):
        hard = value + 1 if kind == resource.RLIMIT_CPU else value
        resource.setrlimit(kind, (value, hard))


def _arrange_fds(fds: tuple[int, int, int, int]) -> None:
    # Copies above the target numbers first, so no dup2 overwrites a source still needed.
    request, stdout, stderr, control = (fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds)
    devnull = fcntl.fcntl(os.open(os.devnull, os.O_RDWR), fcntl.F_DUPFD, 64)
    for src, dst in ((devnull, 0), (stdout, 1), (stderr, 2), (request, REQUEST_FD), (control, CONTROL_FD)):
        os.dup2(src, dst)
    os.closerange(CONTROL_FD + 1, os.sysconf("SC_OPEN_MAX"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )


def _vm_size() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _scrub_environment(workdir: str) -> None:
    os.environ.clear()
    os.environ.update(
        {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    )
    tempfile.tempdir = workdir
