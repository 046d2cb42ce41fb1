"""Code-execution reward: run the answer's code (with the sample's tests, if any) in the tool pool."""

from __future__ import annotations

import re
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


def program(code: str, ground_truth: Any) -> tuple[str, str | None]:
    """(source to run, expected stdout or None): tests are appended, an expected output is compared."""
    if isinstance(ground_truth, dict) and ground_truth.get("tests"):
        return f"{code}\n\n{ground_truth['tests']}\n", None
    expected = ground_truth.get("output") if isinstance(ground_truth, dict) else ground_truth
    return code, None if expected is None else str(expected)


def judge(result: CallResult, expected: str | None) -> dict[str, float]:
    """Components from the pool's answer: it ran cleanly, and (if expected) printed the right output."""
    ran = result.status == "ok" and (result.exit_code in (0, None))
    printed = (result.stdout or result.output).strip()
    passed = ran and (expected is None or printed == expected.strip())
    return {"score": float(passed), "has_code": 1.0, "ran": float(ran), "passed": float(passed)}


NO_CODE = {"score": 0.0, "has_code": 0.0, "ran": 0.0, "passed": 0.0}
