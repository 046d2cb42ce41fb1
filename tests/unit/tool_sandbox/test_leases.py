"""Worker leases: as root, uid ranges are machine-wide, so two servers with different workdirs
must never hand their children the same uids (a new worker SIGKILLs its whole range)."""

from __future__ import annotations

import os
from pathlib import Path

from tool_sandbox.sandbox.zygote import UIDS_PER_LEASE, claim_lease


def test_uid_leases_are_unique_across_workdirs(tmp_path: Path) -> None:
    machine = str(tmp_path / "uid-leases")
    a = claim_lease(str(tmp_path / "server-a"), 200000, machine)
    b = claim_lease(str(tmp_path / "server-b"), 200000, machine)
    try:
        assert a.number != b.number
        assert abs(a.uid_base - b.uid_base) >= UIDS_PER_LEASE
        assert Path(a.workdir).parent != Path(b.workdir).parent
    finally:
        os.close(a.fd)
        os.close(b.fd)


def test_without_uids_leases_stay_per_workdir(tmp_path: Path) -> None:
    a = claim_lease(str(tmp_path / "server-a"), None)
    b = claim_lease(str(tmp_path / "server-b"), None)
    try:
        assert (a.number, b.number) == (0, 0)
        assert a.uid_base is None and b.uid_base is None
    finally:
        os.close(a.fd)
        os.close(b.fd)
