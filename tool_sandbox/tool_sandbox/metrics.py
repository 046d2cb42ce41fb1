"""The pool's Prometheus metrics (names as in docs/contracts.md)."""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# 1 ms ... 60 s: warm calls take milliseconds, timeouts end at the tool's limit.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

prometheus_client.disable_created_metrics()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.duration = Histogram(
            "toolrl_tool_call_duration_seconds",
            "Time from receiving a tool call to answering it, by tool, outcome and protocol.",
            ["tool", "outcome", "protocol"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.calls = Counter(
            "toolrl_tool_calls",
            "Tool calls answered, by tool, outcome and protocol (the API it came in by).",
            ["tool", "outcome", "protocol"],
            registry=r,
        )
        self.inflight = Gauge("toolrl_tool_inflight", "Tool calls executing now.", registry=r)
        self.queue_depth = Gauge("toolrl_tool_queue_depth", "Tool calls waiting for capacity.", registry=r)
        self.capacity = Gauge("toolrl_tool_capacity", "Tool calls this replica executes at once.", registry=r)
        self.truncated = Counter(
            "toolrl_tool_output_truncated", "Tool calls whose output was truncated.", ["tool"], registry=r
        )
        self.sessions = Gauge("toolrl_sandbox_sessions", "Live stateful sandbox sessions.", registry=r)

    def bind(
        self,
        inflight: Callable[[], float],
        queue_depth: Callable[[], float],
        capacity: float,
        sessions: Callable[[], float],
    ) -> None:
        """Read the live gauges from their owners at scrape time."""
        self.inflight.set_function(inflight)
        self.queue_depth.set_function(queue_depth)
        self.capacity.set(capacity)
        self.sessions.set_function(sessions)

    def observe(self, tool: str, outcome: str, seconds: float, truncated: bool, protocol: str) -> None:
        self.duration.labels(tool, outcome, protocol).observe(seconds)
        self.calls.labels(tool, outcome, protocol).inc()
        if truncated:
            self.truncated.labels(tool).inc()

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
