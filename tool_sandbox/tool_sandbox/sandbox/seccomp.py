"""Seccomp filters of a sandboxed child.

Three filters are stacked (the kernel applies the strictest answer):
- the static deny list, compiled once per worker with libseccomp (pyseccomp) and exported as BPF,
  so installing it in each child is one prctl;
- a per-process filter, a few BPF instructions assembled here because its constants are the
  child's own pid (the child patches it into the placeholders SELF and GROUP): signals, rlimits
  and scheduling calls may target only the caller itself;
- the task limit: clone(CLONE_THREAD) becomes a user notification the forker answers (it lets the
  thread start while the call has fewer tasks than its limit), so a call's threads are bounded
  even where children share the server's uid and RLIMIT_NPROC cannot tell them apart.
All are installed by the child itself, in _spawner.c.
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
    # Native AIO: io_setup reserves the machine-wide fs.aio-max-nr for as long as the context lives
    # (a session holds it between cells), so one call could make every process's io_setup fail.
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_getevents",
    "io_pgetevents",
    # Sockets are refused (socket above), but socketpair() is needed (asyncio's self-pipe): a
    # datagram socket from it could still send to, or connect to, any writable pathname socket
    # outside the call's directory (Landlock does not check those paths). Sending on the pair
    # itself stays allowed (sendto without an address); sendmsg carries its address in memory.
    "connect",
    "bind",
    "sendmsg",
    "sendmmsg",
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
    # Permissions and owners: Landlock does not cover them, and where children share the
    # server's uid (the pod) code could chmod its worker's or other calls' directories away.
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    # State that outlives the call or escapes its memory limit: System V IPC and POSIX message
    # queues live in the kernel after the process exits; memfd pages are not in RLIMIT_AS.
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    "memfd_create",
    # Watching other calls' directories (names and writes) where the uid is shared.
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
)
# Syscalls newer than some libseccomp releases, by number: since 424 every architecture shares
# one numbering, and these are the ones added since (x86_64 and aarch64 are checked).
DENIED_BY_NUMBER = (("fchmodat2", 452), ("setxattrat", 463), ("removexattrat", 466))
# fcntl commands and ioctls that make the kernel signal another process (an fd's owner), or
# watch a directory (dnotify): F_SETOWN, F_SETSIG, F_SETOWN_EX, F_NOTIFY; FIOSETOWN, SIOCSPGRP.
DENIED_FCNTL = (8, 10, 15, 1026)
DENIED_IOCTL = (0x8901, 0x8902)
_CLONE_THREAD = 0x00010000
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_RET_USER_NOTIF = 0x7FC00000
_X32_SYSCALL_BIT = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3


def static_filter() -> bytes:
    """The deny list as a BPF program for this machine's architecture."""
    flt = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            flt.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a syscall on this architecture / libseccomp version
    for name, number in DENIED_BY_NUMBER:
        if not _known(name) and sc.system_arch() in (sc.Arch.X86_64, sc.Arch.AARCH64):
            flt.add_rule(eperm, number)
    for command in DENIED_FCNTL:
        flt.add_rule(eperm, "fcntl", sc.Arg(1, sc.EQ, command))
    for request in DENIED_IOCTL:
        flt.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    flt.add_rule(eperm, "sendto", sc.Arg(4, sc.NE, 0))  # an address: somewhere other than its peer
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


def _known(name: str) -> bool:
    try:
        return int(sc.resolve_syscall(sc.Arch.NATIVE, name)) >= 0
    except (OSError, ValueError, RuntimeError):
        return False


def _nr(name: str) -> int:
    return int(sc.resolve_syscall(sc.Arch.NATIVE, name))


def _arg(index: int) -> int:
    return 16 + 8 * index  # offset of the low 32 bits of args[index] in seccomp_data (LE)


SELF = 0x7FFFFFF0  # placeholders for the child's pid and -pid; no pid reaches them (pid_max <= 2**22)
GROUP = 0x7FFFFFF1


def self_only_template() -> bytes:
    """A BPF program that lets signal, rlimit and scheduling syscalls target only the caller;
    the child patches its pid into SELF and -pid into GROUP."""
    rules: list[tuple[str, list[tuple[int, tuple[int, ...]]]]] = [
        ("kill", [(0, (0, SELF, GROUP))]),
        ("tgkill", [(0, (SELF,))]),
        ("rt_sigqueueinfo", [(0, (SELF,))]),
        ("rt_tgsigqueueinfo", [(0, (SELF,))]),
        ("prlimit64", [(0, (0, SELF))]),
        ("sched_setaffinity", [(0, (0, SELF))]),
        ("sched_setparam", [(0, (0, SELF))]),
        ("sched_setscheduler", [(0, (0, SELF))]),
        ("sched_setattr", [(0, (0, SELF))]),
        ("setpriority", [(0, (0,)), (1, (0, SELF))]),
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


def task_filter() -> bytes:
    """A BPF program sending clone(CLONE_THREAD) to the forker (a user notification) and allowing
    the rest (the static filter refuses other clones, and its ERRNO outranks a notification)."""
    prog = [
        (0x20, 0, 0, 4),  # ld arch
        (0x15, 1, 0, sc.system_arch()),  # jeq native -> skip next
        (0x06, 0, 0, _RET_ALLOW),  # foreign arch: the static filter decides
        (0x20, 0, 0, 0),  # ld nr
        (0x35, 0, 1, _X32_SYSCALL_BIT),  # jge x32 -> refuse
        (0x06, 0, 0, _RET_EPERM),
        (0x15, 0, 3, _nr("clone")),  # jeq clone, else allow
        (0x20, 0, 0, _arg(0)),  # ld flags
        (0x45, 0, 1, _CLONE_THREAD),  # jset CLONE_THREAD -> notify, else allow
        (0x06, 0, 0, _RET_USER_NOTIF),
        (0x06, 0, 0, _RET_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def listener_available() -> bool:
    """Whether a child can hand its clone calls to the forker here: the kernel has seccomp user
    notifications and no filter around this process holds a listener already (one per process).
    Tried in a throwaway child (filters cannot be removed)."""
    program = task_filter()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            fprog = _Program(len(program) // 8, program)
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
                listener = libc.syscall(
                    _nr("seccomp"),
                    _SECCOMP_SET_MODE_FILTER,
                    _SECCOMP_FILTER_FLAG_NEW_LISTENER,
                    ctypes.byref(fprog),
                )
                ok = listener >= 0
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
