"""The last lines of a `make test`: what failed and what was slowest, read from pytest's JUnit XML.

CI shows only the tail of a run, and after pytest's own summary come the warnings that libraries
print while the interpreter shuts down. This prints the verdict again, last, in a few lines:
`python -m harness.test_report .test-results-*.xml` (one report of every file given).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass

SLOWEST = 15
MESSAGE_CHARS = 160


@dataclass(frozen=True)
class Case:
    test_id: str
    seconds: float
    outcome: str  # passed | failed | error | skipped
    message: str


def read_cases(xml_text: str) -> list[Case]:
    cases = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "").splitlines()[0] if child.get("message") else ""
                break
        cases.append(Case(name, float(case.get("time") or 0.0), outcome, message))
    return cases


def report(cases: list[Case]) -> str:
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.outcome] = counts.get(case.outcome, 0) + 1
    total = sum(case.seconds for case in cases)
    lines = [f"slowest {SLOWEST} of {len(cases)} tests:"]
    for case in sorted(cases, key=lambda c: -c.seconds)[:SLOWEST]:
        lines.append(f"  {case.seconds:7.1f}s  {case.test_id}")
    for case in cases:
        if case.outcome in ("failed", "error"):
            lines.append(f"{case.outcome.upper()} {case.test_id}: {case.message[:MESSAGE_CHARS]}")
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    lines.append(f"== {summary} in {total / 60:.1f} min of test time ==")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m harness.test_report RESULTS.xml...", file=sys.stderr)
        return 2
    cases = []
    for path in argv:
        try:
            with open(path, encoding="utf-8") as handle:
                cases += read_cases(handle.read())
        except (OSError, ET.ParseError) as exc:
            print(f"no test report at {path}: {exc}", file=sys.stderr)
            return 1
    print(report(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
