"""GSM8K-style exact match: the final answer of the response against the ground-truth number."""

from __future__ import annotations

import re

MARKERS = (
    re.compile(r"####\s*([^\n]+)"),
    re.compile(r"\\boxed\{([^{}]+)\}"),
    re.compile(r"[Tt]he (?:final )?answer is[:\s]*([^\n]+)"),
)
NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


def normalize(answer: str) -> str:
    """Canonical text of an answer: numbers without $, commas, trailing zeros or dot."""
    text = answer.strip().rstrip(".").strip()
    match = NUMBER.search(text)
    if match is None:
        return text.lower()
    number = match.group(0).replace("$", "").replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return "0" if number in ("-0", "") else number


def extract_answer(solution: str) -> tuple[str | None, bool]:
    """(answer, marked): the last explicitly marked answer, else the last number in the text."""
    for pattern in MARKERS:
        found = pattern.findall(solution)
        if found:
            return found[-1], True
    numbers = NUMBER.findall(solution)
    return (numbers[-1], False) if numbers else (None, False)


def score(solution: str, ground_truth: str) -> dict[str, float]:
    """score = 1 for the right answer; `format` says whether the answer was explicitly marked."""
    answer, marked = extract_answer(solution)
    correct = answer is not None and normalize(answer) == normalize(str(ground_truth))
    return {"score": 1.0 if correct else 0.0, "correct": float(correct), "format": float(marked)}
