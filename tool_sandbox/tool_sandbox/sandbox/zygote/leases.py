"""Worker leases: a worker's exclusive share of the machine (a working directory and, as root, a
uid range), and the clean-up of what dead holders left behind."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import sys
from dataclasses import dataclass

from tool_sandbox.sandbox import tree

UID_LEASES = "/run/toolrl-tool-sandbox/uid-leases"  # machine-wide: uid ranges are machine-wide
UIDS_PER_LEASE = 1000  # slots of one worker: its children run as uid base + lease * 1000 + slot
MAX_LEASES = 1000


@dataclass(frozen=True)
class Lease:
    """A worker's exclusive share of the machine: a working directory and (as root) a uid range.

    Several servers may share one `--workdir` and run as root on one machine; each worker holds
    an flock on `lease-N` for its lifetime, so no two live workers ever use the same directory or
    uids, and a new worker cleans up only what a dead holder of the same lease left behind. Uid
    ranges are machine-wide, so as root the lease files live in one machine-wide directory
    (UID_LEASES) whatever the workdir: two servers with different workdirs never share uids."""

    number: int
    workdir: str
    uid_base: int | None
    fd: int


def claim_lease(root: str, uid_base: int | None, uid_leases: str | None = None) -> Lease:
    """Take the lowest free lease (held until this process exits): under `root`, or, when the
    lease also hands out uids, under the machine-wide `uid_leases` directory."""
    os.makedirs(root, 0o711, exist_ok=True)
    locks = root if uid_base is None else (uid_leases or UID_LEASES)
    os.makedirs(locks, 0o700, exist_ok=True)
    for number in range(MAX_LEASES):
        fd = os.open(os.path.join(locks, f"lease-{number}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uids = None if uid_base is None else uid_base + number * UIDS_PER_LEASE
        return Lease(number, os.path.join(root, str(number)), uids, fd)
    raise RuntimeError(f"all {MAX_LEASES} worker leases under {locks} are held; stop some servers")


def sweep(lease: Lease, slots: int) -> None:
    """Remove what a previous holder of this lease left: its directories and, as root, its processes."""
    root, uid_base = lease.workdir, lease.uid_base
    try:
        tree.remove(root)
    except OSError as exc:
        print(f"tool-sandbox worker: could not remove {root}: {exc}", file=sys.stderr)
    os.makedirs(root, 0o711, exist_ok=True)
    if uid_base is None:
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if uid_base <= os.stat(f"/proc/{entry}").st_uid < uid_base + slots:
                os.kill(int(entry), signal.SIGKILL)


def sweep_unheld(workdir: str, locks: str) -> None:
    """Remove the directories of leases nobody holds (a server that ran more workers, or died):
    each is removed under its lease's lock, so a worker starting meanwhile never loses its own."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(workdir):
            if not name.isdigit():
                continue
            fd = os.open(os.path.join(locks, f"lease-{name}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                tree.remove(os.path.join(workdir, name))
            except BlockingIOError:
                pass  # held: its worker keeps it clean
            except OSError as exc:
                print(f"tool-sandbox worker: could not remove lease {name}: {exc}", file=sys.stderr)
            finally:
                os.close(fd)


def warn_if_unreachable(workdir: str) -> None:
    """As root each child has a uid of its own: a directory above the children's that others
    may not pass through keeps a program from opening its own main.py by its path (its
    tracebacks lose their source lines, inspect fails). Said once, in the server's log."""
    path = os.path.realpath(workdir)
    while path != "/":
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & stat.S_IXOTH:
            print(
                f"tool-sandbox worker: {path} is not searchable by other users, so sandboxed programs"
                " (each under a uid of its own) cannot open their own files by path (tracebacks lose"
                " their source lines); use a --workdir below a directory like /tmp",
                file=sys.stderr,
            )
            return
