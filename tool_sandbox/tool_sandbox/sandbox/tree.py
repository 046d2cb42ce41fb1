"""Measuring and removing a call's directory tree, whatever the code did to it.

A child may create directories it then makes unreadable to others (mode 0o300 at `mkdir`, which
no seccomp rule can stop): `shutil.rmtree` and `os.scandir` skip those, so their files were never
counted against the disk budget and never removed. Here every directory is opened by a directory
fd without following links (a symlink swapped in is never followed), and a directory the worker
cannot read or search is given back to its owner first: the worker's uid owns what its children
made when they share it (the pool's pod), and as root the worker reads everything anyway.

The walk holds two fds at a time (the directory and its parent while stepping back through
".."), so a tree thousands of levels deep needs no more descriptors and no recursion; each step
back checks that ".." is the directory it came from, so a tree changed underneath (code still
running) stops the walk with TreeChanged instead of escaping the root. Linear in the entries."""

from __future__ import annotations

import contextlib
import os
import stat

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_ALL = stat.S_IRWXU
MIN_ENTRY_BYTES = 4096  # an entry costs at least a block, so a million empty files are not free


class TreeChanged(OSError):
    """The tree changed under the walk (the code that owns it is still running)."""


def usage(root: str) -> int:
    """Bytes of disk the entries under `root` use (each at least MIN_ENTRY_BYTES); 0 if absent."""
    return _walk(root, remove=False)


def remove(root: str) -> None:
    """Remove `root` and everything under it; absent is fine."""
    _walk(root, remove=True)


def _ident(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _open_dir(name: str, dir_fd: int | None) -> int:
    """Open a directory (never through a link), first giving its owner rwx back if needed."""
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", _OWNER_ALL)  # the inode behind the fd, not a path
        finally:
            os.close(path_fd)
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    mode = os.fstat(fd).st_mode
    if mode & _OWNER_ALL != _OWNER_ALL and os.geteuid() != 0:  # readable but not searchable/writable
        os.fchmod(fd, mode | _OWNER_ALL)
    return fd


def _scan(fd: int, remove: bool) -> tuple[int, list[str]]:
    """Bytes of this directory's non-directory entries (removed if asked) and its subdirectories."""
    size, subdirs = 0, []
    with os.scandir(fd) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                size += max(info.st_blocks * 512, MIN_ENTRY_BYTES)
                if stat.S_ISDIR(info.st_mode):
                    subdirs.append(entry.name)
                elif remove:
                    os.unlink(entry.name, dir_fd=fd)
    return size, subdirs


def _walk(root: str, remove: bool) -> int:
    try:
        fd = _open_dir(root, None)
    except FileNotFoundError:
        return 0
    total = 0
    above: list[tuple[tuple[int, int], str, list[str]]] = []  # per ancestor: identity, child name, to do
    try:
        ident = _ident(fd)
        size, pending = _scan(fd, remove)
        total += size
        while True:
            if pending:
                name = pending.pop()
                try:
                    child = _open_dir(name, fd)
                except FileNotFoundError:
                    continue
                above.append((ident, name, pending))
                os.close(fd)
                fd, ident = child, _ident(child)
                size, pending = _scan(fd, remove)
                total += size
                continue
            if not above:
                break
            parent_ident, name, pending = above.pop()
            parent = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd, ident = parent, _ident(parent)
            if ident != parent_ident:
                raise TreeChanged(f"{root} changed while it was walked")
            if remove:
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    if remove:
        os.rmdir(root)
    return total


PF_EXITING = 0x4  # a task's flag (include/linux/sched.h) while it runs do_exit


def held_after_unlink(pid: int, root: str, unmeasured_bytes: int) -> int:
    """Bytes of files under `root` that were deleted while process `pid` keeps them: a file it holds
    open counts its blocks; a file it only keeps mapped (its fd closed) counts `unmeasured_bytes`, as its
    size cannot be read without privileges (/proc/PID/map_files). Such files take disk until the process
    ends but are in no directory, so `usage` misses them: a session's code could keep gigabytes of them
    between its cells. A process that hides its table (PR_SET_DUMPABLE 0, in the pod's shared uid) counts
    `unmeasured_bytes`. 0 once the process is gone.

    The kernel hands an ending task's /proc entries to root once it has released its memory, so its
    table reads as a hiding one's (seen under load at the end of ordinary calls, which were then killed
    for their disk): a task that reads so is asked through another thread of the process, and when
    every thread is ending nothing outlives the process, 0. (A main thread that exits while others run
    on is such an ending task: the others are read.)"""
    try:
        return _held(f"/proc/{pid}", root, unmeasured_bytes)
    except FileNotFoundError:  # it ended
        return 0
    except PermissionError:
        pass
    hiding = False
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            task = f"/proc/{pid}/task/{tid}"
            try:
                return _held(task, root, unmeasured_bytes)
            except FileNotFoundError:  # this thread ended
                continue
            except PermissionError:
                hiding = hiding or not _ending(task)
    return unmeasured_bytes if hiding else 0


def _held(proc: str, root: str, unmeasured_bytes: int) -> int:
    """held_after_unlink as read from one /proc entry of the process (`/proc/PID` or a thread's)."""
    prefix = os.path.join(root, "")
    deleted = " (deleted)"  # how the kernel shows the path of an unlinked file
    open_bytes: dict[int, int] = {}  # by inode: the files it holds open
    mapped_only: set[int] = set()  # inodes it keeps mapped and not open
    table = f"{proc}/fd"
    for name in os.listdir(table):
        link = f"{table}/{name}"
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(link)
            if target.startswith(prefix) and target.endswith(deleted):
                info = os.stat(link)  # the open file itself, through the process's fd
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
                    open_bytes[info.st_ino] = info.st_blocks * 512
    with open(f"{proc}/maps") as maps:
        for line in maps:
            fields = line.rstrip("\n").split(maxsplit=5)  # address perms offset dev inode path
            if len(fields) == 6 and fields[5].startswith(prefix) and fields[5].endswith(deleted):
                mapped_only.add(int(fields[4]))
    return sum(open_bytes.values()) + len(mapped_only - open_bytes.keys()) * unmeasured_bytes


def _ending(task: str) -> bool:
    """Whether the task of this /proc entry is in do_exit or gone (its stat is readable by anyone)."""
    try:
        with open(f"{task}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return True
    return bool(int(fields[6]) & PF_EXITING)  # state ppid pgrp session tty_nr tpgid flags
