"""The ceiling of a pool's calls: warm fork servers with no isolation and no HTTP.

One process per CPU, each with the pool's preload list imported (tool_sandbox's zygote PRELOAD), all
accepting on one Unix socket. A request is a 4-byte big-endian length and the program's text; the
server forks a child that runs the program as `__main__` with its stdout on a pipe (stderr dropped),
and answers with a 4-byte length and JSON {"exit": status, "stdout": text} once the child has ended.
No sandbox layer, no workdir, no accounting, no HTTP: what is left is a fork, the program and a pipe,
so the pool's calls/s over this one's is the share of the machine its own layers leave to programs.

Usage: python fork_ceiling.py SOCKET_PATH   (the socket exists once it accepts)"""

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
import traceback
from collections.abc import Callable

from tool_sandbox.sandbox.zygote import PRELOAD

HEADER = struct.Struct(">I")
TIMEOUT_SECONDS = 10  # a program past it is killed by its own alarm (SIGALRM: exit -14)


def run_child(source: str, stdout: int) -> None:
    """In the forked child: run `source` as __main__ with fd 1 on `stdout`, then exit with its status."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(stdout, 1)
    os.dup2(devnull, 2)
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


class Server:
    """One process's loop: connections in, children forked, answers out; single-threaded (selectors)."""

    def __init__(self, listener: socket.socket) -> None:
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, self.accept)

    def accept(self, listener: socket.socket) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _ = listener.accept()
            self.selector.register(conn, selectors.EVENT_READ, self.reader(conn))

    def reader(self, conn: socket.socket) -> Callable[[socket.socket], None]:
        """The callback of `conn`: it gathers a request, then forks its child."""
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
                source = bytes(buffer[HEADER.size : HEADER.size + size]).decode()
                del buffer[: HEADER.size + size]
                self.fork(conn, source)

        return read

    def fork(self, conn: socket.socket, source: str) -> None:
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            run_child(source, out_w)
        os.close(out_w)
        chunks: list[bytes] = []

        def collect(_: int) -> None:
            chunk = os.read(out_r, 1 << 16)
            if chunk:
                chunks.append(chunk)
                return
            self.selector.unregister(out_r)
            os.close(out_r)
            _, status = os.waitpid(pid, 0)
            stdout = b"".join(chunks).decode(errors="replace")
            answer = json.dumps({"exit": os.waitstatus_to_exitcode(status), "stdout": stdout}).encode()
            conn.setblocking(True)
            conn.sendall(HEADER.pack(len(answer)) + answer)
            conn.setblocking(False)

        self.selector.register(out_r, selectors.EVENT_READ, collect)

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                key.data(key.fileobj)


def main() -> None:
    path = sys.argv[1]
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".binding")
    listener.listen(256)
    listener.setblocking(False)
    for _ in range((os.cpu_count() or 1) - 1):
        if os.fork() == 0:
            break
    else:
        os.rename(path + ".binding", path)  # every process listens: the socket is ready
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    Server(listener).serve()


if __name__ == "__main__":
    main()
