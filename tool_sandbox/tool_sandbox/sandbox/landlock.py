"""Landlock (Linux >= 5.13) through raw syscalls: confines a process's filesystem access,
TCP bind/connect (ABI 4) and signals/abstract sockets (ABI 6) to what it is given."""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
from collections.abc import Iterable

from tool_sandbox.sandbox.libc import libc

_SYS_CREATE_RULESET = 444
_CREATE_RULESET_VERSION = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13
TRUNCATE = 1 << 14
IOCTL_DEV = 1 << 15

NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ_ONLY = READ_FILE | READ_DIR
READ_WRITE = (
    READ_FILE
    | READ_DIR
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    result = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(result), 0)


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


class Prepared:
    """Read-only rules opened before fork, laid out as the kernel reads them: a child (in
    _spawner.c) adds its own directory and enforces with a handful of syscalls and no path lookups.
    TCP bind/connect and signals outside the domain are denied where the ABI has them."""

    def __init__(self, read_only: Iterable[str], abi: int) -> None:
        self.abi = abi
        handled = _handled_fs(abi)
        attr = _RulesetAttr(
            handled_access_fs=handled,
            handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
            scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0,
        )
        size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
        self.attr = bytes(attr)[:size]  # struct landlock_ruleset_attr as this ABI knows it
        rules = []
        for path in read_only:
            rights = READ_ONLY | (WRITE_FILE if path == os.devnull else 0)
            rule = _open_rule(path, rights & handled)
            if rule is not None:
                rules.append(bytes(rule))
        self.rules = b"".join(rules)  # struct landlock_path_beneath_attr[]
        self.own_rights = READ_WRITE & handled  # for the child's working directory


def _open_rule(path: str, rights: int) -> _PathBeneath | None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)  # clear of the fds a child rearranges
    os.close(fd)
    if not stat.S_ISDIR(os.fstat(high).st_mode):
        rights &= _FILE_RIGHTS
    return _PathBeneath(allowed_access=rights, parent_fd=high)
