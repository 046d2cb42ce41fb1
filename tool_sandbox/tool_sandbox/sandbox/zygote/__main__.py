"""`python -m tool_sandbox.sandbox.zygote '<json settings>'`: the worker process's set-up (its
descriptors, the modules its children inherit, its lease), then its loop."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys

from tool_sandbox.sandbox import refusals, semlock
from tool_sandbox.sandbox.libc import PR_SET_DUMPABLE, PR_SET_PDEATHSIG, prctl, set_name
from tool_sandbox.sandbox.zygote import leases, preload
from tool_sandbox.sandbox.zygote.worker import Worker


def _claim_fds() -> None:
    """Move the server's pipes to fds 3 and 4 (a child replaces both with its own) before
    anything else opens a descriptor, and point stdin/stdout at /dev/null so no stray print
    can corrupt the protocol."""
    os.dup2(0, 3)
    os.dup2(1, 4)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)


def main() -> None:
    _claim_fds()
    settings = json.loads(sys.argv[1])
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_DUMPABLE, 0)
    set_name(b"sandbox-worker")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload.load(settings.get("preload", preload.PRELOAD))
    semlock.install()  # multiprocessing's locks without /dev/shm, for the children's threads
    refusals.install()  # what the sandbox refuses (chmod, new processes) said in the error
    settings["slots"] = slots = min(int(settings.get("slots", 64)), leases.UIDS_PER_LEASE)
    uid_base = settings.get("uidBase") if os.geteuid() == 0 else None
    lease = leases.claim_lease(settings["workdir"], uid_base)
    if uid_base is not None:
        leases.warn_if_unreachable(lease.workdir)
    leases.sweep(lease, slots)
    leases.sweep_unheld(settings["workdir"], settings["workdir"] if uid_base is None else leases.UID_LEASES)
    worker = Worker(settings, lease)
    preload.forget_exit_handlers()
    gc.collect()
    gc.freeze()  # the collector never walks (and so never copies) what every process shares
    worker.run()


if __name__ == "__main__":
    main()
