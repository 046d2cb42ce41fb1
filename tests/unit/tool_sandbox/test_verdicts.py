"""Issue 24: verdicts a model can game. What an answer says (its status and whose fault a failure
is) comes from what the pool itself observed, never from bytes the code can write; each class is
tested with the server as root (a uid per child) and as in its pod (children share its uid)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyseccomp
import pytest
import requests
from harness.sandbox_process import SandboxProcess, descendants, process_state, recovered
from tool_sandbox.config import ToolConfig


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


TASKS = ToolConfig(name="python", type="python").max_processes  # the test servers' tools keep the default
THREAD_BOMB = """
import threading
threading.stack_size(32768)
hold = threading.Event()
started = []

def start(count):
    try:
        for _ in range(count):
            threading.Thread(target=hold.wait, daemon=True).start()
            started.append(1)
    except RuntimeError:
        pass

creators = [threading.Thread(target=start, args=({per},)) for _ in range({creators})]
[c.start() for c in creators]
start({per})
[c.join() for c in creators]
print(len(started) + len(creators) + 1)
{hold}
"""


def test_one_call_cannot_take_every_task_of_the_pod(any_server: SandboxProcess) -> None:
    """Threads with small stacks: one call took every pid of the pod (no limit where children share
    the server's uid) and ordinary calls around it failed, blamed on their code."""
    bomb = THREAD_BOMB.format(per=1500, creators=0, hold="import time\ntime.sleep(2)")
    with ThreadPoolExecutor(9) as pool:
        taken = pool.submit(any_server.execute, bomb, timeoutSeconds=10)  # holds its threads for 2 s
        ordinary = [pool.submit(any_server.execute, f"print({i})") for i in range(8)]
        answers = [call.result() for call in ordinary]
        bomb_answer = taken.result()
    assert bomb_answer["status"] == "ok", bomb_answer
    most = int(bomb_answer["stdout"])
    assert most <= TASKS, f"one call ran {most} tasks, more than its {TASKS}"
    assert [(a["status"], a["stdout"]) for a in answers] == [("ok", f"{i}\n") for i in range(8)], answers
    # Threads started from several threads at once: still bounded (twice the limit at worst).
    concurrent = any_server.execute(THREAD_BOMB.format(per=400, creators=4, hold=""), timeoutSeconds=10)
    assert concurrent["status"] == "ok" and int(concurrent["stdout"]) <= 2 * TASKS, concurrent
    assert any_server.execute(THREAD_BOMB.format(per=10, creators=0, hold=""))["stdout"] == "11\n"
    recovered(any_server)


def _cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(",") or controllers == "":
            return path
    return "/"


@contextlib.contextmanager
def pods_pid_limit(server: SandboxProcess, headroom: int) -> Iterator[None]:
    """The server and everything under it in a pids cgroup allowing `headroom` more tasks than it
    runs now, as a pod under the kubelet's pod pids limit; moved back afterwards."""
    v1 = Path("/sys/fs/cgroup/pids")
    root = v1 if (v1 / "cgroup.procs").exists() else Path("/sys/fs/cgroup")
    if root != v1 and "pids" not in (root / "cgroup.subtree_control").read_text().split():
        (root / "cgroup.subtree_control").write_text("+pids")  # cgroup v2: enable the controller (root)
    home = root / _cgroup_of(os.getpid()).lstrip("/")
    group = root / f"toolrl-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()

    def move(into: Path) -> None:
        for pid in [server.process.pid, *descendants(server.process.pid)]:
            with contextlib.suppress(OSError):  # gone meanwhile
                (into / "cgroup.procs").write_text(str(pid))

    try:
        move(group)
        move(group)  # children forked while moving
        (group / "pids.max").write_text(str(int((group / "pids.current").read_text()) + headroom))
        yield
    finally:
        (group / "pids.max").write_text("max")
        for _ in range(50):
            move(home)
            if not (group / "cgroup.procs").read_text().split():
                break
            time.sleep(0.1)
        group.rmdir()


def test_a_fork_that_fails_is_the_pools_fault(any_server: SandboxProcess) -> None:
    """When the pod's pids are used up, a call whose sandbox process cannot be forked failed with
    fault "code" ("sandbox process vanished"): the trainer then scored innocent code."""
    hold = THREAD_BOMB.format(per=10000, creators=0, hold="")  # its threads wait while the session lives
    sessions = [_session(any_server) for _ in range(3)]
    with pods_pid_limit(any_server, headroom=2 * TASKS):
        for session in sessions:  # each within its own limit; together they use up the pod's pids
            any_server.execute(hold, session=session, timeoutSeconds=10)
        with ThreadPoolExecutor(16) as pool:  # more at once than there are children forked ahead
            answers = list(
                pool.map(lambda i: any_server.execute(f"import time\ntime.sleep(1)\nprint({i})"), range(16))
            )
        blamed = [a for a in answers if a["status"] != "ok" and a["fault"] != "infra"]
        failed = [a for a in answers if a["status"] != "ok"]
        for session in sessions:
            requests.delete(f"{any_server.url}/v1/sessions/{session}", timeout=30)
    assert failed, "no fork failed: the test did not use up the pids"
    assert not blamed, blamed
    assert all(a["sandboxError"] and "could not start a sandbox process" in a["message"] for a in failed), (
        failed
    )
    deadline = time.monotonic() + 30  # the workers say they could not fork for a few seconds more
    while requests.get(any_server.url + "/healthz", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "still unhealthy after the pids came back"
        time.sleep(0.5)
    recovered(any_server)


@pytest.mark.parametrize("mode", ["root", "pod"])
def test_all_calls_together_stay_within_the_pods_task_budget(
    mode: str, make_server: Callable[..., SandboxProcess], make_pod_server: Callable[..., SandboxProcess]
) -> None:
    """Each call within its own limit, many calls together could still take every pid of the pod
    (Kubernetes has no pod field for a pids limit); past the pool's budget a thread is refused, and
    a call that fails for it is the pool's fault, not its code's."""
    budget = 3 * TASKS
    server = (make_server if mode == "root" else make_pod_server)(
        "--workers", "1", "--max-tasks", str(budget)
    )
    sessions = [_session(server) for _ in range(4)]
    held = [server.execute(THREAD_BOMB.format(per=1000, creators=0, hold=""), session=s) for s in sessions]
    assert all(h["status"] == "ok" for h in held), held
    assert sum(int(h["stdout"]) for h in held) <= budget, [h["stdout"] for h in held]
    needs_threads = "import threading\nfor _ in range(4):\n    threading.Thread(target=print).start()"
    refused = server.execute(needs_threads)
    assert (refused["status"], refused["fault"]) == ("error", "infra"), refused
    assert "--max-tasks" in refused["message"], refused
    for session in sessions:
        requests.delete(f"{server.url}/v1/sessions/{session}", timeout=30)
    assert server.execute(needs_threads)["status"] == "ok"


def test_kernel_state_beyond_the_call_cannot_be_reached(any_server: SandboxProcess) -> None:
    """Native AIO (io_setup) reserved the machine-wide fs.aio-max-nr (a session held it between
    cells); socketpair() + sendto() reached writable pathname datagram sockets outside the
    call's directory. Sockets inside the call keep working (asyncio's self-pipe)."""
    outside = Path(tempfile.mkdtemp(prefix="toolrl-outside-"))  # reachable by every uid
    outside.chmod(0o755)
    path = outside / "listener.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    path.chmod(0o777)
    receiver.settimeout(0.5)
    io_setup = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "io_setup"))
    code = (
        "import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\nresults = []\n"
        f"made = libc.syscall({io_setup}, 128, ctypes.byref(ctypes.c_ulong(0))) == 0\n"
        "results.append('made' if made else ctypes.get_errno())\n"
        "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        f"for attempt in (lambda: a.sendto(b'escaped', {str(path)!r}), lambda: a.connect({str(path)!r}),"
        f" lambda: a.sendmsg([b'escaped'], [], 0, {str(path)!r}), lambda: a.bind('\\0toolrl-squat')):\n"
        "    try:\n        attempt()\n        results.append('allowed')\n"
        "    except OSError as exc:\n        results.append(exc.errno)\n"
        "a.send(b'pair')\nresults.append(b.recv(16).decode())\n"
        "import asyncio\nresults.append(asyncio.run(asyncio.sleep(0, 'loop')))\nprint(results)"
    )
    try:
        answer = any_server.execute(code)
        with contextlib.suppress(TimeoutError):
            assert receiver.recv(64) == b"", "a datagram reached a socket outside the call's directory"
    finally:
        receiver.close()
        shutil.rmtree(outside)
    assert answer["stdout"] == f"{[1, 1, 1, 1, 1, 'pair', 'loop']}\n", answer  # EPERM each time
    recovered(any_server)
