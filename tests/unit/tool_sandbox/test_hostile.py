"""Hostile code against a real server: each case is contained with a specific status, and the
server answers the next request correctly."""

from __future__ import annotations

import os
import time

import pytest
import requests
from harness.sandbox_process import SandboxProcess


def assert_still_serving(server: SandboxProcess) -> None:
    assert requests.get(server.url + "/healthz", timeout=5).status_code == 200
    result = server.execute("print(6 * 7)")
    assert (result["status"], result["stdout"]) == ("ok", "42\n")


def sandbox_processes(server: SandboxProcess) -> list[int]:
    """This server's sandboxed children (other servers may run on the machine at the same time)."""
    workers = {p for p in _pids() if _is_worker_of(p, server.process.pid)}
    return [p for p in _pids() if _parent(p) in workers]


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


CASES = [
    # (name, code, status, text expected in stdout+stderr+message)
    ("infinite loop", "while True:\n    pass", "timeout", "wall-clock timeout"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", "error", "PermissionError"),
    ("memory bomb at once", "x = bytearray(1 << 34)", "error", "MemoryError"),
    (
        "memory bomb growing",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))",
        "error",
        "MemoryError",
    ),
    (
        "huge file",
        "with open('big', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'x' * (1 << 20))",
        "error",
        "File too large",
    ),  # RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails
    ("read /etc/passwd", "print(open('/etc/passwd').read())", "error", "PermissionError"),
    ("list the root directory", "import os\nprint(os.listdir('/'))", "error", "PermissionError"),
    (
        "socket to another address",
        "import socket\nsocket.socket().connect(('1.1.1.1', 80))",
        "error",
        "PermissionError",
    ),
    (
        "kill the parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "error",
        "PermissionError",
    ),
    (
        "kill every process it can",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",
        "error",
        "PermissionError",
    ),
    (
        "kill its own process group",
        "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)",
        "killed",
        "killed",
    ),
    (
        "ignore SIGTERM",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
        "timeout",
        "wall-clock timeout",
    ),
    (
        "spawn a subprocess",
        "import subprocess\nsubprocess.run(['/bin/echo', 'escaped'])",
        "error",
        "PermissionError",
    ),
    (
        "exec another program",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo escaped'])",
        "error",
        "PermissionError",
    ),
    ("read /proc/1/environ", "print(open('/proc/1/environ', 'rb').read())", "error", "PermissionError"),
    ("ctypes segfault", "import ctypes\nctypes.string_at(0)", "killed", "segmentation fault"),
    ("sys.exit with a code", "import sys\nsys.exit(3)", "error", "exit code 3"),
    ("os._exit", "import os\nos._exit(7)", "error", "exit code 7"),
    ("raise an exception", "raise ValueError('boom')", "error", "ValueError: boom"),
]


@pytest.mark.parametrize(("name", "code", "status", "text"), CASES, ids=[c[0] for c in CASES])
def test_hostile_code_is_contained(
    server: SandboxProcess, name: str, code: str, status: str, text: str
) -> None:
    result = server.execute(code, timeoutSeconds=2)
    seen = result["stdout"] + result["stderr"] + result["message"]
    assert result["status"] == status, result
    assert text in seen, result
    assert "escaped" not in result["stdout"]
    assert_still_serving(server)


def test_clean_exits_are_ok(server: SandboxProcess) -> None:
    for code in ("import sys\nprint('a')\nsys.exit(0)", "import os, sys\nsys.stdout.flush()\nos._exit(0)"):
        assert server.execute(code)["status"] == "ok"


def test_a_gigabyte_of_output_is_cut_and_killed(server: SandboxProcess) -> None:
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)"
    result = server.execute(code, timeoutSeconds=3)
    assert (result["status"], result["truncated"]) == ("killed", True), result["message"]
    assert "output limit exceeded" in result["message"]
    assert len(result["stdout"]) < 4096 + 200 and "[... output truncated:" in result["stdout"]
    assert_still_serving(server)


def test_socket_to_the_servers_own_port(server: SandboxProcess) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    code = f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('connected')"
    result = server.execute(code)
    assert result["status"] == "error" and "PermissionError" in result["stderr"]
    assert "connected" not in result["stdout"]
    assert_still_serving(server)


def test_the_servers_environment_does_not_leak(server: SandboxProcess, secret: str) -> None:
    result = server.execute("import os\nprint(dict(os.environ))")
    assert result["status"] == "ok" and secret not in result["stdout"]
    pid = server.process.pid
    result = server.execute(f"print(open('/proc/{pid}/environ', 'rb').read())")
    assert result["status"] == "error" and "PermissionError" in result["stderr"]
    assert secret not in result["stdout"]


def test_files_outside_the_working_directory_are_unreadable(server: SandboxProcess) -> None:
    result = server.execute(f"print(open({str(server.log)!r}).read())")
    assert result["status"] == "error" and "PermissionError" in result["stderr"]
    inside = server.execute("open('note.txt', 'w').write('hi')\nprint(open('note.txt').read())")
    assert (inside["status"], inside["stdout"]) == ("ok", "hi\n")


def test_threads_die_with_the_timeout(server: SandboxProcess) -> None:
    code = (
        "import threading, time\n"
        "def spin():\n    while True:\n        pass\n"
        "for _ in range(3):\n    threading.Thread(target=spin).start()\n"
        "time.sleep(100)"
    )
    result = server.execute(code, timeoutSeconds=1)
    assert result["status"] == "timeout"
    deadline = time.monotonic() + 5
    while any(_busy(pid) for pid in sandbox_processes(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_busy(pid) for pid in sandbox_processes(server))
    assert_still_serving(server)


def _busy(pid: int) -> bool:
    """True for a sandbox process that is running code (not a spare waiting for work)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "R"
    except FileNotFoundError:
        return False


def test_a_killed_worker_is_restarted(server: SandboxProcess) -> None:
    before = {p for p in _pids() if _is_worker_of(p, server.process.pid)}
    assert before
    victim = min(before)
    os.kill(victim, 9)

    def restarted() -> bool:
        # /readyz turns 200 as soon as one worker serves; /healthz only when every worker runs again
        now = {p for p in _pids() if _is_worker_of(p, server.process.pid)}
        healthy = requests.get(server.url + "/healthz", timeout=30).status_code == 200
        return victim not in now and len(now) == len(before) and healthy

    deadline = time.monotonic() + 240  # a worker's start-up imports numpy: slow on a loaded machine
    while not restarted():
        assert time.monotonic() < deadline, (
            requests.get(server.url + "/healthz", timeout=30).text + server.log.read_text()[-3000:]
        )
        time.sleep(0.5)
    assert_still_serving(server)


def _is_worker_of(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return _parent(pid) == parent and b"tool_sandbox.sandbox.zygote" in cmdline.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
