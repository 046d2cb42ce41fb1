"""A child's directory: made for it, filled with a call's files before the code runs, and read
back (the files the call asked to fetch) once it ended."""

from __future__ import annotations

import base64
import os
from typing import Any

FETCH_BUDGET_BYTES = 16 << 20  # fetch_files returns at most this in all (base64 keeps a reply < MAX_FRAME)


def make_workdir(root: str, workdir: str, uid: int | None) -> None:
    """A child's directory, only its own: 0700, owned by its uid (as root)."""
    try:
        os.mkdir(workdir, 0o700)
    except FileNotFoundError:  # the lease directory itself is gone: make it again
        os.makedirs(root, 0o711, exist_ok=True)
        os.mkdir(workdir, 0o700)
    if uid is not None:
        os.chown(workdir, uid, uid)


def decode_files(files: dict[str, Any]) -> dict[str, bytes]:
    """SandboxFusion-style `files` (relative path -> base64), checked before any child is used:
    paths stay inside the directory and none is also another's directory."""
    decoded: dict[str, bytes] = {}
    for name, content in files.items():
        relative = _inside("/w", name)
        if relative is None:
            raise ValueError(f"file name {name!r} leaves the working directory")
        decoded[relative[3:]] = base64.b64decode(content, validate=True)
    for name in decoded:
        parent = os.path.dirname(name)
        while parent:
            if parent in decoded:
                raise ValueError(f"{parent!r} cannot be both a file and a directory")
            parent = os.path.dirname(parent)
    return decoded


def place_files(workdir: str, files: dict[str, bytes], uid_base: int | None, slot: int) -> None:
    """Write checked files into a child's working directory; as root, they and every directory
    made for them belong to the child's uid (the program may write next to its files)."""
    uid = None if uid_base is None else uid_base + slot
    for name, content in files.items():
        _make_parents(workdir, name, uid)
        path = os.path.join(workdir, name)
        with open(path, "wb") as handle:
            handle.write(content)
        if uid is not None:
            os.chown(path, uid, uid)


def _make_parents(workdir: str, name: str, uid: int | None) -> None:
    path = workdir
    for part in name.split("/")[:-1]:
        path = os.path.join(path, part)
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        if uid is not None:
            os.chown(path, uid, uid)


def fetch(workdir: str, names: list[str], budget: int) -> tuple[dict[str, str], list[str]]:
    """Read files the code left behind, never following a link out of the directory, at most
    `budget` bytes in all; also returns the names cut short or left out."""
    found: dict[str, str] = {}
    cut: list[str] = []
    for name in names:
        try:  # odd names (NUL, surrogates, too long) are simply not found
            path = _inside(workdir, name)
            if path is None or os.path.realpath(path) != path:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, ValueError):
            continue
        with os.fdopen(fd, "rb") as handle:
            if not os.path.stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            data = handle.read(budget + 1)
            if len(data) > budget:
                cut.append(name)
                data = data[:budget]
                if not data:
                    continue
            budget -= len(data)
            found[name] = base64.b64encode(data).decode()
    return found, cut


def _inside(workdir: str, name: str) -> str | None:
    path = os.path.normpath(os.path.join(workdir, name))
    return path if path.startswith(workdir + os.sep) else None
