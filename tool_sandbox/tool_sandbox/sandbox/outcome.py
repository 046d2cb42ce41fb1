"""Pure rules that turn what happened to a sandboxed process into the API's answer."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

OK = "ok"
ERROR = "error"
TIMEOUT = "timeout"
KILLED = "killed"
REJECTED = "rejected"
STATUSES = (OK, ERROR, TIMEOUT, KILLED, REJECTED)

# Whose failure an answer is (the `fault` field of every API answer, docs/contracts.md): the code's
# (exit code, exception, its own time or output limit: the model is to blame) or the infrastructure's
# (rejected, worker lost, sandbox error, an upstream down: the model is not). None when ok.
FAULT_CODE = "code"
FAULT_INFRA = "infra"
FAULTS = (FAULT_CODE, FAULT_INFRA)


def fault(status: str, sandbox_error: bool) -> str | None:
    """The default `fault` of a result: rejected and sandbox errors are the infrastructure's, every
    other failure is the code's."""
    if status == REJECTED or sandbox_error:
        return FAULT_INFRA
    return None if status == OK else FAULT_CODE


_SIGNAL_REASONS = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGSYS: "forbidden system call",
    signal.SIGKILL: "killed",
}


@dataclass(frozen=True)
class Outcome:
    status: str
    exit_code: int | None
    message: str


def classify(
    wait_status: int | None, timed_out: bool, output_exceeded: bool, cpu_exhausted: bool = False
) -> Outcome:
    """Map a wait status plus what the worker saw to (status, exit code, reason).

    `timed_out`: the worker killed it at its wall-clock deadline; `output_exceeded`: killed for
    flooding output; `cpu_exhausted`: it used up its CPU seconds, so a SIGKILL is the RLIMIT_CPU
    hard limit (e.g. SIGXCPU ignored, or threads burning CPU faster than the wall clock).
    Exit codes follow Python's subprocess convention: a signal N is reported as -N."""
    if wait_status is None:
        return Outcome(ERROR, None, "sandbox process vanished")
    code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else -os.WTERMSIG(wait_status)
    if timed_out:
        return Outcome(TIMEOUT, code, "wall-clock timeout: the process group was killed")
    if output_exceeded:
        return Outcome(KILLED, code, "output limit exceeded: the process group was killed")
    if code >= 0:
        return Outcome(OK if code == 0 else ERROR, code, "" if code == 0 else f"exit code {code}")
    sig = -code
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_exhausted):
        return Outcome(TIMEOUT, code, _SIGNAL_REASONS[signal.SIGXCPU])
    return Outcome(KILLED, code, _SIGNAL_REASONS.get(sig, f"killed by signal {sig}"))


def cap_output(data: bytes, total: int, limit: int, more: bool = False) -> tuple[str, bool]:
    """Decode at most `limit` bytes of a stream of `total` bytes (`more`: more than that, its reader
    stopped there), with a visible marker if cut."""
    if total <= limit and not more:
        return data.decode("utf-8", errors="replace"), False
    text = data[:limit].decode("utf-8", errors="replace")
    size = f"more than {total}" if more else str(total)
    return f"{text}\n[... output truncated: {size} bytes, first {limit} shown ...]", True


def no_run_reply(status: str, message: str) -> dict[str, object]:
    """The worker protocol's reply for a call that no code ran for (the pool's failure)."""
    return {
        "status": status,
        "exitCode": None,
        "stdout": "",
        "stderr": "",
        "truncated": False,
        "durationSeconds": 0.0,
        "message": message,
        "sandboxError": True,
    }
