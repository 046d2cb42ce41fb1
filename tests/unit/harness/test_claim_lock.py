"""The machine-wide claim lock of the local cluster's real nodes: exclusive between threads (and
processes), re-entrant within one (a stale claim's teardown releases the claim while it is held)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from harness.localcluster import node


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "CLAIM_DIR", tmp_path)


def test_the_claim_lock_is_reentrant_within_a_thread() -> None:
    done = threading.Event()

    def nested() -> None:
        with node._claim_lock(), node._claim_lock():
            pass
        with node._claim_lock():  # released whole: taken again
            done.set()

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    assert done.wait(10), "a nested claim lock blocked its own thread"


def test_the_claim_lock_excludes_another_thread_until_released() -> None:
    entered = threading.Event()

    def other() -> None:
        with node._claim_lock():
            entered.set()

    with node._claim_lock():
        worker = threading.Thread(target=other, daemon=True)
        worker.start()
        time.sleep(0.3)
        assert not entered.is_set(), "another thread took the lock while it was held"
    assert entered.wait(10), "the lock was not released"
