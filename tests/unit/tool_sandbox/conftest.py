"""A real tool-sandbox server process on a free loopback port (no cluster needed)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sandbox_process import SandboxProcess

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


def start_server(tmp: Path, *args: str, tools: list[dict] | None = None) -> SandboxProcess:
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(doc) for doc in CORPUS))
    default_tools = [
        {
            "name": "python",
            "type": "python",
            "timeoutSeconds": 3,
            "memoryLimitMiB": 256,
            "maxOutputBytes": 4096,
        },
        {"name": "search", "type": "search", "corpus": str(corpus), "topK": 2},
    ]
    return SandboxProcess.start(tmp, *args, tools=tools or default_tools, env={"TOOLRL_TEST_SECRET": SECRET})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    running = start_server(tmp_path_factory.mktemp("sandbox"))
    yield running
    running.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., SandboxProcess]]:
    """Start a server with extra CLI flags (and tools); stopped after the test."""
    started: list[SandboxProcess] = []

    def make(*args: str, tools: list[dict] | None = None) -> SandboxProcess:
        started.append(start_server(tmp_path, *args, tools=tools))
        return started[-1]

    yield make
    for running in started:
        running.stop()


@pytest.fixture
def secret() -> str:
    return SECRET
