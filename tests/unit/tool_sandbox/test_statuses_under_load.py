"""Statuses stay exact under load: time spent queued for capacity is never charged to a call's
timeout, and several servers on one machine (sharing a workdir, all running as root) never
touch each other's sandboxes."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import requests
from harness.sandbox_process import SandboxProcess

SLEEP = "import time\ntime.sleep(1.5)\nprint('slept')"


def test_queued_calls_keep_their_full_timeout_while_another_server_starts(
    make_server: Callable[..., SandboxProcess],
) -> None:
    first = make_server("--workers", "1", "--capacity", "2")
    # 8 calls through 2 slots: the last ones wait ~4.5 s in the queue, longer than their 2 s
    # timeout, and still get all of it once they run.
    with ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(first.execute, SLEEP, timeoutSeconds=2) for _ in range(8)]
        # A second server with the same workdir starts (and cleans up after itself) meanwhile.
        second = make_server("--workers", "1")
        results = [call.result() for call in calls]
    bad = [r for r in results if (r["status"], r["stdout"]) != ("ok", "slept\n")]
    assert not bad, bad
    assert second.execute("print(2)")["status"] == "ok"
    leases = {requests.get(s.url + "/readyz", timeout=5).json()["sandbox"]["lease"] for s in (first, second)}
    assert len(leases) == 2
