"""What a sandboxed child does once isolated: wait for code, run it, report, exit.

A one-shot child runs its program as `python main.py` in its directory would (run_program): the
program is the `__main__` module, main.py is on disk (written by _spawner.receive) next to the
call's `files` and its directory is sys.path[0], stdio and the SIGINT handler are the
interpreter's own, an uncaught exception is printed by the interpreter's own printer
(sys.excepthook) and the end is the interpreter's (finish). A session child keeps one namespace
and runs cells with notebook semantics (the value of a trailing expression is printed) until told
to stop.

What the worker may believe of a child's control pipe: only its first frames, written before any
of the code ran (its pid, then a set-up failure or that a session started). Once code has run it can
write there too, so a cell's end counts only together with what the kernel reports: the child stopped
itself."""

from __future__ import annotations

import _io
import _signal
import _thread
import ast
import atexit
import builtins
import contextlib
import gc
import importlib.machinery
import io
import linecache
import os
import random
import sys
import tempfile
import threading
import traceback
import types
from typing import Any, NoReturn

from tool_sandbox.sandbox import _spawner, layers, wire

# How deep the program's module frame counts for the recursion limit, as in a fresh interpreter
# running a file (the frame itself; checked by tests/unit/tool_sandbox/test_program_fidelity.py).
MODULE_FRAME_DEPTH = 1
_PROGRAM = os.fsencode(layers.PROGRAM_NAME)
_EXIT_STATUS_FLUSH_FAILED = 120  # as the interpreter's when flushing stdout fails at exit
# What can hold unwritten data: the C base classes, not io's ABCs (an ABC's isinstance walks and
# caches subclasses, touching hundreds of the worker's pages, each copied into the child).
_BUFFERED = (_io._BufferedIOBase, _io._TextIOBase)


def main(workdir: str, vm_bytes: int, setup_error: str | None) -> None:
    """Entry point in the forked child, isolated by _spawner.c; never returns."""
    code = 70
    if setup_error is not None:
        _report({"setupError": setup_error})
        os._exit(code)
    try:
        # While waiting for code (off the call's path): the process a program will run in.
        _report({"pid": os.getpid()})  # where the worker reads what it holds (tree.held_after_unlink)
        directory = os.getcwd()  # the working directory as the kernel resolves it, as python's
        program = os.path.join(directory, layers.PROGRAM_NAME)
        os.environ["HOME"] = os.environ["TMPDIR"] = tempfile.tempdir = workdir
        sys.argv[:] = [layers.PROGRAM_NAME]  # as `python main.py`: not the worker's command line
        sys.orig_argv[:] = [sys.executable, layers.PROGRAM_NAME]
        sys.modules["__main__"] = _main_module(program)
        sys.path[0] = directory
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # the worker ignores SIGINT
        reseed()  # while waiting for code: off the call's path
        try:
            request = _spawner.receive(layers.REQUEST_FD, vm_bytes, _PROGRAM)  # also limits, stdin, main.py
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
            run_program(source, program)
    finally:
        _flush()
        os._exit(code)


def run_program(source: str, program: str) -> NoReturn:
    """Run `source` as `python main.py` runs the file `program` (its `__main__` module, sys.path
    and signal handlers were set up by main), to the end of the process."""
    module = sys.modules["__main__"]
    status, interrupted, exiting = 0, False, False
    try:
        code = compile(source, program, "exec", dont_inherit=True)
    except BaseException as exc:  # SyntaxError: printed as the interpreter prints it, no traceback
        exiting = isinstance(exc, SystemExit)
        status = _uncaught(exc.with_traceback(None))
    else:
        depth = _spawner.recursion_depth(MODULE_FRAME_DEPTH - 1)
        try:
            exec(code, module.__dict__)
        except BaseException as exc:
            _spawner.recursion_depth(depth)
            _flush_io()
            interrupted, exiting = isinstance(exc, KeyboardInterrupt), isinstance(exc, SystemExit)
            status = _uncaught(exc.with_traceback(exc.__traceback__.tb_next if exc.__traceback__ else None))
        else:
            _spawner.recursion_depth(depth)
            _flush_io()
        del code
    if not exiting:  # the interpreter ends a SystemExit before it gets here
        module.__dict__.pop("__file__", None)
        module.__dict__.pop("__cached__", None)
    del module  # sys.modules holds it until finish releases it
    finish(status, interrupted)


# The loader a file's `__main__` has, made once in the worker (a child instantiating the class
# would pay for its own copy of every page that touches); each child names its own file in it.
_LOADER = importlib.machinery.SourceFileLoader("__main__", "")


def _main_module(program: str) -> types.ModuleType:
    """A `__main__` module as the interpreter makes one for a file: the same names, in its order.
    Made in the child: the worker's objects are frozen out of the collector's reach, and this
    module's namespace must be collectable at the end (finish)."""
    module = types.ModuleType("__main__")
    namespace = module.__dict__
    namespace["__annotations__"] = {}
    namespace["__builtins__"] = builtins
    namespace["__file__"] = program
    namespace["__cached__"] = None
    _LOADER.path = program
    namespace["__loader__"] = _LOADER
    return module


def _uncaught(exc: BaseException) -> int:
    """Report an exception that ended the program as the interpreter does (PyErr_Print): the
    message of a SystemExit, else sys.excepthook (by default the interpreter's own printer).
    Returns the exit status."""
    if isinstance(exc, SystemExit):
        return _exit_code(exc)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    hook = getattr(sys, "excepthook", None)
    if hook is None:
        sys.stderr.write("sys.excepthook is missing\n")
        hook = sys.__excepthook__
    try:
        hook(type(exc), exc, exc.__traceback__)
    except SystemExit as stop:  # the hook asked to exit: with its status
        return _exit_code(stop)
    except BaseException as error:
        error = error.with_traceback(error.__traceback__.tb_next if error.__traceback__ else None)
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(error), error, error.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    return 1


def _exit_code(exc: SystemExit) -> int:
    """The exit status `raise SystemExit(code)` gives an interpreter (its message printed)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(1 << 63) <= code < 1 << 63 else 0xFF  # C exit() of a C long
    sys.stderr.write(str(code))
    sys.stderr.write("\n")
    return 1


def finish(status: int, interrupted: bool = False) -> NoReturn:
    """End as the interpreter ends a program (Py_FinalizeEx, then exit): join non-daemon threads,
    run atexit handlers, flush stdout and stderr, release the program's module (finalizers of its
    objects run with its globals intact), flush again, flush C stdio and exit. An uncaught
    KeyboardInterrupt ends the process by SIGINT, as the interpreter does."""
    if _thread._count():  # threads other than this one are running (else nothing to wait for)
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter calls at exit
    if atexit._ncallbacks():
        atexit._run_exitfuncs()
    if not _flush_std_files():
        status = _EXIT_STATUS_FLUSH_FAILED
    main = sys.modules.get("__main__")
    if main is not None:
        _flush_open_files(vars(main))
    del main
    sys.modules["__main__"] = None  # type: ignore[assignment]  # as finalize_modules does
    for name in ("last_type", "last_value", "last_traceback"):
        sys.__dict__.pop(name, None)
    gc.collect()
    if not _flush_std_files():
        status = _EXIT_STATUS_FLUSH_FAILED
    if interrupted:
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
    _spawner.exit_flushed(status)
    raise AssertionError("unreachable")  # exit_flushed never returns


def _flush_open_files(namespace: dict[str, Any]) -> None:
    """Flush files the program left open in its globals. The interpreter's finalization closes
    them with their buffers written; collecting them here as garbage could close a file's raw
    descriptor before its buffer (the collector finalizes in no fixed order) and lose the data."""
    for value in list(namespace.values()):
        if isinstance(value, _BUFFERED):
            with contextlib.suppress(Exception):
                if not value.closed and value.writable():
                    value.flush()


def _flush_io() -> None:
    """As the interpreter right after running a file: stderr, then stdout, errors ignored."""
    for stream in (sys.stderr, sys.stdout):
        with contextlib.suppress(Exception):
            stream.flush()


def _flush_std_files() -> bool:
    """Flush sys.stdout and sys.stderr as the interpreter does at exit; False if stdout failed."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception as exc:
            if stream is sys.stdout:
                ok = False
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"Exception ignored in: {stream!r}\n")
                    traceback.print_exception(exc, file=sys.stderr)
    return ok


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
            tree = ast.parse(code, filename, "exec")  # never inherits this module's future flags
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
        else:
            exec(compile(code, filename, "exec", dont_inherit=True), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval", dont_inherit=True), namespace)
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
    namespace = _session_namespace(program)
    code: str | None = first_code
    cells = 0
    while code is not None:
        cells += 1  # each cell its own name, so a traceback through an earlier cell shows its lines
        status, exited = run(code, namespace, notebook=True, filename=f"<cell {cells}>")
        _flush()
        if exited:
            return status  # sys.exit ends the session as it ends a kernel
        _report({"done": True, "exitCode": status, "cell": cells})
        os.kill(os.getpid(), _signal.SIGSTOP)  # the cell ends when the worker sees it; SIGCONT: the next
        message = _spawner.receive(layers.REQUEST_FD, vm_bytes, _PROGRAM)  # also refills stdin (fd 0)
        code = None if message is None else message[1]
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")  # no stale buffer
    return 0


def _session_namespace(program: str) -> dict[str, Any]:
    """The namespace of a session's cells (the `__main__` module, with notebook names) and its
    line-buffered stdio."""
    module = types.ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, __file__=program)
    sys.modules["__main__"] = module
    if layers.SESSION_STDIO is not None:
        sys.stdin, sys.stdout, sys.stderr = layers.SESSION_STDIO
    return module.__dict__


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # a broken stream must not hide the exit code
            stream.flush()


def _report(message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        wire.write_all(layers.CONTROL_FD, wire.encode(message))
