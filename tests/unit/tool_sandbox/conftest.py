"""A real tool-sandbox server process on a free loopback port (no cluster needed)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier

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


def start_server(
    tmp: Path,
    *args: str,
    tools: list[dict] | None = None,
    env: dict[str, str] | None = None,
    **process: object,
) -> SandboxProcess:
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
    environment = {"TOOLRL_TEST_SECRET": SECRET, **(env or {})}
    return SandboxProcess.start(tmp, *args, tools=tools or default_tools, env=environment, **process)  # type: ignore[arg-type]


@contextlib.contextmanager
def searchable_directory(prefix: str) -> Iterator[Path]:
    """A temporary directory the children's own uids (as root) may pass through, as /tmp in the
    pod: a program opens its main.py by its absolute path (tracebacks, inspect). pytest's own
    temporary directories are 0700."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
@process_tier
def server() -> Iterator[SandboxProcess]:
    with searchable_directory("toolrl-sandbox-") as root:
        running = start_server(root)
        yield running
        running.stop()


@pytest.fixture
@process_tier
def make_server(tmp_path: Path) -> Iterator[Callable[..., SandboxProcess]]:
    """Start a server with extra CLI flags (and tools, or SandboxProcess.start's options such as
    `prefix`); stopped after the test."""
    started: list[SandboxProcess] = []

    def make(*args: str, tools: list[dict] | None = None, **process: object) -> SandboxProcess:
        started.append(start_server(tmp_path, *args, tools=tools, **process))
        return started[-1]

    yield make
    for running in started:
        running.stop()


@pytest.fixture
def secret() -> str:
    return SECRET


REPO = Path(__file__).resolve().parents[3]
NOBODY = 65534
INTERPRETER = "/usr/bin/python3.11"  # Debian's python3.11 (+ python3.11-dev for the C extension)


def debian_venv(root: Path) -> str:
    """A virtualenv of Debian's Python 3.11 with tool_sandbox installed, under `root`; returns its
    interpreter. An interpreter under root's home (pyenv) is reachable by no other uid: neither a
    non-root server nor, as root, the children's own uids could import from it."""
    assert os.access(INTERPRETER, os.X_OK), f"needs {INTERPRETER}: apt-get install python3.11 python3.11-dev"
    uv = shutil.which("uv")
    assert uv, "needs uv (scripts/setup.sh installs it)"
    venv = root / "venv"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run([uv, "venv", "-q", "--python", INTERPRETER, str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    install = [uv, "pip", "install", "-q", "--python", python, str(REPO / "tool_sandbox")]
    subprocess.run(install, check=True, env=env, timeout=900)
    os.chmod(root, 0o755)
    return python


@pytest.fixture(scope="session")
@process_tier
def debian_python() -> Iterator[str]:
    """debian_venv once per test session (shared by the pod server and the root one below)."""
    root = Path(tempfile.mkdtemp(prefix="toolrl-debian-venv-"))
    try:
        yield debian_venv(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def non_root_server(
    *args: str, tools: list[dict] | None = None, python: str | None = None
) -> Iterator[SandboxProcess]:
    """The pool as in its pod: the server runs as `nobody`, so its children share its uid. From
    `python` (a debian_venv interpreter; one is made if None)."""
    assert os.geteuid() == 0, "this test starts the server as another uid: run it as root (as CI does)"
    root = Path(tempfile.mkdtemp(prefix="toolrl-non-root-"))
    try:
        python = python or debian_venv(root)
        os.chmod(root, 0o755)
        work = root / "server"
        work.mkdir()
        os.chown(work, NOBODY, NOBODY)
        as_nobody = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
        running = start_server(
            work, *args, tools=tools, python=python, prefix=as_nobody, env={"TMPDIR": str(work)}
        )
        try:
            yield running
        finally:
            running.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
@process_tier
def make_pod_server(debian_python: str) -> Iterator[Callable[..., SandboxProcess]]:
    """Start a server as in its pod (non_root_server, on the session's debian_python) with extra CLI
    flags; stopped after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda *args, tools=None: stack.enter_context(
            non_root_server(*args, tools=tools, python=debian_python)
        )


@pytest.fixture(scope="session")
@process_tier
def pod_server(debian_python: str) -> Iterator[SandboxProcess]:
    """A server as in the pool's pod (non-root, children share its uid), shared by the modules."""
    with non_root_server(python=debian_python) as running:
        yield running


@pytest.fixture(scope="session")
@process_tier
def debian_root_server(debian_python: str) -> Iterator[SandboxProcess]:
    """As root (each child a uid of its own), on the Debian interpreter of the pod server: the
    children can read its standard library (pyenv's, under a 0700 /root, only preloaded modules)."""
    with searchable_directory("toolrl-debian-root-") as root:
        running = start_server(root, python=debian_python)
        try:
            yield running
        finally:
            running.stop()


@contextlib.contextmanager
def _server_in_mode(
    mode: str, *args: str, tools: list[dict] | None = None, python: str | None = None
) -> Iterator[SandboxProcess]:
    if mode == "pod":
        with non_root_server(*args, tools=tools, python=python) as running:
            yield running
        return
    with searchable_directory("toolrl-sandbox-") as root:
        running = start_server(root, *args, tools=tools, **({"python": python} if python else {}))
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture(scope="session")
def server_in_mode() -> Callable[..., contextlib.AbstractContextManager[SandboxProcess]]:
    """`server_in_mode(mode, *flags, tools=..., python=...)`: a context manager running a server as
    root ("root": a uid per child) or as in its pod ("pod": non_root_server), from `python` (a
    debian_python, whose standard library the children's uids can read)."""
    return _server_in_mode
