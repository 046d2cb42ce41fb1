"""The forker: the one process that forks, signals and reaps sandboxed children.

It is forked once from the fully preloaded worker (zygote.py) and kept apart from the worker's
bookkeeping, so its memory is hardly written between forks and stays in huge pages
(memory.collapse_heap): each fork then copies a few dozen page-table entries instead of ~14,000.
Being the only one that reaps, it is also the only one that signals, so a pid is never signalled
after it was reaped (and possibly reused).

Messages on a SOCK_SEQPACKET pair, one JSON object each:
  worker -> forker  {"op": "spawn", "slot", "workdir", "uid"} with 4 fds (request read end;
                    stdout, stderr and control write ends), or {"op": "kill", "slot"};
  forker -> worker  {"slot", "status", "cpu"} once that slot's child has exited (status None if
                    it could not be forked)."""

from __future__ import annotations

import array
import contextlib
import dataclasses
import json
import os
import selectors
import signal
import socket
from typing import Any

from tool_sandbox.sandbox import child, layers, memory
from tool_sandbox.sandbox.libc import PR_SET_PDEATHSIG, libc

_FDS_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize)


def _ints(blob: bytes) -> list[int]:
    fds = array.array("i")
    fds.frombytes(blob[: len(blob) - len(blob) % fds.itemsize])
    return list(fds)


def start(prepared: layers.Layers) -> tuple[int, socket.socket, int]:
    """Fork the forker from the worker; returns its pid, the worker's end of the socket and how
    many bytes of its memory are in huge pages."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _park_server_pipes()
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() == worker:
                _Forker(theirs, dataclasses.replace(prepared, parent_pid=os.getpid())).run()
        finally:
            os._exit(0)
    theirs.close()
    ready = json.loads(ours.recv(1 << 16) or b'{"hugeBytes": 0}')
    return pid, ours, int(ready["hugeBytes"])


def _park_server_pipes() -> None:
    """Drop the copies of the server's pipes (fds 3 and 4) but keep the numbers taken, so the
    descriptors passed for a child always land above them (see layers.enter)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 3)
    os.dup2(devnull, 4)
    os.close(devnull)


def send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


class _Forker:
    def __init__(self, sock: socket.socket, prepared: layers.Layers) -> None:
        self.sock = sock
        self.layers = prepared
        self.pids: dict[int, int] = {}  # slot -> pid, until reaped
        self.pidfds: dict[int, int] = {}  # pidfd -> slot
        self.selector = selectors.DefaultSelector()
        self.statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        self.page = os.sysconf("SC_PAGE_SIZE")

    def run(self) -> None:
        send(self.sock, {"hugeBytes": memory.collapse_heap()})
        self.selector.register(self.sock, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.sock:
                    self.on_worker()
                else:
                    self.reap(key.fd)

    def on_worker(self) -> None:
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(1 << 16, _FDS_SPACE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            fds = [fd for level, kind, blob in ancillary if kind == socket.SCM_RIGHTS for fd in _ints(blob)]
            if not data:
                os._exit(0)  # the worker is gone
            message = json.loads(data)
            if message["op"] == "spawn":
                self.spawn(message, fds)
            elif message["op"] == "kill":
                self.kill(message["slot"])

    def spawn(self, message: dict[str, Any], fds: list[int]) -> None:
        vm_bytes = int(os.pread(self.statm, 128, 0).split()[0]) * self.page
        # The C library's fork, not os.fork: this process is single-threaded by construction,
        # and skipping the interpreter's at-fork hooks saves each child ~200 page copies. The
        # child reseeds the random generators itself (child.reseed).
        pid = libc.fork()
        if pid == 0:
            try:
                child.main(self.layers, message["workdir"], message["uid"], vm_bytes, tuple(fds))
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        slot = message["slot"]
        if pid < 0:
            send(self.sock, {"slot": slot, "status": None, "cpu": 0.0})
            return
        pidfd = os.pidfd_open(pid)
        self.pids[slot] = pid
        self.pidfds[pidfd] = slot
        self.selector.register(pidfd, selectors.EVENT_READ)

    def kill(self, slot: int) -> None:
        pid = self.pids.get(slot)
        if pid is None:
            return  # already reaped; its exit is on the way to the worker
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def reap(self, pidfd: int) -> None:
        slot = self.pidfds[pidfd]
        done, status, usage = os.wait4(self.pids[slot], os.WNOHANG)
        if done == 0:
            return
        self.selector.unregister(pidfd)
        os.close(pidfd)
        del self.pidfds[pidfd], self.pids[slot]
        send(self.sock, {"slot": slot, "status": status, "cpu": usage.ru_utime + usage.ru_stime})
