"""What a sandboxed child does once isolated: wait for code, run it, report, exit.

A one-shot child runs one program with script semantics (`__name__ == "__main__"`, exit code
from `sys.exit`, a traceback on stderr) and exits. A session child keeps one namespace and runs
cells with notebook semantics (the value of a trailing expression is printed) until told to stop.

What the worker may believe of a child's control pipe: only its first frame, written before any of
the code ran (a set-up failure, or that a session started). Once code has run it can write there
too, so a cell's end counts only together with what the kernel reports: the child stopped itself."""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import linecache
import os
import random
import signal
import sys
import tempfile
import threading
import traceback
from typing import Any

from tool_sandbox.sandbox import _spawner, layers, wire


def main(workdir: str, vm_bytes: int, setup_error: str | None) -> None:
    """Entry point in the forked child, isolated by _spawner.c; never returns."""
    code = 70
    if setup_error is not None:
        _report({"setupError": setup_error})
        os._exit(code)
    try:
        os.environ["HOME"] = os.environ["TMPDIR"] = tempfile.tempdir = workdir
        program = os.path.join(workdir, layers.PROGRAM_NAME)
        sys.argv[:] = [program]  # as `python main.py`: not the worker's command line
        sys.orig_argv[:] = [sys.executable, program]
        reseed()  # while waiting for code: off the call's path
        try:
            request = _spawner.receive(layers.REQUEST_FD, vm_bytes)  # also sets limits and stdin
        except OSError as exc:  # before any code ran: the pool's failure, not the code's
            _report({"setupError": str(exc)})
            os._exit(code)
        if request is None:
            os._exit(0)
        mode, source = request
        if mode == layers.SESSION:
            _report({"started": True})  # the last frame the worker believes
            code = _session(source, vm_bytes, program)
        else:
            os.close(layers.CONTROL_FD)
            os.close(layers.REQUEST_FD)
            code, _ = run(source, _fresh_namespace(program), notebook=False, filename=program)
            _join_threads()
    finally:
        _flush()
        os._exit(code)


def reseed() -> None:
    """Give this child its own `random` stream (forked children would otherwise all replay the
    worker's; numpy's global stream is rekeyed in _spawner.c)."""
    random.seed()


def run(code: str, namespace: dict[str, Any], notebook: bool, filename: str) -> tuple[int, bool]:
    """Run `code` in `namespace`: (the exit code a Python process would have, sys.exit called).
    Tracebacks name `filename` and show its source lines, as for a program run from a file."""
    _remember_source(filename, code)
    try:
        last = None
        if notebook:  # the syntax tree only where the last expression is wanted
            tree = ast.parse(code, filename, "exec")
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), namespace)
        else:
            exec(compile(code, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                print(repr(value))
        return 0, False
    except SystemExit as exc:
        return _exit_code(exc), True
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        return 1, False


def _remember_source(filename: str, code: str) -> None:
    """Source lines for tracebacks without writing a file (an entry without a modification time
    is never checked against the disk)."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)


def _session(first_code: str, vm_bytes: int, program: str) -> int:
    namespace = _fresh_namespace(program)
    code: str | None = first_code
    cells = 0
    while code is not None:
        cells += 1  # each cell its own name, so a traceback through an earlier cell shows its lines
        status, exited = run(code, namespace, notebook=True, filename=f"<cell {cells}>")
        _flush()
        if exited:
            return status  # sys.exit ends the session as it ends a kernel
        _report({"done": True, "exitCode": status, "cell": cells})
        os.kill(os.getpid(), signal.SIGSTOP)  # the cell ends when the worker sees it; SIGCONT starts the next
        message = _spawner.receive(layers.REQUEST_FD, vm_bytes)  # also refills stdin (fd 0)
        code = None if message is None else message[1]
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")  # no stale buffer
    return 0


def _fresh_namespace(program: str) -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins, "__file__": program}


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _join_threads() -> None:
    """Wait for non-daemon threads, as the interpreter does at exit."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # a broken stream must not hide the exit code
            stream.flush()


def _report(message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        wire.write_all(layers.CONTROL_FD, wire.encode(message))
