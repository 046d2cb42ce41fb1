"""The jobs-by-phase gauge counts jobs, not transitions."""

from __future__ import annotations

from prometheus_client import REGISTRY
from toolrl_operator.metrics import PhaseBook


def _gauge(namespace: str, phase: str) -> float | None:
    return REGISTRY.get_sample_value("toolrl_operator_jobs", {"namespace": namespace, "phase": phase})


def test_phase_book_counts_jobs_not_transitions() -> None:
    book = PhaseBook()
    book.record("unit-ns", "a", "Running")
    book.record("unit-ns", "a", "Running")
    book.record("unit-ns", "b", "Running")
    assert _gauge("unit-ns", "Running") == 2
    book.record("unit-ns", "a", "Failed")
    assert (_gauge("unit-ns", "Running"), _gauge("unit-ns", "Failed")) == (1, 1)
    book.record("unit-ns", "a", None)
    book.record("unit-ns", "b", None)
    assert (_gauge("unit-ns", "Running"), _gauge("unit-ns", "Failed")) == (0, 0)
