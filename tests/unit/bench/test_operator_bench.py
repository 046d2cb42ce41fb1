"""bench/operator: a burst converges only when every job's status says its children are applied; the
operator's and the control plane's CPU seconds and the syncs come from /proc and the operator's
metrics; the in-process sync benchmark's no-op syncs call no API."""

from __future__ import annotations

import os
import time

from bench.operator import run, sync_cpu

METRICS = """# HELP toolrl_operator_reconcile_duration_seconds Time to apply a job's children.
# TYPE toolrl_operator_reconcile_duration_seconds histogram
toolrl_operator_reconcile_duration_seconds_bucket{le="0.01"} 3.0
toolrl_operator_reconcile_duration_seconds_bucket{le="+Inf"} 7.0
toolrl_operator_reconcile_duration_seconds_count 7.0
toolrl_operator_reconcile_duration_seconds_sum 0.5
# HELP toolrl_operator_reconcile_errors_total Reconciles that failed, by reason.
# TYPE toolrl_operator_reconcile_errors_total counter
toolrl_operator_reconcile_errors_total{reason="QuotaExceeded"} 2.0
toolrl_operator_reconcile_errors_total{reason="Conflict"} 1.0
toolrl_operator_reconcile_errors_created{reason="Conflict"} 1.7e9
"""


def test_a_job_is_converged_when_its_current_status_says_every_child_is_applied() -> None:
    meta = {"generation": 2}
    applied = {"type": "Reconciled", "status": "True", "reason": "ChildrenApplied"}
    refused = {"type": "Reconciled", "status": "False", "reason": "QuotaExceeded"}

    def job(observed: int, condition: dict[str, str]) -> dict[str, object]:
        return {"metadata": meta, "status": {"observedGeneration": observed, "conditions": [condition]}}

    assert run.reconciled(job(2, applied))
    assert not run.reconciled(job(2, refused)), "a current status that says a child was refused"
    assert not run.reconciled(job(1, applied))
    assert not run.reconciled({"metadata": meta})


def test_syncs_and_errors_are_read_from_the_operators_metrics() -> None:
    assert run.metric_total(METRICS, "toolrl_operator_reconcile_duration_seconds") == 7
    assert run.metric_total(METRICS, "toolrl_operator_reconcile_errors") == 3


def test_cpu_seconds_of_a_process_grow_with_its_work() -> None:
    before = run.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert run.cpu_seconds(os.getpid()) - before >= 0.03


def test_the_in_process_benchmarks_no_op_syncs_call_no_api() -> None:
    result = sync_cpu.measure(jobs=3, rounds=2, profile=None)
    assert result["create"]["api_calls_per_sync"] == {"apply": 10.0, "event": 2.0, "status": 1.0}
    assert result["noop"]["api_calls_per_sync"] == {}, "a sync that changes nothing calls no API"
    assert result["resync"]["api_calls_per_sync"] == {"apply": 10.0}
