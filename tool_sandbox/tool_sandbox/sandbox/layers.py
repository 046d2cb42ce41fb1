"""The isolation layers of a sandboxed child, prepared once per worker.

A child isolates itself right after fork, in C (_spawner.c): its own session, descriptors and
working directory; no core dumps; then what needs privilege (a per-slot uid, no supplementary
groups) first, then no_new_privs, Landlock and the two seccomp filters, after which it can only
lose rights; all other descriptors closed. Everything that can be is prepared here, before fork:
a forked child pays a page copy for every page it touches. Per-call limits come with the code."""

from __future__ import annotations

import dataclasses
import io
import struct
import sys

from tool_sandbox.sandbox import landlock, seccomp

REQUEST_FD = 3
CONTROL_FD = 4
RUN, SESSION, EXEC = 0, 1, 2  # a one-shot program, a session's first cell, a session's next cell
PROGRAM_NAME = "main.py"  # the code's __file__ and sys.argv[0] in its directory, as SandboxFusion runs a file
# A request to a child, read in C (_spawner.receive): mode, timeout seconds, memory MiB, file size
# MiB, open files, processes, stdin bytes, code bytes; then stdin and code (UTF-8).
REQUEST = struct.Struct("=IdIIIIII")


@dataclasses.dataclass(frozen=True)
class Layers:
    """What the worker prepared once for all its children, as the C side takes it."""

    landlock: landlock.Prepared | None  # None: Landlock unavailable or disabled
    static_filter: bytes  # BPF program
    self_only_filter: bytes  # BPF program with seccomp.SELF / seccomp.GROUP placeholders
    task_filter: bytes  # BPF program notifying the forker of new threads; b"": no task limit here

    def spawner_args(self) -> tuple[bytes, bytes, bytes, int, int, bytes, bytes, int, int]:
        """The arguments of _spawner.serve after the socket and the slot count."""
        rules = self.landlock
        return (
            self.static_filter,
            self.self_only_filter,
            self.task_filter,
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


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-call resource limits, applied by the child once the code arrives."""

    timeout_seconds: float
    memory_mib: int
    file_size_mib: int
    open_files: int
    processes: int

    def __post_init__(self) -> None:
        if not 0 < self.timeout_seconds < 1e9:  # also rejects NaN
            raise ValueError(f"timeout_seconds must be a positive number, not {self.timeout_seconds!r}")
        for name in ("memory_mib", "file_size_mib", "open_files", "processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 < value < 1 << 32:
                raise ValueError(f"{name} must be a positive integer below 2**32, not {value!r}")


def request(mode: int, code: str, limits: Limits | None = None, stdin: str = "") -> bytes:
    """The bytes of one request to a child (limits are ignored for EXEC; stdin replaces the
    session's stdin for that cell)."""
    if not isinstance(code, str) or not isinstance(stdin, str):
        raise TypeError("code and stdin must be strings")
    body = stdin.encode("utf-8", "surrogatepass")
    source = code.encode("utf-8", "surrogatepass")
    numbers = dataclasses.astuple(limits) if limits else (0.0, 0, 0, 0, 0)
    return REQUEST.pack(mode, *numbers, len(body), len(source)) + body + source


SESSION_STDIO: tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper] | None = None


def prepare_stdio() -> None:
    """Line-buffered UTF-8 text streams on fds 0-2 for sessions (SESSION_STDIO), made in the
    worker so children inherit them: a child only swaps the descriptors underneath. A program
    keeps the interpreter's own streams, as `python main.py` has them."""
    global SESSION_STDIO
    streams = [io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")]
    for fd in (1, 2):
        streams.append(
            io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False),
                encoding="utf-8",
                errors="backslashreplace",
                line_buffering=True,
            )
        )
    SESSION_STDIO = (streams[0], streams[1], streams[2])
