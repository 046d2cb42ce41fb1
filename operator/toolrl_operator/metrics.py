"""The operator's Prometheus metrics (names in docs/contracts.md)."""

from __future__ import annotations

import threading
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

RECONCILE_DURATION = Histogram(
    "toolrl_operator_reconcile_duration_seconds",
    "Time to apply a job's children and write its status.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILE_ERRORS = Counter(
    "toolrl_operator_reconcile_errors_total",
    "Reconciles that failed, by reason (the API server's reason, or the exception type).",
    ["reason"],
)
JOBS = Gauge("toolrl_operator_jobs", "ToolRLJobs by namespace and phase.", ["namespace", "phase"])


class PhaseBook:
    """Each job's last known phase, kept so the JOBS gauge counts jobs, not transitions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        self._seen: set[tuple[str, str]] = set()

    def record(self, namespace: str, name: str, phase: str | None) -> None:
        """Set (or with None, forget) a job's phase and refresh the gauge."""
        with self._lock:
            if phase is None:
                self._phases.pop((namespace, name), None)
            else:
                self._phases[(namespace, name)] = phase
            counts = Tally((ns, ph) for (ns, _), ph in self._phases.items())
            self._seen.update(counts)
            for ns, ph in self._seen:
                JOBS.labels(ns, ph).set(counts.get((ns, ph), 0))


PHASES = PhaseBook()
