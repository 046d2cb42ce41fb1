"""Issue 24: verdicts a model can game. What an answer says (its status and whose fault a failure
is) comes from what the pool itself observed, never from bytes the code can write; each class is
tested with the server as root (a uid per child) and as in its pod (children share its uid)."""

from __future__ import annotations

import json
import time

import pytest
import requests
from sandbox_process import SandboxProcess, process_state, recovered


@pytest.fixture(scope="module", params=["root", "pod"])
def any_server(request: pytest.FixtureRequest) -> SandboxProcess:
    return request.getfixturevalue("server" if request.param == "root" else "pod_server")


def _frame(message: dict) -> str:
    """Python source writing `message` as the worker's control frame on fd 4."""
    body = json.dumps(message)
    return f"import os, struct\n_b = {body!r}.encode()\nos.write(4, struct.pack('>I', len(_b)) + _b)\n"


def _session(server: SandboxProcess) -> str:
    response = server.post("/v1/sessions", {"tool": "python"})
    assert response.status_code == 201, response.text
    return response.json()["session"]


def test_a_forged_setup_error_is_the_codes_fault_and_stays_out_of_the_log(any_server: SandboxProcess) -> None:
    """A set-up failure frame written by a session's code made that cell and every later cell of
    the trajectory answer `infra` (the trainer excludes such trajectories), and its text went
    into the server's log as lines of their own."""
    forged = "FORGED-7d1e\n2026-01-01 00:00:00 ERROR tool_sandbox: injected line"
    session = _session(any_server)
    answer = any_server.execute(_frame({"setupError": forged}) + "raise ValueError('mine')", session=session)
    assert answer["fault"] == "code" and not answer["sandboxError"], answer
    assert "FORGED" not in answer["message"], answer
    later = any_server.post("/v1/execute", {"tool": "python", "input": "print(1)", "session": session})
    assert later.status_code == 404 or later.json()["fault"] != "infra", later.text
    via_verltool = any_server.post(
        "/get_observation",
        {"trajectory_ids": ["forger"], "actions": [f"<python>{_frame({'setupError': forged})}1/0</python>"]},
    ).json()
    assert via_verltool["faults"] == ["code"], via_verltool
    after = any_server.post(
        "/get_observation", {"trajectory_ids": ["forger"], "actions": ["<python>print(2)</python>"]}
    ).json()
    assert after["faults"] != ["infra"], after
    any_server.post("/get_observation", {"trajectory_ids": ["forger"], "actions": [""], "finish": [True]})
    assert "FORGED" not in any_server.log.read_text(errors="replace")
    recovered(any_server)


def test_a_forged_end_of_cell_ends_nothing(any_server: SandboxProcess) -> None:
    """A "done" frame written by a session's code ended its cell as ok at once; the real end of that
    cell then came during the next one and was taken as the next cell's answer."""
    session = _session(any_server)
    forge = (
        _frame({"done": True, "exitCode": 0, "cell": 2})
        + "import time\ntime.sleep(1.5)\nraise ValueError('late')"
    )
    started = time.monotonic()
    answer = any_server.execute(forge, session=session, timeoutSeconds=5)
    took = time.monotonic() - started
    # The cell ends when its code does (and fails), not when it claims to be done.
    assert answer["status"] == "error" and "ValueError: late" in answer["stderr"], answer
    assert took >= 1.4, took
    nxt = any_server.execute("print(5)", session=session, timeoutSeconds=5)
    assert (nxt["status"], nxt["stdout"]) == ("ok", "5\n"), nxt
    requests.delete(f"{any_server.url}/v1/sessions/{session}", timeout=30)
    recovered(any_server)


def test_a_cell_claimed_done_by_a_stopped_thread_cannot_run_on(any_server: SandboxProcess) -> None:
    """Code that forges its cell's end and stops itself, as the sandbox's own runner does, is then
    answered as it claims; but nothing of it runs after the answer, and its real end, when the next
    cell continues it, ends that session as the code's doing."""
    session = _session(any_server)
    forge = (
        "import os, signal, threading\nprint(os.getpid(), flush=True)\n"
        "threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
        + _frame({"done": True, "exitCode": 0, "cell": 2})
        + "os.kill(os.getpid(), signal.SIGSTOP)\nraise ValueError('late')"
    )
    answer = any_server.execute(forge, session=session, timeoutSeconds=3)
    assert answer["status"] == "ok", answer  # as the code claimed, at the moment it froze itself
    pid = int(answer["stdout"])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # its spinning thread never runs after the answer
        assert process_state(pid) == "T", (
            f"session code not stopped after its cell ended: {process_state(pid)}"
        )
        time.sleep(0.2)
    after = any_server.execute("print(1)", session=session, timeoutSeconds=2)
    assert after["status"] in ("killed", "timeout") and after["fault"] == "code", after
    assert after["status"] != "killed" or "control pipe" in after["message"], after
    recovered(any_server)
