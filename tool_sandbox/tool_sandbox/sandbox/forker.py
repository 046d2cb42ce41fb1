"""The forker: the one process that forks, signals and reaps sandboxed children.

It is forked once from the fully preloaded worker (zygote.py), collapses its heap into huge pages
(memory.collapse_heap) and then runs a loop written in C (_spawner.c) that touches no Python
object, so the heap stays in huge pages: each fork copies a few dozen page-table entries instead
of ~14,000, and a child exits as cheaply. Being the only one that reaps, it is also the only one
that signals, so a pid is never signalled after it was reaped (and possibly reused).

The messages on the SOCK_SEQPACKET pair are fixed binary layouts, defined here and read by the
C side: worker -> forker SPAWN (+ workdir bytes, with the request, stdout, stderr and control
pipe ends as 4 fds), SIGNAL (kill or continue a slot's process group) or LIMIT (a call's tasks);
forker -> worker EXITED once a child was reaped, when it stopped (a session's cell ended), could
not be forked, or was refused a thread because its worker's task budget was used up."""

from __future__ import annotations

import gc
import os
import signal
import socket
import struct
from typing import NamedTuple

from tool_sandbox.sandbox import _spawner, child, layers, memory
from tool_sandbox.sandbox.libc import PR_SET_PDEATHSIG, libc, set_name

SPAWN = struct.Struct("=iii")  # op 1, slot, uid (-1: the worker's own)
SIGNAL = struct.Struct("=ii")  # op (2 kill, 4 continue), slot
LIMIT = struct.Struct("=iii")  # op 5, slot, tasks
EXITED = struct.Struct("=iiid")  # slot, event (_FORK_FAILED, _EXITED, _STOPPED), status, CPU seconds
READY = struct.Struct("=q")  # bytes of the heap in huge pages
_OP_SPAWN, _OP_KILL, _OP_CONT, _OP_LIMIT = 1, 2, 4, 5
_FORK_FAILED, _EXITED, _STOPPED, _PRESSED = 0, 1, 2, 3


class Exited(NamedTuple):
    slot: int
    status: int | None  # None: the child could not be forked
    cpu_seconds: float
    stopped: bool = False  # it stopped (status: the signal), it did not exit
    fork_errno: int = 0  # why it could not be forked
    pressed: bool = False  # a thread of its call was refused: the worker's task budget was used up


def start(prepared: layers.Layers, slots: int, task_budget: int) -> tuple[int, socket.socket, int]:
    """Fork the forker from the worker; returns its pid, the worker's end of the socket and how
    many bytes of its memory are in huge pages. `task_budget`: tasks all its children may run
    together (0: no budget)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _park_server_pipes()
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            set_name(b"sandbox-forker")
            if os.getppid() == worker:
                _serve(theirs, prepared, slots, task_budget)
        finally:
            os._exit(0)
    theirs.close()
    ready = ours.recv(READY.size)
    return pid, ours, READY.unpack(ready)[0] if len(ready) == READY.size else 0


def _serve(sock: socket.socket, prepared: layers.Layers, slots: int, task_budget: int) -> None:
    args = (sock.fileno(), slots, task_budget, *prepared.spawner_args())
    gc.freeze()  # what the worker made since its own freeze: a child's collection walks only its own objects
    sock.send(READY.pack(memory.collapse_heap()))
    spawned = _spawner.serve(*args)
    if spawned is not None:  # in a forked, isolated child
        workdir, vm_bytes, error = spawned
        child.main(os.fsdecode(workdir), vm_bytes, error)


def _park_server_pipes() -> None:
    """Drop the copies of the server's pipes (fds 3 and 4) but keep the numbers taken, so the
    descriptors passed for a child always land above them (the child dup2s them onto 1-4)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 3)
    os.dup2(devnull, 4)
    os.close(devnull)


def spawn(sock: socket.socket, slot: int, workdir: str, uid: int | None, fds: tuple[int, ...]) -> None:
    message = SPAWN.pack(_OP_SPAWN, slot, -1 if uid is None else uid) + os.fsencode(workdir)
    socket.send_fds(sock, [message], list(fds))


def kill(sock: socket.socket, slot: int) -> None:
    sock.send(SIGNAL.pack(_OP_KILL, slot))


def cont(sock: socket.socket, slot: int) -> None:
    """Continue a session's child, stopped since its last cell ended (it stops itself)."""
    sock.send(SIGNAL.pack(_OP_CONT, slot))


def limit(sock: socket.socket, slot: int, tasks: int) -> None:
    """How many tasks (threads included) a slot's child may run for its call: sent before its code."""
    sock.send(LIMIT.pack(_OP_LIMIT, slot, tasks))


def exited(message: bytes) -> Exited:
    slot, event, status, cpu = EXITED.unpack(message)
    if event == _FORK_FAILED:
        return Exited(slot, None, cpu, fork_errno=status)
    if event == _PRESSED:
        return Exited(slot, None, cpu, pressed=True)
    return Exited(slot, status, cpu, event == _STOPPED)
