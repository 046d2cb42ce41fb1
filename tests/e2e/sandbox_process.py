"""A real tool_sandbox server (`python -m tool_sandbox serve`) as a child process on a free
loopback port, for tests, benchmarks and the demo.

    with SandboxProcess.start(tmp_path, tools=[{"name": "python", "type": "python"}]) as server:
        server.execute("print(1 + 1)")        # -> the /v1/execute answer
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml
from localcluster.cluster import free_port

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


@dataclass
class SandboxProcess:
    url: str
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
    ) -> SandboxProcess:
        """Serve `tools` (or the tools.yaml at `config`) with its work directory under `root`;
        `prefix` runs it through another command (e.g. setpriv to run as another uid)."""
        root.mkdir(parents=True, exist_ok=True)
        if config is None:
            config = root / "tools.yaml"
            config.write_text(yaml.safe_dump({"tools": tools or [PYTHON_TOOL]}))
        port = free_port()
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
        server = cls(f"http://127.0.0.1:{port}", process, log, python, root / "work")
        deadline = time.monotonic() + ready_seconds
        while not server.ready():
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
