"""Reward presets on hand-checked cases, and toolbench on a real StableToolBench trajectory."""

import json
from pathlib import Path

import pytest
from trainer_entry.hub import Sink, use_sink
from trainer_entry.metrics import TrainerMetrics
from trainer_entry.pool_client import CallResult
from trainer_entry.rewards import (
    RewardFunctionFailed,
    code_execution,
    compute_score,
    exact_match,
    math_answer,
    toolbench,
)

STB = Path(__file__).resolve().parents[4] / "shared" / "data" / "stabletoolbench"
WEIGHTS = {
    "formatWeight": 0.1,
    "functionCallWeight": 0.2,
    "finishWeight": 0.3,
    "errorPenalty": -0.5,
    "finishBonus": 0.5,
}


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", {"score": 1.0, "correct": 1.0, "format": 1.0}),
        ("The answer is $1,250.00.", "1250", {"score": 1.0, "correct": 1.0, "format": 1.0}),
        ("so \\boxed{-3}", "-3", {"score": 1.0, "correct": 1.0, "format": 1.0}),
        ("I think 12, no wait, 13", "13", {"score": 1.0, "correct": 1.0, "format": 0.0}),
        ("#### 8", "7", {"score": 0.0, "correct": 0.0, "format": 1.0}),
        ("no idea", "7", {"score": 0.0, "correct": 0.0, "format": 0.0}),
    ],
)
def test_exact_match(solution, truth, expected):
    assert exact_match.score(solution, truth) == expected


def test_extract_code_takes_the_last_block_of_any_style():
    text = "```python\nprint(1)\n```\nthen <PYTHON>print(2)</PYTHON>"
    assert code_execution.extract_code(text) == "print(2)"
    assert code_execution.extract_code("no code") is None


def test_code_program_and_judge():
    nonce = "toolrl-done-abc"
    source, expected = code_execution.program("def f(): return 2", {"tests": "assert f() == 2"}, nonce)
    assert source == "def f(): return 2\n\nassert f() == 2\n\nprint('toolrl-done-abc')\n"
    assert expected is None
    assert code_execution.program("print(4)", "4", nonce) == ("print(4)\n\nprint('toolrl-done-abc')\n", "4")
    ok = CallResult(status="ok", stdout=f"4\n{nonce}\n", exit_code=0)
    assert code_execution.judge(ok, "4", nonce) == {"score": 1.0, "has_code": 1.0, "ran": 1.0, "passed": 1.0}
    assert code_execution.judge(ok, "5", nonce)["score"] == 0.0
    failed = CallResult(status="error", stderr="AssertionError", exit_code=1)
    assert code_execution.judge(failed, None, nonce) == {
        "score": 0.0,
        "has_code": 1.0,
        "ran": 0.0,
        "passed": 0.0,
    }
    no_nonce = CallResult(status="ok", stdout="4\n", exit_code=0)
    assert code_execution.judge(no_nonce, "4", nonce)["ran"] == 0.0
    nonzero = CallResult(status="ok", stdout=f"4\n{nonce}\n", exit_code=3)
    assert code_execution.judge(nonzero, "4", nonce)["ran"] == 0.0
    assert code_execution.new_nonce() != code_execution.new_nonce()


TESTS = {"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0"}
WRONG_ADD = "def add(a, b):\n    return a - b\n"


@pytest.mark.parametrize(
    "escape",
    [
        "import sys\nsys.exit(0)",
        "exit()",
        "quit()",
        "import os\nos._exit(0)",
        "raise SystemExit",
        "raise SystemExit(0)",
        "import sys\nprint('toolrl-done-' + '0' * 32)\nsys.exit(0)",
    ],
)
async def test_code_execution_cannot_be_gamed_by_exiting_before_the_tests(sandbox, escape):
    use_sink(Sink(local=TrainerMetrics()))
    solution = f"```python\n{WRONG_ADD}{escape}\n```"
    result = await compute_score("code", solution, TESTS, {}, preset="code-execution", pool_url=sandbox)
    assert result["score"] == 0.0 and result["passed"] == 0.0


async def test_code_execution_genuine_pass_scores_one(sandbox):
    use_sink(Sink(local=TrainerMetrics()))
    right = "```python\ndef add(a, b):\n    return a + b\n```"
    result = await compute_score("code", right, TESTS, {}, preset="code-execution", pool_url=sandbox)
    assert result == {"score": 1.0, "has_code": 1.0, "ran": 1.0, "passed": 1.0}
    wrong = f"```python\n{WRONG_ADD}```"
    result = await compute_score("code", wrong, TESTS, {}, preset="code-execution", pool_url=sandbox)
    assert result["score"] == 0.0
    printed = "```python\nprint(6 * 7)\n```"
    assert (await compute_score("code", printed, "42", {}, preset="code-execution", pool_url=sandbox))[
        "score"
    ] == 1.0


def test_toolbench_on_the_real_stabletoolbench_trajectory():
    doc = json.loads((STB / "answer_588_CoT.json").read_text())
    steps = toolbench.steps_from_answer(doc)
    assert [s.name for s in steps] == [
        "transfermarkt_search_for_theclique",
        "transfermarkt_details_for_theclique",
        "songkick_search_artist_for_theclique",
        "get_artist_overview_for_theclique",
        "songkick_artist_for_theclique",
        "list_artist_concerts_for_theclique",
    ]
    result = toolbench.score_steps(steps, WEIGHTS)
    # 6 well-formed calls, every observation has an empty "error", Finish never called (win: false):
    # 0.1 * 1 + 0.2 * 1 + 0.3 * 0 - 0.5 * 0 + 0.5 * 0 = 0.3
    assert result == pytest.approx(
        {"score": 0.3, "format": 1.0, "function_call": 1.0, "finish": 0.0, "error_rate": 0.0, "answered": 0.0}
    )


def react_text(steps):
    return "".join(
        f"Thought: go\nAction: {n}\nAction Input: {i}\n" + (f"Observation: {o}\n" if o else "")
        for n, i, o in steps
    )


def test_toolbench_text_of_the_real_trajectory_scores_the_same():
    doc = json.loads((STB / "answer_588_CoT.json").read_text())
    chain = doc["trys"][-1]["chain"]
    pairs = [
        (chain[i]["description"], chain[i + 1]["description"].replace("\n", " "), chain[i + 1]["observation"])
        for i in range(0, len(chain), 2)
    ]
    assert toolbench.score(react_text(pairs), WEIGHTS)["score"] == pytest.approx(0.3)


def test_toolbench_finish_error_and_malformed_calls():
    text = react_text(
        [
            ("a_for_t", '{"q": 1}', '{"error": "Rate limit", "response": ""}'),
            ("b_for_t", '{"q": 2}', '{"error": "", "response": "fine"}'),
            (
                "Finish",
                '{"return_type": "give_answer", "final_answer": "Messi played for Barcelona and PSG."}',
                None,
            ),
        ]
    )
    result = toolbench.score(text, WEIGHTS)
    # format 1, function_call 1/2, finish 1, error_rate 1/2, answered 1
    assert result["score"] == pytest.approx(0.1 + 0.2 * 0.5 + 0.3 - 0.5 * 0.5 + 0.5)
    bad = react_text(
        [("a_for_t", "{oops", "Error: bad"), ("Finish", '{"return_type": "give_up_and_restart"}', None)]
    )
    result = toolbench.score(bad, WEIGHTS)
    assert result == pytest.approx(
        {
            "score": 0.3 - 0.5,
            "format": 0.0,
            "function_call": 0.0,
            "finish": 1.0,
            "error_rate": 1.0,
            "answered": 0.0,
        }
    )
    assert toolbench.score("I cannot help.", WEIGHTS)["score"] == 0.0


def test_toolbench_reads_hermes_calls():
    text = (
        '<tool_call>\n{"name": "a_for_t", "arguments": {"q": 1}}\n</tool_call>user\n<tool_response>\n'
        '{"error": "", "response": "ok"}\n</tool_response>assistant\n<tool_call>\n{"name": "Finish", '
        '"arguments": {"return_type": "give_answer", "final_answer": "done"}}\n</tool_call>'
    )
    assert toolbench.score(text, WEIGHTS)["score"] == pytest.approx(0.1 + 0.2 + 0.3 + 0.5)


async def test_compute_score_dispatches_and_reports_components():
    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    result = await compute_score("gsm8k", "#### 7", "7", {}, preset="exact-match")
    assert result == {"score": 1.0, "correct": 1.0, "format": 1.0}
    metrics.record_step({"timing_s/step": 1.0, "critic/score/mean": 1.0}, step=1)
    assert (
        metrics.registry.get_sample_value("toolrl_trainer_reward_component", {"component": "correct"}) == 1.0
    )
    with pytest.raises(RewardFunctionFailed, match="unknown reward preset 'bleu'"):
        await compute_score("x", "", "", {}, preset="bleu")


@pytest.mark.parametrize("spelling", ["Finish", "finish", "FINISH"])
def test_toolbench_knows_finish_in_any_case_as_the_protocol_does(spelling):
    from trainer_entry.protocols import Call, get_protocol

    assert get_protocol("react").is_final(Call(name=spelling, arguments={}))
    text = react_text(
        [
            ("b_for_t", '{"q": 2}', '{"error": "", "response": "fine"}'),
            (spelling, '{"return_type": "give_answer", "final_answer": "fine"}', None),
        ]
    )
    result = toolbench.score(text, WEIGHTS)
    assert (result["finish"], result["answered"], result["function_call"]) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("solution", "truth", "correct"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", "0.5", True),
        ("$\\boxed{\\dfrac12}$", "\\frac{1}{2}", True),
        ("\\boxed{\\sqrt{2}}", "\\sqrt2", True),  # nested braces, shorthand
        ("\\boxed{1,000}", "1000", True),
        ("\\boxed{x = 3}", "3", True),
        ("\\boxed{90^\\circ}", "90", True),
        ("\\boxed{\\$18.00}", "18", True),
        ("\\boxed{50\\%}", "50", True),
        ("\\boxed{\\text{(B)}}", "(B)", True),
        ("\\boxed 7", "7", True),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", True),
        ("first \\boxed{3}, then on reflection \\boxed{4}", "4", True),  # the last box is the answer
        ("first \\boxed{3}, then on reflection \\boxed{4}", "3", False),
        ("\\boxed{-3}", "3", False),
        ("\\boxed{12}", "21", False),
        ("\\boxed{\\frac{1}{3}}", "0.33", False),
        ("\\boxed{4", "4", False),  # never closed: no answer
        ("\\boxed{5}", "The sum is \\boxed{5}.", True),  # a ground truth that is a boxed solution
        ("\\boxed{5}", 5, True),  # a number from the data
    ],
)
def test_math_takes_the_last_boxed_answer_and_compares_it_normalised(solution, truth, correct):
    result = math_answer.score(solution, truth)
    boxed = float(solution != "\\boxed{4")  # an unclosed box is no answer
    assert result == {"score": float(correct), "correct": float(correct), "format": boxed}


def test_math_without_a_boxed_answer_scores_0_and_says_so():
    assert math_answer.score("The answer is 4.", "4") == {"score": 0.0, "correct": 0.0, "format": 0.0}


async def test_the_math_preset_is_scored_through_compute_score():
    use_sink(Sink(local=TrainerMetrics()))
    result = await compute_score("math", "thus \\boxed{\\frac{3}{4}}", "0.75", {}, preset="math")
    assert result == {"score": 1.0, "correct": 1.0, "format": 1.0}
