"""A call's limits: its wall-clock deadline, its output cap and its disk budget; whether it is past
one of them, and the verdict that follows.

Pure: it decides from what the worker observed (its clock, the bytes the call's pipes carried, the
size of the call's directory by the measurement the worker gives it, the wait status and CPU seconds
the forker reported); the worker measures, kills and answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tool_sandbox.sandbox import outcome

DISK_CHECK_SECONDS = 0.1  # how often a running call's directory is measured
DISK_WALK_FAILURES = 20  # a tree that changes under this many measurements in a row counts as over budget

# The worker's measurement of the call's directory: the bytes it holds, a file that cannot be
# measured counting the bytes given; None when the tree changed under the walk.
DiskUsage = Callable[[int], int | None]


@dataclass
class CallLimits:
    """What a call may use, what it used of it, and what it was killed for."""

    deadline: float
    max_output: int  # kept of each stream
    kill_bytes: int  # the output of both streams together past which the call is killed
    disk_bytes: int  # what the child's directory may hold (0: unchecked)
    disk_used: DiskUsage  # the worker's measurement of that directory
    cpu_seconds: float  # the child's CPU budget
    next_disk_check: float
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    out_total: int = 0
    err_total: int = 0
    timed_out: bool = False
    output_exceeded: bool = False
    disk_exceeded: bool = False
    disk_walk_failures: int = 0

    @classmethod
    def start(
        cls,
        now: float,
        timeout: float,
        max_output: int,
        disk_bytes: int,
        disk_used: DiskUsage,
        cpu_seconds: float,
    ) -> CallLimits:
        """The limits of a call that starts `now`."""
        return cls(
            deadline=now + timeout,
            max_output=max_output,
            kill_bytes=max(16 * max_output, 1 << 18),
            disk_bytes=disk_bytes,
            disk_used=disk_used,
            cpu_seconds=cpu_seconds,
            next_disk_check=now + DISK_CHECK_SECONDS,
        )

    @property
    def exceeded(self) -> bool:
        """Whether the call was killed for one of its limits (it is answered once reaped)."""
        return self.timed_out or self.output_exceeded or self.disk_exceeded

    def keep_output(self, role: str, data: bytes) -> bool:
        """Keep what fits of what the child wrote on its stdout ("out") or stderr ("err"), count all
        of it; whether the call just went past its output cap (to be killed)."""
        buf = self.out if role == "out" else self.err
        if len(buf) < self.max_output:
            buf += data[: self.max_output - len(buf)]
        if role == "out":
            self.out_total += len(data)
        else:
            self.err_total += len(data)
        if self.out_total + self.err_total > self.kill_bytes and not self.output_exceeded:
            self.output_exceeded = True
            return True
        return False

    def should_kill(self, now: float) -> bool:
        """Whether the call is to be killed now: past its deadline, or over its disk budget when its
        directory is due to be measured."""
        if now >= self.deadline:
            self.timed_out = True
            return True
        if now >= self.next_disk_check:
            self.next_disk_check = now + DISK_CHECK_SECONDS
            if self._over_disk(at_end=False):
                self.disk_exceeded = True
                return True
        return False

    def over_disk_at_end(self) -> bool:
        """Whether the call's directory, measured once more as the call ends, is newly over its disk
        budget (a tree that changes under this last walk counts as within it)."""
        if self.disk_exceeded or not self._over_disk(at_end=True):
            return False
        self.disk_exceeded = True
        return True

    def _over_disk(self, at_end: bool) -> bool:
        if self.disk_bytes <= 0:
            return False
        used = self.disk_used(self.disk_bytes + 1)  # what cannot be measured counts as over
        if used is None:  # changed under the walk: measured again next time, but not forever
            if at_end:
                return False
            self.disk_walk_failures += 1
            return self.disk_walk_failures >= DISK_WALK_FAILURES
        self.disk_walk_failures = 0
        return used > self.disk_bytes

    def classify(self, wait_status: int | None, cpu_seconds: float) -> outcome.Outcome:
        """The result of a reaped child's call: its wait status read with what the worker killed it
        for and whether it used up its CPU seconds."""
        return outcome.classify(
            wait_status, self.timed_out, self.output_exceeded, cpu_seconds >= self.cpu_seconds
        )

    def verdict(self, result: outcome.Outcome) -> outcome.Outcome:
        """The call's result once its disk budget is counted."""
        if not self.disk_exceeded:
            return result
        return outcome.Outcome(
            outcome.KILLED,
            result.exit_code,
            f"wrote more than {self.disk_bytes} bytes to its directory (the call's disk budget; a"
            " file deleted while still open or mapped counts until it is closed); write less or"
            " delete and close files as you go",
        )

    def capped_output(self) -> tuple[str, str, bool]:
        """Its stdout and stderr as answered (each cut at `max_output`, marked) and whether one was cut."""
        stdout, cut_out = outcome.cap_output(bytes(self.out), self.out_total, self.max_output)
        stderr, cut_err = outcome.cap_output(bytes(self.err), self.err_total, self.max_output)
        return stdout, stderr, cut_out or cut_err
