"""Seccomp filters of a sandboxed child.

Two filters are stacked (the kernel applies the strictest answer):
- the static deny list, compiled once per worker with libseccomp (pyseccomp) and exported as BPF,
  so installing it in each child is one prctl;
- a per-process filter, a few BPF instructions assembled here because its constants are the
  child's own pid (patched into a template): signals, rlimits and scheduling calls may target
  only the caller itself.
Denied calls fail with EPERM (code sees a PermissionError, the server sees a clean exit) rather
than killing the process."""

from __future__ import annotations

import ctypes
import errno
import os
import struct

import pyseccomp as sc

from tool_sandbox.sandbox.libc import PR_SET_PDEATHSIG, libc

# Syscalls a sandboxed program never needs: networking, debugging other processes, kernel
# objects, mounts and namespaces, new programs and processes, clocks, modules.
DENIED = (
    "socket",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "process_madvise",
    "process_mrelease",
    "migrate_pages",
    "move_pages",
    "get_robust_list",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "sethostname",
    "setdomainname",
    "acct",
    "quotactl",
    "quotactl_fd",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "iopl",
    "ioperm",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fanotify_init",
    "syslog",
    "vhangup",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "personality",
    "execve",
    "execveat",
    "fork",
    "vfork",
    "tkill",
    "ioprio_set",
    "uselib",
    "memfd_secret",
    "mknod",
    "mknodat",
)
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def static_filter() -> bytes:
    """The deny list as a BPF program for this machine's architecture."""
    flt = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            flt.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a syscall on this architecture / libseccomp version
    # Threads yes, processes no: clone without CLONE_THREAD fails; clone3 hides its flags in
    # memory, so it reports ENOSYS and the C library falls back to clone.
    flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("seccomp-bpf")
    try:
        with os.fdopen(os.dup(fd), "wb") as sink:
            flt.export_bpf(sink)
        return os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)


def _nr(name: str) -> int:
    return int(sc.resolve_syscall(sc.Arch.NATIVE, name))


def _arg(index: int) -> int:
    return 16 + 8 * index  # offset of the low 32 bits of args[index] in seccomp_data (LE)


_SELF = 0x7FFFFFF0  # placeholders; no pid reaches them (pid_max <= 2**22)
_GROUP = 0x7FFFFFF1


def self_only_template() -> bytes:
    """A BPF program that lets signal, rlimit and scheduling syscalls target only the caller;
    the caller's pid is patched in by `Program.install_for`."""
    rules: list[tuple[str, list[tuple[int, tuple[int, ...]]]]] = [
        ("kill", [(0, (0, _SELF, _GROUP))]),
        ("tgkill", [(0, (_SELF,))]),
        ("rt_sigqueueinfo", [(0, (_SELF,))]),
        ("rt_tgsigqueueinfo", [(0, (_SELF,))]),
        ("prlimit64", [(0, (0, _SELF))]),
        ("sched_setaffinity", [(0, (0, _SELF))]),
        ("sched_setparam", [(0, (0, _SELF))]),
        ("sched_setscheduler", [(0, (0, _SELF))]),
        ("sched_setattr", [(0, (0, _SELF))]),
        ("setpriority", [(0, (0,)), (1, (0, _SELF))]),
    ]
    prog: list[tuple[int, int, int, int]] = [
        (0x20, 0, 0, 4),  # ld arch
        (0x15, 1, 0, sc.system_arch()),  # jeq native -> skip next
        (0x06, 0, 0, _RET_ALLOW),  # foreign arch: the static filter decides
        (0x20, 0, 0, 0),  # ld nr
    ]
    for name, conditions in rules:
        try:
            nr = _nr(name)
        except (OSError, ValueError, RuntimeError):
            continue
        body: list[tuple[int, int, int, int]] = []
        for index, allowed in conditions:
            body.append((0x20, 0, 0, _arg(index)))
            for i, value in enumerate(allowed):
                body.append((0x15, len(allowed) - i, 0, value))
            body.append((0x06, 0, 0, _RET_EPERM))
        body.append((0x06, 0, 0, _RET_ALLOW))
        prog.append((0x15, 0, len(body), nr))
        prog.extend(body)
    # A parent-death signal is how an orphaned child is cleaned up: it may not be unset.
    prog += [
        (0x15, 0, 3, _nr("prctl")),
        (0x20, 0, 0, _arg(0)),
        (0x15, 0, 1, PR_SET_PDEATHSIG),
        (0x06, 0, 0, _RET_EPERM),
        (0x06, 0, 0, _RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


class Program:
    """A BPF program laid out in memory before fork, so a child installs it with one prctl
    (a forked child pays for every page it touches; this keeps that to a minimum)."""

    def __init__(self, code: bytes) -> None:
        self.code = code
        self.buffer = ctypes.create_string_buffer(code, len(code))
        self.fprog = _SockFprog(len=len(code) // 8, filter=ctypes.addressof(self.buffer))
        self.ref = ctypes.byref(self.fprog)
        self.self_slots = [
            i for i in range(0, len(code), 8) if code[i + 4 : i + 8] == struct.pack("=I", _SELF)
        ]
        self.group_slots = [
            i for i in range(0, len(code), 8) if code[i + 4 : i + 8] == struct.pack("=I", _GROUP)
        ]

    def install(self) -> None:
        """Load it as a seccomp filter on the calling thread (needs no_new_privs)."""
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self.ref, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")

    def install_for(self, pid: int) -> None:
        """Patch `pid` into the placeholders, then install."""
        for offset in self.self_slots:
            struct.pack_into("=I", self.buffer, offset + 4, pid & 0xFFFFFFFF)
        for offset in self.group_slots:
            struct.pack_into("=I", self.buffer, offset + 4, (-pid) & 0xFFFFFFFF)
        self.install()


def no_new_privs() -> None:
    """Forbid gaining privileges (setuid binaries, file capabilities) from now on."""
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
