"""Math reward: the last `\\boxed{...}` of the response against the ground truth, both normalised.

The verification of verl's `math` and `math_dapo` scorers (the last boxed answer, LaTeX noise removed),
written for this project: an answer is right when its normalised text equals the ground truth's, or
when both are plain numbers (integers, decimals, `\\frac{a}{b}`, `a/b`) of the same value, so `0.5`,
`\\frac12` and `\\dfrac{1}{2}` are one answer. A ground truth that is itself a boxed solution is reduced
to its boxed answer first. The score is 1 or 0 (verl's `math_dapo` gives -1 for a wrong answer; a
GRPO group's advantages are the same either way, since each group's rewards are standardised).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

BOX_COMMANDS = ("\\boxed", "\\fbox")
# Wrappers whose content is the answer: `\text{cm}` -> `cm`
WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
# Spacing and sizing commands that do not change an answer
NOISE = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "~",
    "$",
)
DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°")
PERCENT = re.compile(r"\\?%$")
THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
SHORT_FRAC = re.compile(r"\\frac(\d)(\d)")  # \frac12 -> \frac{1}{2}
SHORT_FRAC_BRACED = re.compile(r"\\frac\{([^{}]*)\}(\d)")  # \frac{1}2
SHORT_SQRT = re.compile(r"\\sqrt(\w)")  # \sqrt2 -> \sqrt{2}
VARIABLE_PREFIX = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?=")  # x=3, a_1=3, y_{n}=3
FRACTION = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}")
SLASH = re.compile(r"(-?\d+)/(-?\d+)")
DECIMAL = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`; `\\boxed 5` too) in `text`, braces
    balanced; None if there is none or it is not closed."""
    start = max(text.rfind(command) for command in BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    command = next(c for c in BOX_COMMANDS if rest.startswith(c))
    rest = rest[len(command) :]
    if rest.startswith(" "):  # `\boxed 5`: up to the end of the word
        word = rest.strip().split(maxsplit=1)
        return word[0].rstrip("$.") if word else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


def normalize(answer: str) -> str:
    """Canonical text of a math answer: LaTeX spacing, `\\text{}` wrappers, `$`, degrees, percent and
    dollar signs, thousands separators and a leading `x =` removed; `\\dfrac`/`\\tfrac` as `\\frac`,
    shorthand `\\frac12` and `\\sqrt2` braced; whitespace dropped."""
    text = str(answer).strip()
    for _ in range(3):  # nested wrappers: \text{\textbf{5}}
        text = WRAPPERS.sub(r"\1", text)
    text = text.replace("\\$", "")  # a dollar sign, before `$` (math mode) goes
    for noise in NOISE:
        text = text.replace(noise, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = DEGREES.sub("", text)
    text = "".join(text.split())
    text = PERCENT.sub("", text.rstrip("."))
    text = VARIABLE_PREFIX.sub("", text)
    text = SHORT_FRAC.sub(r"\\frac{\1}{\2}", text)
    text = SHORT_FRAC_BRACED.sub(r"\\frac{\1}{\2}", text)
    text = SHORT_SQRT.sub(r"\\sqrt{\1}", text)
    if THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text


def number(text: str) -> Fraction | None:
    """The value of a normalised answer that is a plain number (integer, decimal, fraction), else None."""
    if DECIMAL.fullmatch(text):
        return Fraction(text)
    for pattern in (FRACTION, SLASH):
        match = pattern.fullmatch(text)
        if match:
            parts = match.groups()
            sign = -1 if len(parts) == 3 and parts[0] == "-" else 1
            numerator, denominator = int(parts[-2]), int(parts[-1])
            return None if denominator == 0 else sign * Fraction(numerator, denominator)
    return None


def same(answer: str, truth: str) -> bool:
    a, b = normalize(answer), normalize(truth)
    if a == b:
        return True
    x, y = number(a), number(b)
    return x is not None and x == y


def score(solution: str, ground_truth: Any) -> dict[str, float]:
    """score = 1 when the last boxed answer is the ground truth's; `format`: the response boxed one."""
    truth = str(ground_truth)
    truth = last_boxed(truth) or truth  # a ground truth given as a boxed solution
    answer = last_boxed(solution)
    correct = answer is not None and same(answer, truth)
    return {"score": float(correct), "correct": float(correct), "format": float(answer is not None)}
