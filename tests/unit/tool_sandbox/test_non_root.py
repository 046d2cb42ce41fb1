"""The tool pool as it runs in a pod: the server is not root, so its children share its uid.

There no per-child uid separates a child from the server and from other children: the seccomp
self-only filter and Landlock have to, and RLIMIT_NPROC (which counts every task of a uid) must
not be what decides whether a call may start a thread. The rest of the suite runs the server as
root; here it runs as `nobody` from a virtualenv of Debian's Python 3.11, since an interpreter
under root's home (pyenv) is not reachable by another uid."""

from __future__ import annotations

import pytest
import requests
from harness.sandbox_process import SandboxProcess

NOBODY = 65534


@pytest.fixture(scope="module")
def server(pod_server: SandboxProcess) -> SandboxProcess:
    return pod_server


def test_the_server_is_not_root_and_keeps_every_layer(server: SandboxProcess) -> None:
    sandbox = requests.get(server.url + "/readyz", timeout=30).json()["sandbox"]
    assert sandbox["uidBase"] is None and sandbox["landlockAbi"] > 0 and sandbox["seccomp"] is True
    answer = server.execute("import os\nprint(os.getuid(), os.geteuid())")
    assert answer["status"] == "ok" and answer["stdout"] == f"{NOBODY} {NOBODY}\n", answer


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "PermissionError"),  # its forker
        ("import os, signal\nos.kill(-1, signal.SIGKILL)", "PermissionError"),  # every process of the uid
        ("print(open('/proc/1/environ').read())", "PermissionError"),
        ("import os\nprint(os.listdir(os.path.dirname(os.getcwd())))", "PermissionError"),  # siblings' dirs
    ],
)
def test_a_child_with_the_servers_uid_cannot_reach_it(server: SandboxProcess, code: str, error: str) -> None:
    answer = server.execute(code)
    assert answer["status"] == "error" and error in answer["stderr"], answer
    assert server.execute("print(1 + 1)")["stdout"] == "2\n"


def test_threads_start_while_every_session_slot_is_taken(server: SandboxProcess) -> None:
    """64 live sessions are 64 more processes of the uid; a call must still start threads."""
    sessions = [server.post("/v1/sessions", {"tool": "python"}) for _ in range(64)]
    assert all(response.status_code == 201 for response in sessions), [r.text for r in sessions[-3:]]
    code = (
        "import threading\nthreads = [threading.Thread(target=lambda: None) for _ in range(16)]\n"
        "[t.start() for t in threads]\n[t.join() for t in threads]\nprint('started', len(threads))"
    )
    answer = server.execute(code)
    for response in sessions:  # the server is shared with other modules (conftest.pod_server)
        requests.delete(f"{server.url}/v1/sessions/{response.json()['session']}", timeout=30)
    assert answer["status"] == "ok" and answer["stdout"] == "started 16\n", answer
