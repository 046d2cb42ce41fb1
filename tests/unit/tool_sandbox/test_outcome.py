import signal

from tool_sandbox.sandbox.outcome import Outcome, cap_output, classify


def exited(code: int) -> int:
    return code << 8


def pair(outcome: Outcome) -> tuple[str, int | None]:
    return outcome.status, outcome.exit_code


def test_exit_codes_and_signals_map_to_statuses() -> None:
    assert classify(exited(0), False, False).status == "ok"
    assert pair(classify(exited(3), False, False)) == ("error", 3)
    assert pair(classify(signal.SIGSEGV, False, False)) == ("killed", -signal.SIGSEGV)
    assert classify(signal.SIGXCPU, False, False).status == "timeout"
    assert classify(signal.SIGXFSZ, False, False).message == "file size limit exceeded"
    assert classify(signal.SIGKILL, True, False).status == "timeout"
    assert classify(signal.SIGKILL, False, True).status == "killed"
    # A SIGKILL nobody in the worker sent, after the CPU budget is spent: RLIMIT_CPU's hard limit.
    assert classify(signal.SIGKILL, False, False, cpu_exhausted=True).status == "timeout"
    assert classify(signal.SIGKILL, False, False, cpu_exhausted=False).status == "killed"
    assert classify(None, False, False).status == "error"


def test_output_is_capped_with_a_visible_marker() -> None:
    assert cap_output(b"abc", 3, 10) == ("abc", False)
    text, cut = cap_output(b"abcdef", 1000, 4)
    assert cut and text.startswith("abcd\n") and "truncated: 1000 bytes" in text
    # a reader that stopped (an upstream's answer past what the pool reads) says the size is more
    text, cut = cap_output(b"abcdef", 1000, 4, more=True)
    assert cut and text == "abcd\n[... output truncated: more than 1000 bytes, first 4 shown ...]"
