"""What every child inherits from the worker: the modules it imports once (PRELOAD), and none of
the exit handlers of the worker's own set-up."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import weakref
from collections.abc import Iterable

PRELOAD = (
    "numpy",
    "numpy.random",
    "numpy.linalg",
    "numpy.fft",
    "numpy.polynomial",
    "sympy",
    "math",
    "cmath",
    "re",
    "json",
    "collections",
    "itertools",
    "functools",
    "operator",
    "heapq",
    "bisect",
    "fractions",
    "decimal",
    "statistics",
    "random",
    "string",
    "datetime",
    "time",
    "typing",
    "dataclasses",
    "copy",
    "io",
    "textwrap",
    "array",
    "struct",
    "hashlib",
    "base64",
    "unicodedata",
    "pprint",
    "enum",
    "numbers",
    "traceback",
    "threading",
    "csv",
    "calendar",
    "difflib",
    "queue",
    "contextlib",
    "warnings",
    "ast",
    "uuid",
    "socket",
    "asyncio",  # imports logging, whose atexit handler forget_exit_handlers drops
    "subprocess",
    "signal",
    "glob",
    "pathlib",
    "shutil",
    "tempfile",
    "ctypes",
    "unittest",
    "multiprocessing",
    "doctest",
    "inspect",
    "pickle",
    "zlib",
    "gzip",
    "secrets",
    "bz2",
    "lzma",
    "encodings.idna",
    "locale",
    "codecs",
)


def load(names: Iterable[str]) -> None:
    """Import each module of `names` that is installed."""
    for name in names:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def forget_exit_handlers() -> None:
    """The worker leaves by os._exit: the atexit handlers its own set-up registered (pyseccomp's
    weakref.finalize registers one) are for nobody. Dropped, so a child's exit runs only those
    of its program, as a fresh interpreter's does; weakref.finalize registers again when a
    program makes its first finalizer."""
    atexit._clear()
    weakref.finalize._registered_with_atexit = False  # type: ignore[attr-defined]
