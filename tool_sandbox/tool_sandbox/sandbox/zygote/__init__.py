"""The warm worker ("zygote"): a single-threaded process that imports the heavy libraries once
and forks one isolated child per call.

It is started by the server as a separate program (never forked from the multi-threaded
server), speaks framed JSON on its stdin/stdout, and keeps a few children forked and isolated
ahead of time, so a call costs one pipe write, the code itself and one exit.

Run as `python -m tool_sandbox.sandbox.zygote '<json settings>'` (__main__.py: the process's
set-up). Its parts: worker.py (the loop: requests, children, calls), limits.py (a call's deadline,
output cap and disk budget, and the verdict: pure), staging.py (a child's directory and the files
placed in it and fetched from it), leases.py (a worker's directory and uid range), preload.py
(what every child inherits)."""

from tool_sandbox.sandbox.zygote.leases import UIDS_PER_LEASE, Lease, claim_lease, sweep_unheld
from tool_sandbox.sandbox.zygote.limits import CallLimits
from tool_sandbox.sandbox.zygote.preload import PRELOAD
from tool_sandbox.sandbox.zygote.staging import FETCH_BUDGET_BYTES
from tool_sandbox.sandbox.zygote.worker import Worker

__all__ = [
    "FETCH_BUDGET_BYTES",
    "PRELOAD",
    "UIDS_PER_LEASE",
    "CallLimits",
    "Lease",
    "Worker",
    "claim_lease",
    "sweep_unheld",
]
