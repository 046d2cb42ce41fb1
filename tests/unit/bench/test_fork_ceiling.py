"""bench/tool_sandbox/fork_ceiling.py, the ceiling the pool's calls/s are measured against: its warm
fork servers answer each program with the program's own exit status and stdout, as the pool's verdict
needs them, whatever the program does to its own process."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[3] / "bench" / "tool_sandbox" / "fork_ceiling.py"
HEADER = struct.Struct(">I")
SERVERS = 2  # each imports numpy and sympy


@pytest.fixture
def ceiling(tmp_path: Path):
    path = tmp_path / "ceiling.sock"
    server = subprocess.Popen([sys.executable, str(SERVER), str(path), str(SERVERS)], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not path.exists():
            assert server.poll() is None and time.monotonic() < deadline, "the ceiling never listened"
            time.sleep(0.1)
        yield str(path)  # it holds the number of servers, each on its own socket PATH.N
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(20)


def run(path: str, code: str) -> dict:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(path)
        conn.sendall(HEADER.pack(len(code.encode())) + code.encode())
        got = b""
        while len(got) < HEADER.size or len(got) < HEADER.size + HEADER.unpack_from(got)[0]:
            chunk = conn.recv(1 << 16)
            assert chunk, f"the ceiling closed the connection: {got!r}"
            got += chunk
        return json.loads(got[HEADER.size :])


def test_each_program_is_answered_with_its_own_exit_status_and_stdout(ceiling: str) -> None:
    servers = [f"{ceiling}.{i}" for i in range(int(Path(ceiling).read_text()))]
    assert len(servers) == SERVERS
    for server in servers:
        assert run(server, "import numpy; print(numpy.arange(10).sum())") == {"exit": 0, "stdout": "45\n"}
        assert run(server, "print('a'); assert 1 == 2") == {"exit": 1, "stdout": "a\n"}
        assert run(server, "import sys; sys.exit(3)")["exit"] == 3
        assert run(server, "import os; os._exit(0)")["exit"] == 0
        # a program's changes to its own process stay in its child: the next starts from the warm state
        assert run(server, "import sys; sys.modules.clear(); x = 1")["exit"] == 0
        assert run(server, "print(1+1)") == {"exit": 0, "stdout": "2\n"}
