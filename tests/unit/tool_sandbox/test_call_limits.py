"""A call's limits decided from observations alone (no process, no directory): when it is killed for
its deadline, its output or its disk budget, and which verdict and message follow."""

from __future__ import annotations

import signal

import pytest
from tool_sandbox.sandbox.outcome import ERROR, KILLED, OK, TIMEOUT, Outcome
from tool_sandbox.sandbox.zygote.limits import DISK_CHECK_SECONDS, DISK_WALK_FAILURES, CallLimits, DiskUsage

START = 1000.0  # the worker's monotonic clock when the call starts
DISK = 1 << 20


class Directory:
    """The worker's measurements of the call's directory, in turn (None: the tree changed under the
    walk); records what a file that cannot be measured was to count."""

    def __init__(self, *sizes: int | None) -> None:
        self.sizes = list(sizes)
        self.unmeasured: list[int] = []

    def __call__(self, unmeasured_bytes: int) -> int | None:
        self.unmeasured.append(unmeasured_bytes)
        return self.sizes.pop(0)


def never_measured(unmeasured_bytes: int) -> int | None:
    raise AssertionError("the directory was measured")


def limits(
    timeout: float = 3.0,
    max_output: int = 8,
    disk_bytes: int = DISK,
    disk_used: DiskUsage = never_measured,
    cpu: float = 3.0,
) -> CallLimits:
    return CallLimits.start(START, timeout, max_output, disk_bytes, disk_used, cpu)


def exited(code: int) -> int:
    return code << 8


def test_output_keeps_the_cap_of_each_stream_and_kills_once_past_sixteen_times_it() -> None:
    call = limits(max_output=1 << 16)
    assert call.kill_bytes == 1 << 20
    assert not call.keep_output("out", b"a" * (1 << 19))
    assert not call.keep_output("err", b"b" * (1 << 19))  # at the kill threshold, not past it
    assert call.keep_output("out", b"c")
    assert not call.keep_output("err", b"d" * 100)  # killed once
    assert (len(call.out), len(call.err)) == (1 << 16, 1 << 16)
    assert (call.out_total, call.err_total) == ((1 << 19) + 1, (1 << 19) + 100)
    assert call.exceeded and not call.timed_out  # its deadline still counts
    assert call.classify(signal.SIGKILL, 0.0) == Outcome(
        KILLED, -signal.SIGKILL, "output limit exceeded: the process group was killed"
    )


def test_a_small_output_cap_still_lets_a_quarter_mebibyte_through_before_the_kill() -> None:
    call = limits(max_output=4)
    assert call.kill_bytes == 1 << 18
    assert not call.keep_output("out", b"x" * (1 << 18))
    assert call.keep_output("out", b"x")


def test_each_stream_is_answered_cut_and_marked() -> None:
    call = limits(max_output=4)
    call.keep_output("out", b"abcdef")
    call.keep_output("err", b"ok")
    assert call.capped_output() == ("abcd\n[... output truncated: 6 bytes, first 4 shown ...]", "ok", True)
    assert limits().capped_output() == ("", "", False)


def test_the_deadline_kills_and_makes_a_timeout_whatever_else_happened() -> None:
    call = limits(timeout=2.0, disk_bytes=0)
    assert call.deadline == START + 2.0
    assert not call.should_kill(START + 1.999)
    assert call.should_kill(START + 2.0)
    assert call.timed_out and call.exceeded
    call.keep_output("out", b"x" * (1 << 19))  # over its output too: the timeout decides
    assert call.classify(signal.SIGKILL, 0.0).status == TIMEOUT
    assert call.classify(exited(0), 0.0).status == TIMEOUT  # it exited as it was killed: late anyway


def test_the_directory_is_measured_when_due_and_only_under_a_budget() -> None:
    directory = Directory(100, 100)
    call = limits(timeout=10.0, disk_used=directory)
    assert call.next_disk_check == START + DISK_CHECK_SECONDS
    assert not call.should_kill(START + DISK_CHECK_SECONDS / 2)
    assert directory.unmeasured == []
    assert not call.should_kill(START + DISK_CHECK_SECONDS)
    assert directory.unmeasured == [DISK + 1]  # what cannot be measured counts as over the budget
    assert call.next_disk_check == START + 2 * DISK_CHECK_SECONDS
    assert not call.should_kill(START + 1.5 * DISK_CHECK_SECONDS)
    assert not call.should_kill(START + 2 * DISK_CHECK_SECONDS)
    assert directory.sizes == []
    unchecked = limits(timeout=10.0, disk_bytes=0)  # never_measured
    for tick in range(1, 50):
        assert not unchecked.should_kill(START + tick * DISK_CHECK_SECONDS)
    assert not unchecked.over_disk_at_end()


def test_over_the_disk_budget_the_call_is_killed_and_told_what_to_do() -> None:
    directory = Directory(DISK, DISK + 1)
    call = limits(timeout=10.0, disk_used=directory)
    assert not call.should_kill(START + DISK_CHECK_SECONDS)  # at the budget, not over it
    assert call.should_kill(START + 2 * DISK_CHECK_SECONDS)
    assert call.disk_exceeded and call.exceeded
    assert not call.over_disk_at_end()  # already over: not measured again
    assert call.verdict(call.classify(signal.SIGKILL, 0.0)) == Outcome(
        KILLED,
        -signal.SIGKILL,
        f"wrote more than {DISK} bytes to its directory (the call's disk budget; a file deleted while"
        " still open or mapped counts until it is closed); write less or delete and close files as you go",
    )
    assert call.verdict(Outcome(OK, 0, "")).status == KILLED  # a session's cell that ended on its own


def test_a_tree_that_keeps_changing_under_the_walk_counts_as_over_but_not_at_once() -> None:
    directory = Directory(*[None] * (DISK_WALK_FAILURES - 1), 5, *[None] * DISK_WALK_FAILURES)
    call = limits(timeout=100.0, disk_used=directory)
    now = START
    for _ in range(2 * DISK_WALK_FAILURES - 1):  # failures, one measurement (counted again from 0), failures
        now += DISK_CHECK_SECONDS
        assert not call.should_kill(now)
    assert call.should_kill(now + DISK_CHECK_SECONDS)
    assert call.disk_exceeded and directory.sizes == []


def test_at_the_end_one_more_measurement_decides_and_a_changing_tree_is_within() -> None:
    directory = Directory(None, DISK + 1)
    call = limits(disk_used=directory)
    assert not call.over_disk_at_end()
    assert call.verdict(Outcome(ERROR, 1, "exit code 1")) == Outcome(ERROR, 1, "exit code 1")
    assert call.over_disk_at_end()
    assert call.disk_exceeded and call.verdict(Outcome(OK, 0, "")).status == KILLED


@pytest.mark.parametrize(("cpu_used", "status"), [(2.9, KILLED), (3.0, TIMEOUT), (7.0, TIMEOUT)])
def test_a_sigkill_nobody_sent_is_a_timeout_once_its_cpu_is_spent(cpu_used: float, status: str) -> None:
    assert limits(cpu=3.0).classify(signal.SIGKILL, cpu_used).status == status


def test_an_ordinary_end_is_the_codes_own() -> None:
    call = limits()
    assert call.classify(exited(0), 0.1) == Outcome(OK, 0, "")
    assert call.classify(exited(3), 0.1) == Outcome(ERROR, 3, "exit code 3")
    assert not call.exceeded
