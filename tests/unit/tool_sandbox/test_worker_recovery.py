"""A worker outlives what its children and callers do to it: a stopped session child, garbage on
the control pipe, files it cannot place; a worker that stops answering is restarted."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest
import requests
from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.tools.python import PythonTool


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
