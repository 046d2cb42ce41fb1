"""The HTTP surface against a real server: malformed requests, sessions, SandboxFusion and VerlTool
request shapes, search, backpressure and metrics."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from harness.sandbox_process import SandboxProcess


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "request body is not valid JSON"),
        (b"", 400, "empty request body"),
        (b"[1, 2]", 400, "must be a JSON object, got list"),
        (b'{"tool": "ruby", "input": "1"}', 400, "unknown tool 'ruby'; this pool serves python, search"),
        (b'{"input": "1"}', 400, "tool is required"),
        (b'{"tool": "python"}', 400, "input is required"),
        (b'{"tool": "python", "input": 5}', 400, "input of a python tool must be a string of code"),
        (
            b'{"tool": "python", "input": "1", "timeoutSeconds": "soon"}',
            400,
            "timeoutSeconds must be a positive finite number",
        ),
        (b'{"tool": "search", "input": ["q"]}', 400, "input of a search tool must be a query string"),
        (b'{"tool": "python", "input": "1", "session": "nope"}', 404, "unknown or expired session 'nope'"),
    ],
)
def test_malformed_requests_get_4xx_naming_the_problem(
    server: SandboxProcess, body: bytes, status: int, message: str
) -> None:
    response = requests.post(server.url + "/v1/execute", data=body, timeout=10)
    assert response.status_code == status
    assert message in response.json()["error"]


def test_oversized_bodies_wrong_methods_and_paths(server: SandboxProcess) -> None:
    big = json.dumps({"tool": "python", "input": "x" * (33 << 20)})  # the body limit is 32 MiB
    response = requests.post(server.url + "/v1/execute", data=big, timeout=30)
    assert response.status_code == 413 and "body size" in response.json()["error"].lower()
    assert requests.get(server.url + "/v1/execute", timeout=5).status_code == 405
    missing = requests.get(server.url + "/nope", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"]


def test_batch_form(server: SandboxProcess) -> None:
    calls = [{"tool": "python", "input": f"print({i} * 2)"} for i in range(5)]
    calls.append({"tool": "search", "input": "capital of France"})
    results = server.post("/v1/execute/batch", {"calls": calls}).json()["results"]
    assert [r["stdout"] for r in results[:5]] == [f"{i * 2}\n" for i in range(5)]
    assert "Paris" in results[5]["output"]


def test_stdin_and_preloaded_libraries(server: SandboxProcess) -> None:
    result = server.execute(
        {
            "code": "import numpy, sympy\nprint(int(input()) + int(numpy.arange(10).sum()))\n"
            "print(sympy.factor('x**2 - 1'))",
            "stdin": "1\n",
        }
    )
    assert result["status"] == "ok" and result["stdout"] == "46\n(x - 1)*(x + 1)\n"


def test_every_call_draws_its_own_random_numbers(server: SandboxProcess) -> None:
    """Children are forked from one warm worker: each must rekey `random` and numpy's global
    stream, or every rollout would see the same "random" numbers."""
    code = (
        "import random\nfrom numpy import random as np_random\n"
        "print(random.getrandbits(64), np_random.randint(2**62), np_random.rand())"
    )
    draws = [server.execute(code)["stdout"] for _ in range(12)]
    assert all(draw.count(" ") == 2 for draw in draws), draws
    columns = list(zip(*(draw.split() for draw in draws), strict=True))
    assert all(len(set(column)) == len(draws) for column in columns), draws


def test_sessions_keep_state_until_closed(server: SandboxProcess) -> None:
    opened = server.post("/v1/sessions", {"tool": "python"})
    assert opened.status_code == 201
    session = opened.json()["session"]
    assert server.execute("x = 41", session=session)["status"] == "ok"
    assert server.execute("x + 1", session=session)["stdout"] == "42\n"
    failed = server.execute("1 / 0", session=session)
    assert failed["status"] == "error" and "ZeroDivisionError" in failed["stderr"]
    assert server.execute("print(x)", session=session)["stdout"] == "41\n"
    timed_out = server.execute("while True:\n    pass", session=session, timeoutSeconds=1)
    assert timed_out["status"] == "timeout" and "session has ended" in timed_out["message"]
    gone = server.post("/v1/execute", {"tool": "python", "input": "print(x)", "session": session})
    assert gone.status_code == 404
    second = server.post("/v1/sessions", {"tool": "python"}).json()["session"]
    assert requests.delete(f"{server.url}/v1/sessions/{second}", timeout=10).json() == {"closed": True}
    assert requests.delete(f"{server.url}/v1/sessions/{second}", timeout=10).status_code == 404
    assert server.post("/v1/sessions", {"tool": "search"}).status_code == 400


def test_session_cap(make_server: Any) -> None:
    small = make_server("--max-sessions", "2", "--workers", "1")
    assert [small.post("/v1/sessions", {"tool": "python"}).status_code for _ in range(2)] == [201, 201]
    third = small.post("/v1/sessions", {"tool": "python"})
    assert third.status_code == 429 and "2 sessions are live" in third.json()["error"]


def test_search_tool(server: SandboxProcess) -> None:
    result = server.post(
        "/v1/execute", {"tool": "search", "input": {"query": "who created Python", "topK": 1}}
    ).json()
    assert result["status"] == "ok" and result["output"].startswith("Doc 1(Title: Python)")
    assert "Kubernetes" not in result["output"]


def test_sandboxfusion_run_code_as_verl_calls_it(server: SandboxProcess) -> None:
    # The exact request verl's call_sandbox_api sends (verl/utils/reward_score/sandbox_fusion/utils.py).
    def call(code: str, stdin: str | None = None, language: str = "python", run_timeout: int = 10) -> dict:
        payload = json.dumps(
            {
                "compile_timeout": 10,
                "run_timeout": run_timeout,
                "code": code,
                "stdin": stdin,
                "memory_limit_MB": 1024,
                "language": language,
                "files": {},
                "fetch_files": [],
            }
        )
        response = requests.post(
            server.url + "/run_code",
            data=payload,
            timeout=30,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        response.raise_for_status()
        return response.json()

    ok = call("print(input()[::-1])", stdin="abc")
    assert ok["status"] == "Success" and ok["compile_result"] is None
    assert ok["run_result"]["status"] == "Finished" and ok["run_result"]["stdout"] == "cba\n"
    assert ok["run_result"]["return_code"] == 0 and ok["run_result"]["execution_time"] > 0
    failed = call("raise SystemExit(2)")
    assert failed["status"] == "Failed" and failed["run_result"]["return_code"] == 2
    slow = call("while True:\n    pass", run_timeout=1)
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    other = call("int main() {}", language="cpp")
    assert other["status"] == "SandboxError" and "python only" in other["message"]


def test_sandboxfusion_files_round_trip(server: SandboxProcess) -> None:
    body = {
        "code": "print(open('data/in.txt').read().upper())\nopen('out.txt', 'w').write('done')",
        "language": "python",
        "files": {"data/in.txt": base64.b64encode(b"hello").decode()},
        "fetch_files": ["out.txt", "missing.txt"],
    }
    result = server.post("/run_code", body).json()
    assert result["run_result"]["stdout"] == "HELLO\n"
    assert result["files"] == {"out.txt": base64.b64encode(b"done").decode()}
    escaping = server.post("/run_code", {**body, "fetch_files": ["../../etc/passwd"]})
    assert escaping.status_code == 400 and "fetch_files[0]" in escaping.json()["error"], escaping.text


def test_verltool_get_observation(server: SandboxProcess) -> None:
    first = server.post(
        "/get_observation",
        {
            "trajectory_ids": ["t1", "t2", "t3"],
            "actions": [
                "Let me compute. <python>y = 20\nprint(y + 1)</python>",
                "```python\nprint('fenced')\n```",
                "The answer is \\boxed{4}.",
            ],
            "finish": [False, False, False],
            "is_last_step": [False, False, False],
        },
    ).json()
    assert first["observations"][:2] == ["21\n", "fenced\n"]
    assert first["valids"] == [True, True, False] and first["dones"] == [False, False, False]
    second = server.post(
        "/get_observation",
        {
            "trajectory_ids": ["t1", "t2"],
            "actions": ["<python>print(y * 2)</python>", "<search>capital of France</search>"],
            "extra_fields": [{"finish": False}, {"finish": False}],
        },
    ).json()
    assert second["observations"][0] == "40\n" and "Paris" in second["observations"][1]
    done = server.post(
        "/get_observation", {"trajectory_ids": ["t1"], "actions": [""], "finish": [True]}
    ).json()
    assert done == {"observations": [""], "dones": [True], "valids": [True], "faults": [None]}
    after = server.post(
        "/get_observation", {"trajectory_ids": ["t1"], "actions": ["<python>print(y)</python>"]}
    )
    # a finished trajectory is never silently reopened (issue 14, class 11)
    assert after.json() == {
        "observations": ["[error: trajectory 't1' was finished; use a new trajectory id]"],
        "dones": [True],
        "valids": [False],
        "faults": ["code"],
    }
    bad = server.post("/get_observation", {"trajectory_ids": ["a"], "actions": ["x", "y"]})
    assert bad.status_code == 400 and "actions has 2" in bad.json()["error"]


def test_backpressure_answers_429_with_retry_after(make_server: Any) -> None:
    tiny = make_server("--capacity", "1", "--queue-size", "1", "--workers", "1")

    def call(_: int) -> requests.Response:
        return tiny.post("/v1/execute", {"tool": "python", "input": "import time\ntime.sleep(1.5)"})

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(call, range(6)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) >= 2 and 429 in codes
    rejected = next(r for r in responses if r.status_code == 429)
    assert int(rejected.headers["Retry-After"]) >= 1 and rejected.json()["status"] == "rejected"
    assert all(r.json()["status"] == "ok" for r in responses if r.status_code == 200)


def test_metrics_and_tools_answer_on_ports_of_their_own(server: SandboxProcess) -> None:
    """A NetworkPolicy admits metrics readers to the metrics port only: nothing of the tool API answers
    there, and /metrics is not on the tool API's port."""
    metrics_base = server.metrics_url.removesuffix("/metrics")
    body = {"tool": "python", "input": "print(1)"}
    for path in ("/v1/execute", "/run_code", "/mcp", "/step", "/v1/tools", "/readyz", "/healthz"):
        assert requests.post(metrics_base + path, json=body, timeout=5).status_code == 404, path
        assert requests.get(metrics_base + path, timeout=5).status_code == 404, path
    assert requests.get(server.url + "/metrics", timeout=5).status_code == 404
    assert requests.get(server.metrics_url, timeout=5).status_code == 200


def test_metrics_follow_the_contract_and_pass_promtool(server: SandboxProcess) -> None:
    server.execute("print(1)")
    server.execute("print('x' * 100000)")
    server.post("/v1/execute", {"tool": "search", "input": "Paris"})
    text = requests.get(server.metrics_url, timeout=5).text
    for name in (
        'toolrl_tool_call_duration_seconds_bucket{le="0.001",outcome="ok",protocol="native",tool="python"}',
        'toolrl_tool_calls_total{outcome="ok",protocol="native",tool="search"}',
        "toolrl_tool_inflight ",
        "toolrl_tool_queue_depth ",
        "toolrl_tool_capacity 32.0",
        'toolrl_tool_output_truncated_total{tool="python"}',
        "toolrl_sandbox_sessions ",
    ):
        assert name in text, name
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_concurrent_first_steps_of_one_trajectory_share_one_session(make_server: object) -> None:
    server = make_server("--max-sessions", "2")
    step = "<python>count = globals().get('count', 0) + 1\nprint(count)</python>"
    body = {"trajectory_ids": ["same"] * 8, "actions": [step] * 8}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: server.post("/get_observation", body).json(), range(4)))
    observations = [o for answer in answers for o in answer["observations"]]
    assert sorted(int(o) for o in observations) == list(range(1, 33)), observations
    assert all(all(answer["valids"]) for answer in answers)
