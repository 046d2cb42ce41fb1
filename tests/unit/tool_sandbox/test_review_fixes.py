"""Regression tests for the review findings, each against a real server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from harness.localcluster.cluster import free_port
from harness.sandbox_process import SandboxProcess
from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.sandbox import wire
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.tools.python import PythonTool


def _run_code(files: object, code: str = "print(open('a').read())") -> dict:
    return {"code": code, "language": "python", "files": files}


def test_bad_files_get_400_and_never_use_up_slots(server: SandboxProcess) -> None:
    cases = {
        "not valid base64": {"a": "%%%not-base64"},
        "must be a base64 string": {"a": 12},
        "cannot be a file and a directory": {"a": "", "a/b": ""},
        "relative file path": {"../x": ""},
    }
    for _ in range(40):  # more bad requests than a worker has slots
        for expected, files in cases.items():
            response = server.post("/run_code", _run_code(files))
            assert response.status_code == 400, response.text
            assert expected in response.json()["error"]
    good = {"a": base64.b64encode(b"still fine").decode(), "d/b": ""}
    result = server.post("/run_code", _run_code(good)).json()
    assert result["status"] == "Success", result
    assert result["run_result"]["stdout"] == "still fine\n"


def test_nan_and_infinite_timeouts_are_rejected(server: SandboxProcess) -> None:
    for raw, expected in (
        ('{"tool": "python", "input": "1", "timeoutSeconds": NaN}', "NaN"),
        ('{"tool": "python", "input": "1", "timeoutSeconds": Infinity}', "Infinity"),
        ('{"tool": "python", "input": "1", "timeoutSeconds": 1e400}', "positive finite number"),
        ('{"code": "1", "language": "python", "run_timeout": 1e400}', "finite number"),
    ):
        path = "/run_code" if "language" in raw else "/v1/execute"
        response = requests.post(server.url + path, data=raw, timeout=30)
        assert response.status_code == 400, response.text
        assert expected in response.json()["error"]


def test_a_stopped_session_child_cannot_freeze_its_worker(make_server: object) -> None:
    server = make_server("--workers", "1")
    session = server.post("/v1/sessions", {"tool": "python"}).json()["session"]
    stop_soon = (
        "import os, signal, threading; threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGSTOP)).start()"
    )
    assert server.execute(stop_soon, session=session)["status"] == "ok"
    server.execute("import time; time.sleep(1)")  # the session child has stopped itself by now
    # Between cells the worker itself stops a session (issue 14, class 8) and continues it with
    # the next cell: the timer fires then, during the sleep, so the child stops itself mid-cell.
    big_cell = "x = 1\n" + "#" * (256 << 10) + "\nimport time\ntime.sleep(0.5)\nprint(x)"
    answer = server.execute(big_cell, session=session, timeoutSeconds=1)
    assert answer["status"] == "timeout", answer
    assert server.execute("print(1 + 1)")["stdout"] == "2\n"
    health = requests.get(server.url + "/healthz", timeout=30)
    assert health.status_code == 200 and health.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "garbage",
    [
        "b'\\xff\\xff\\xff\\xff'",  # a frame header announcing 4 GiB
        "b'\\x00\\x00\\x00\\x03abc'",  # not JSON
        "b'\\x00\\x00\\x00\\x02[]'",  # JSON, not an object
        'b\'\\x00\\x00\\x00\\x19{"done":1,"exitCode":"x"}\'',  # a forged end with a bad exit code
    ],
)
def test_code_writing_on_the_control_pipe_ends_only_its_session(make_server: object, garbage: str) -> None:
    """A session's child keeps its control pipe (fd 4) open; what the code writes there must end
    that session, never the worker with every call and session it holds."""
    server = make_server("--workers", "1")
    bystander = server.post("/v1/sessions", {"tool": "python"}).json()["session"]
    assert server.execute("kept = 41", session=bystander)["status"] == "ok"
    session = server.post("/v1/sessions", {"tool": "python"}).json()["session"]
    answer = server.execute(f"import os, time\nos.write(4, {garbage})\ntime.sleep(5)", session=session)
    assert answer["status"] == "killed", answer
    assert "control pipe" in answer["message"], answer
    assert server.execute("print(kept + 1)", session=bystander)["stdout"] == "42\n"
    assert server.execute("print(1 + 1)")["stdout"] == "2\n"


def test_readiness_fails_without_landlock_unless_allowed(make_server: object, tmp_path: Path) -> None:
    allowed = make_server("--no-landlock", "--allow-no-landlock")
    body = requests.get(allowed.url + "/readyz", timeout=10).json()
    assert body["ready"] is True and body["sandbox"]["landlockAbi"] == 0
    port = free_port()
    argv = [sys.executable, "-m", "tool_sandbox", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--workdir", str(tmp_path / "work"), "--no-landlock"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until the workers reported their layers (before: "starting")
            assert process.poll() is None
            with contextlib.suppress(requests.ConnectionError):
                response = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                if not response.json().get("problem", "starting").startswith("starting"):
                    break
            time.sleep(0.2)
        assert response.status_code == 503
        assert "--allow-no-landlock" in response.json()["problem"]
    finally:
        process.terminate()
        process.wait(15)


def test_fetch_files_are_capped_in_number_and_total_bytes(server: SandboxProcess) -> None:
    too_many = {"code": "", "language": "python", "fetch_files": [f"f{i}" for i in range(65)]}
    response = server.post("/run_code", too_many)
    assert response.status_code == 400 and "at most 64" in response.json()["error"]
    code = "for name in 'abc':\n    open(name, 'wb').write(b'x' * (7 << 20))"
    body = {"code": code, "language": "python", "fetch_files": ["a", "b", "c"]}
    result = server.post("/run_code", body).json()
    assert result["status"] == "Success", result
    sizes = {name: len(base64.b64decode(data)) for name, data in result["files"].items()}
    assert sizes == {"a": 7 << 20, "b": 7 << 20, "c": 2 << 20}  # 16 MiB in all (zygote.FETCH_BUDGET_BYTES)


def test_a_call_cannot_fill_the_disk(server: SandboxProcess) -> None:
    write = "for i in range(3):\n    open(f'f{i}', 'wb').write(b'x' * (15 << 20))\n"
    for code in (write, write + "import time\ntime.sleep(2.5)\nprint('not reached')"):
        result = server.execute(code)
        assert result["status"] == "killed", result
        assert f"wrote more than {32 << 20} bytes" in result["message"]
        assert "not reached" not in result["stdout"]
    session = server.post("/v1/sessions", {"tool": "python"}).json()["session"]
    result = server.execute(write, session=session)
    assert result["status"] == "killed" and "wrote more than" in result["message"], result
    gone = server.post("/v1/execute", {"tool": "python", "input": "1", "session": session})
    assert gone.status_code == 404, gone.text  # the session's process was killed with it
    assert server.execute("print(1 + 1)")["stdout"] == "2\n"


def test_concurrent_first_steps_of_one_trajectory_share_one_session(make_server: object) -> None:
    server = make_server("--max-sessions", "2")
    step = "<python>count = globals().get('count', 0) + 1\nprint(count)</python>"
    body = {"trajectory_ids": ["same"] * 8, "actions": [step] * 8}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: server.post("/get_observation", body).json(), range(4)))
    observations = [o for answer in answers for o in answer["observations"]]
    assert sorted(int(o) for o in observations) == list(range(1, 33)), observations
    assert all(all(answer["valids"]) for answer in answers)


def test_http_tool_keeps_one_deadline_across_retries(make_server: object) -> None:
    attempts: list[str] = []

    class SlowBusy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            attempts.append(self.path)
            time.sleep(0.6)
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), SlowBusy)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{upstream.server_address[1]}/api"
        tool = {"name": "api", "type": "http", "url": url, "timeoutSeconds": 1, "retryDelaySeconds": 0.5}
        server = make_server(tools=[tool])
        result = server.post("/v1/execute", {"tool": "api", "input": {"q": 1}}).json()
    finally:
        upstream.shutdown()
    # 0.6 s answer + 0.5 s pause would pass the 1 s deadline: no retry (4 attempts before the fix)
    assert result["status"] == "timeout", result
    assert "no time left for a retry within 1.0s" in result["message"]
    assert attempts == ["/api"]


async def test_a_worker_survives_files_it_cannot_place(tmp_path: Path) -> None:
    """Past the HTTP validation: the worker itself kills the child and answers, slot freed."""
    settings = dataclasses.replace(
        ServerSettings(), workers=1, capacity=2, max_sessions=1, workdir=str(tmp_path / "work")
    )
    pool = Pool(settings)
    await pool.start()
    try:
        await pool.wait_ready(90)
        tool = PythonTool(ToolConfig(name="python", type="python"), pool, settings)
        bad = ({"a": "", "a/b": ""}, {"a": "%%"}, {"a": 5}, {"../x": ""}, {"\ud800": ""}, {"x" * 300: ""})
        for files in bad * 10:  # 60 calls, more than the worker's 15 slots
            result = await tool.run("print(1)", 5.0, files=files)  # type: ignore[arg-type]
            assert result.status == "error" and "could not place files" in result.message, result
        good = await tool.run("print(open('d/a').read())", 5.0, files={"d/a": "aGk="})
        assert (good.status, good.stdout) == ("ok", "hi\n")
    finally:
        await pool.close()


def _worker_pids(server_pid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            is_worker = b"tool_sandbox.sandbox.zygote" in (entry / "cmdline").read_bytes()
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if is_worker and parent == server_pid:
                pids.append(int(entry.name))
    return pids


def test_healthz_fails_for_a_silent_worker_and_restarts_it(make_server: object) -> None:
    server = make_server("--workers", "1")
    (worker,) = _worker_pids(server.process.pid)
    os.kill(worker, signal.SIGSTOP)
    health = requests.get(server.url + "/healthz", timeout=60)
    assert health.status_code == 503, health.text
    assert "did not answer within 5s" in health.json()["problems"][0]
    for _ in range(600):  # the supervisor starts a new worker
        if requests.get(server.url + "/healthz", timeout=60).status_code == 200 and server.ready():
            break
        time.sleep(0.2)
    assert _worker_pids(server.process.pid) != [worker]
    assert server.execute("print(1 + 1)")["stdout"] == "2\n"


async def test_the_server_refuses_a_frame_over_max_frame() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data((wire.MAX_FRAME + 1).to_bytes(4, "big") + b"{}")
    with pytest.raises(ValueError, match="exceeds"):
        await wire.read_stream_frame(stream)
