"""The isolation layers of a sandboxed child, prepared once per worker.

A child isolates itself right after fork, in C (_spawner.c): its own session, descriptors and
working directory; no core dumps; then what needs privilege (a per-slot uid, no supplementary
groups) first, then no_new_privs, Landlock and the two seccomp filters, after which it can only
lose rights; all other descriptors closed. Everything that can be is prepared here, before fork:
a forked child pays a page copy for every page it touches. Per-call limits come with the code."""

from __future__ import annotations

import io
import math
import resource
import sys
from dataclasses import dataclass

from tool_sandbox.sandbox import landlock, seccomp

REQUEST_FD = 3
CONTROL_FD = 4


@dataclass(frozen=True)
class Layers:
    """What the worker prepared once for all its children, as the C side takes it."""

    landlock: landlock.Prepared | None  # None: Landlock unavailable or disabled
    static_filter: bytes  # BPF program
    self_only_filter: bytes  # BPF program with seccomp.SELF / seccomp.GROUP placeholders

    def spawner_args(self) -> tuple[bytes, bytes, int, int, bytes, bytes, int, int]:
        """The arguments of _spawner.serve after the socket and the slot count."""
        rules = self.landlock
        return (
            self.static_filter,
            self.self_only_filter,
            seccomp.SELF,
            seccomp.GROUP,
            rules.attr if rules else b"",
            rules.rules if rules else b"",
            rules.own_rights if rules else 0,
            _numpy_random_state(),
        )


def _numpy_random_state() -> int:
    """Address of numpy's global MT19937 state, which each child rekeys (0: numpy not loaded)."""
    numpy_random = sys.modules.get("numpy.random")
    return numpy_random.get_bit_generator().ctypes.state_address if numpy_random else 0


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
