"""A real tool-sandbox server process on a free loopback port (no cluster needed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

SECRET = "toolrl-test-secret-6f1c"
CORPUS = [
    {
        "id": "1",
        "title": "Python",
        "contents": "Python is a programming language created by Guido van Rossum.",
    },
    {
        "id": "2",
        "title": "Kubernetes",
        "contents": "Kubernetes schedules containers onto nodes in a cluster.",
    },
    {"id": "3", "title": "Paris", "contents": "Paris is the capital and largest city of France."},
]


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def post(self, path: str, body: object, timeout: float = 60) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=timeout)

    def execute(self, code: str, **extra: object) -> dict:
        response = self.post("/v1/execute", {"tool": "python", "input": code, **extra})
        assert response.status_code == 200, response.text
        return response.json()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(tmp: Path, *args: str, tools: list[dict] | None = None) -> Server:
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(doc) for doc in CORPUS))
    config = tmp / "tools.yaml"
    config.write_text(
        json.dumps(
            {
                "tools": tools
                or [
                    {
                        "name": "python",
                        "type": "python",
                        "timeoutSeconds": 3,
                        "memoryLimitMiB": 256,
                        "maxOutputBytes": 4096,
                    },
                    {"name": "search", "type": "search", "corpus": str(corpus), "topK": 2},
                ]
            }
        )
    )
    port = free_port()
    log = tmp / f"server-{port}.log"
    env = {**os.environ, "TOOLRL_TEST_SECRET": SECRET}
    process = subprocess.Popen(
        [
            sys.executable,
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
            str(tmp / "work"),
            *args,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if requests.get(server.url + "/readyz", timeout=1).status_code == 200:
                return server
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError("server not ready in 90 s:\n" + log.read_text())


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("sandbox"))
    yield running
    stop_server(running)


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start a server with extra CLI flags (and tools); stopped after the test."""
    started: list[Server] = []

    def make(*args: str, tools: list[dict] | None = None) -> Server:
        started.append(start_server(tmp_path, *args, tools=tools))
        return started[-1]

    yield make
    for running in started:
        stop_server(running)


@pytest.fixture
def secret() -> str:
    return SECRET
