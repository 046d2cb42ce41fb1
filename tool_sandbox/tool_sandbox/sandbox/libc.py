"""The C library through ctypes, and the prctl options the sandbox uses: one home for both."""

from __future__ import annotations

import ctypes

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def prctl(option: int, value: int) -> None:
    """prctl(option, value) or OSError."""
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


def set_name(name: bytes) -> None:
    """Name this process as `ps`, `top` and `perf` show it (the kernel keeps 15 bytes)."""
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
