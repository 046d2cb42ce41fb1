"""The ceiling of a pool's calls: warm fork servers with no isolation and no HTTP.

One server process per CPU (or SERVERS), each with the pool's preload list imported (tool_sandbox's zygote
PRELOAD) and a Unix socket of its own (PATH.0, PATH.1, ...: the client spreads its connections). A
request is a 4-byte big-endian length and the program's text. Each server keeps one forked child
waiting (a spare, as the pool keeps them): the program goes to it through a pipe, it runs the program
as `__main__` with its stdout on another pipe (stderr dropped), and the answer is a 4-byte length and
JSON {"exit": status, "stdout": text} once it has ended; the next spare is forked meanwhile. No sandbox
layer, no workdir, no accounting, no HTTP: what is left is a fork, the program and two pipes, so the
pool's calls/s over this one's is the share of the machine its own layers leave to programs.

Usage: python fork_ceiling.py PATH [SERVERS]   (PATH, holding their number, exists once all accept)"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from tool_sandbox.sandbox.zygote import PRELOAD

HEADER = struct.Struct(">I")
TIMEOUT_SECONDS = 10  # a program past it is killed by its own alarm (SIGALRM: exit -14)


def read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            os._exit(0)  # the server went away
        data += chunk
    return data


def spare(code_in: int, stdout: int) -> None:
    """In the forked child: wait for a program on `code_in`, run it as __main__ with fd 1 on
    `stdout`, then exit with its status."""
    source = read_exactly(code_in, HEADER.unpack(read_exactly(code_in, HEADER.size))[0]).decode()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(stdout, 1)
    os.dup2(devnull, 2)
    os.close(stdout)
    signal.alarm(TIMEOUT_SECONDS)
    status = 0
    try:
        exec(compile(source, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
        status = 1
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(status)


@dataclass
class Spare:
    pid: int
    code_out: int  # the server's end of the pipe the program goes through
    stdout: int  # the server's end of the child's stdout


def fork_spare() -> Spare:
    code_r, code_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(code_w)
        os.close(out_r)
        spare(code_r, out_w)
    os.close(code_r)
    os.close(out_w)
    return Spare(pid, code_w, out_r)


class Server:
    """One process's loop: connections in, programs to the spare, answers out; single-threaded."""

    def __init__(self, listener: socket.socket) -> None:
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, self.accept)
        self.spare = fork_spare()

    def accept(self, listener: socket.socket) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _ = listener.accept()
            self.selector.register(conn, selectors.EVENT_READ, self.reader(conn))

    def reader(self, conn: socket.socket) -> Callable[[socket.socket], None]:
        """The callback of `conn`: it gathers a request, then hands it to the spare."""
        buffer = bytearray()

        def read(_: socket.socket) -> None:
            chunk = conn.recv(1 << 16)
            if not chunk:
                self.selector.unregister(conn)
                conn.close()
                return
            buffer.extend(chunk)
            if len(buffer) >= HEADER.size and len(buffer) >= HEADER.size + HEADER.unpack_from(buffer)[0]:
                size = HEADER.unpack_from(buffer)[0]
                request = bytes(buffer[: HEADER.size + size])
                del buffer[: HEADER.size + size]
                self.run(conn, request)

        return read

    def run(self, conn: socket.socket, request: bytes) -> None:
        child, self.spare = self.spare, None
        os.write(child.code_out, request)  # a pipe takes 64 KiB at once: more than any program here
        os.close(child.code_out)
        chunks: list[bytes] = []

        def collect(_: int) -> None:
            chunk = os.read(child.stdout, 1 << 16)
            if chunk:
                chunks.append(chunk)
                return
            self.selector.unregister(child.stdout)
            os.close(child.stdout)
            _, status = os.waitpid(child.pid, 0)
            stdout = b"".join(chunks).decode(errors="replace")
            answer = json.dumps({"exit": os.waitstatus_to_exitcode(status), "stdout": stdout}).encode()
            conn.setblocking(True)
            conn.sendall(HEADER.pack(len(answer)) + answer)
            conn.setblocking(False)

        self.selector.register(child.stdout, selectors.EVENT_READ, collect)
        self.spare = fork_spare()

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                key.data(key.fileobj)


def main() -> None:
    path = sys.argv[1]
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    servers = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1
    index = servers - 1  # the first process; its forks take 0 ... servers - 2
    for child in range(servers - 1):
        if os.fork() == 0:
            index = child
            break
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.{index}.binding")
    listener.listen(256)
    listener.setblocking(False)
    os.rename(f"{path}.{index}.binding", f"{path}.{index}")  # there once it accepts
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if index == servers - 1:  # the last to bind says all are there
        while not all(os.path.exists(f"{path}.{i}") for i in range(servers)):
            time.sleep(0.05)
        with open(f"{path}.writing", "w") as ready:
            ready.write(str(servers))
        os.rename(f"{path}.writing", path)  # there once it holds the count
    Server(listener).serve()


if __name__ == "__main__":
    main()
