"""A real tool_sandbox server (`python -m tool_sandbox serve`) as a child process on a free
loopback port, for tests, benchmarks and the demo.

    with SandboxProcess.start(tmp_path, tools=[{"name": "python", "type": "python"}]) as server:
        server.execute("print(1 + 1)")        # -> the /v1/execute answer
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml
from harness.localcluster.cluster import free_port

PYTHON_TOOL = {"name": "python", "type": "python"}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first, breadth by /proc's order), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def process_state(pid: int) -> str:
    """A process's state letter from /proc (R running, S sleeping, T stopped, Z zombie), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def sysv_objects() -> int:
    """System V shared memory segments, message queues and semaphore sets on the machine."""
    return sum(
        len(Path(f"/proc/sysvipc/{kind}").read_text().splitlines()) - 1 for kind in ("shm", "msg", "sem")
    )


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def workdir_of(server: SandboxProcess) -> Path:
    return server.log.parent / "work"


def recovered(server: SandboxProcess, ipc_before: int | None = None) -> None:
    """After a hostile call: the next call answers correctly within a second, /healthz is 200 and
    nothing of earlier calls is left (System V objects, files, running sandboxed code)."""
    health = requests.get(server.url + "/healthz", timeout=30)
    assert health.status_code == 200, health.text
    seconds = []
    for _ in range(3):  # within a second; the best of three, since other work shares the two cores
        started = time.monotonic()
        answer = server.execute("print(6 * 7)")
        assert (answer["status"], answer["stdout"]) == ("ok", "42\n"), answer
        seconds.append(time.monotonic() - started)
    assert min(seconds) < 1.0, seconds
    if ipc_before is not None:
        assert sysv_objects() == ipc_before
    assert tree_bytes(workdir_of(server)) < 4 << 20  # spares' empty directories only
    deadline = time.monotonic() + 30  # no code runs outside a call: spares wait, sessions are stopped
    children = [p for p in descendants(server.process.pid) if process_name(p) == "sandbox-child"]
    while running := [p for p in children if process_state(p) == "R"]:
        assert time.monotonic() < deadline, f"sandboxed code still running after its call: {running}"
        time.sleep(0.2)


@dataclass
class SandboxProcess:
    url: str  # the tool API, /healthz and /readyz
    metrics_url: str  # /metrics, on a port of its own
    process: subprocess.Popen[bytes]
    log: Path
    python: str = sys.executable  # the interpreter it runs on
    workdir: Path | None = None  # its --workdir

    @classmethod
    def start(
        cls,
        root: Path,
        *args: str,
        tools: list[dict] | None = None,
        config: Path | None = None,
        env: dict[str, str] | None = None,
        ready_seconds: float = 90,
        python: str = sys.executable,
        prefix: tuple[str, ...] = (),
        wait_ready: bool = True,
    ) -> SandboxProcess:
        """Serve `tools` (or the tools.yaml at `config`) with its work directory under `root`;
        `prefix` runs it through another command (e.g. setpriv to run as another uid). Returns
        once it is ready, or at once without `wait_ready`."""
        root.mkdir(parents=True, exist_ok=True)
        if config is None:
            config = root / "tools.yaml"
            config.write_text(yaml.safe_dump({"tools": tools or [PYTHON_TOOL]}))
        port, metrics_port = free_port(), free_port()
        while metrics_port == port:
            metrics_port = free_port()
        log = root / f"sandbox-{port}.log"
        argv = [
            *prefix,
            python,
            "-m",
            "tool_sandbox",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--config",
            str(config),
            "--workdir",
            str(root / "work"),
            *args,
        ]
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
        url = "http://127.0.0.1:{}"
        server = cls(
            url.format(port), url.format(metrics_port) + "/metrics", process, log, python, root / "work"
        )
        deadline = time.monotonic() + ready_seconds
        while wait_ready and not server.ready():
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"tool_sandbox did not become ready; its log:\n{server.log_tail()}")
            time.sleep(0.2)
        return server

    def ready(self) -> bool:
        try:
            return requests.get(self.url + "/readyz", timeout=5).status_code == 200
        except requests.RequestException:  # refused while starting, or slow on a loaded machine
            return False

    def post(self, path: str, body: object, timeout: float = 60) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=timeout)

    def execute(self, code: str, **extra: object) -> dict:
        response = self.post("/v1/execute", {"tool": "python", "input": code, **extra})
        assert response.status_code == 200, response.text
        return response.json()

    def stop(self, grace: float = 15) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
