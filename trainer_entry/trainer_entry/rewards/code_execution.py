"""Code-execution reward: run the answer's code (with the sample's tests, if any) in the tool pool."""

from __future__ import annotations

import re
import secrets
from typing import Any

from trainer_entry.pool_client import CallResult

CODE_BLOCKS = (
    re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL),
    re.compile(r"<PYTHON>(.*?)</PYTHON>", re.DOTALL),
    re.compile(r"<tool>(.*?)</tool>", re.DOTALL),
)


def extract_code(solution: str) -> str | None:
    """The last code block of the response (markdown fence, <PYTHON> or <tool> tags)."""
    best: tuple[int, str] | None = None
    for pattern in CODE_BLOCKS:
        for match in pattern.finditer(solution):
            if best is None or match.start() > best[0]:
                best = (match.start(), match.group(1).strip("\n"))
    return best[1] if best else None


def new_nonce() -> str:
    """A fresh marker per run: the model cannot print it, so seeing it proves the program ran to the end."""
    return f"toolrl-done-{secrets.token_hex(16)}"


def program(code: str, ground_truth: Any, nonce: str) -> tuple[str, str | None]:
    """(source to run, expected stdout or None): tests are appended, then the nonce is printed last.

    A program that exits early (`sys.exit(0)`, `os._exit(0)`, `raise SystemExit`) never prints the
    nonce, so skipping the tests cannot pass.
    """
    done = f"\n\nprint({nonce!r})\n"
    if isinstance(ground_truth, dict) and ground_truth.get("tests"):
        return f"{code}\n\n{ground_truth['tests']}{done}", None
    expected = ground_truth.get("output") if isinstance(ground_truth, dict) else ground_truth
    return f"{code}{done}", None if expected is None else str(expected)


def judge(result: CallResult, expected: str | None, nonce: str) -> dict[str, float]:
    """Components from the pool's answer: it ran to the end (exit 0 and the nonce printed last), and
    (if expected) printed the right output before the nonce."""
    printed = (result.stdout or result.output).rstrip()
    finished = printed.endswith(nonce)
    ran = result.status == "ok" and result.exit_code == 0 and finished
    output = printed[: -len(nonce)].strip() if finished else ""
    passed = ran and (expected is None or output == expected.strip())
    return {"score": float(passed), "has_code": 1.0, "ran": float(ran), "passed": float(passed)}


NO_CODE = {"score": 0.0, "has_code": 0.0, "ran": 0.0, "passed": 0.0}
