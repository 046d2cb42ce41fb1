"""Nothing silent (issue 16): the hub turns exclusions and the circuit breaker into the job's status
(progress counts, the ToolPoolDegraded condition) and Events, as requests to a fake API server. The real
apiserver and the J-trainer Role: tests/e2e/test_trainer_progress.py."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from trainer_entry.hub import HubSettings, MetricsHub
from trainer_entry.job_status import JobStatusWriter
from trainer_entry.progress import ApiTarget, ProgressReporter

from trainer_entry import job_status


class FakeApi(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str, dict[str, Any]]] = []

    def _record(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeApi.seen.append((self.command, self.path, self.headers["Content-Type"], body))
        self.send_response(201 if self.command == "POST" else 200)
        self.end_headers()
        self.wfile.write(json.dumps({"metadata": {"uid": "uid-1"}}).encode())

    do_PATCH = do_POST = _record

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def api():
    FakeApi.seen = []
    server = HTTPServer(("127.0.0.1", 0), FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ApiTarget(base_url=f"http://127.0.0.1:{server.server_port}", token="tok", ssl_context=None)
    server.shutdown()


def conditions() -> list[dict[str, Any]]:
    return [
        body["status"]["conditions"][0]
        for method, path, _, body in FakeApi.seen
        if method == "PATCH" and "conditions" in body.get("status", {})
    ]


def events() -> list[dict[str, Any]]:
    return [body for method, _, _, body in FakeApi.seen if method == "POST"]


def test_the_condition_is_applied_under_the_trainers_field_manager(api) -> None:
    times = iter([datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in range(10)])
    writer = JobStatusWriter(api, "rl", "j", now=lambda: next(times))
    assert writer.set_degraded(True, job_status.INFRA_FAILURE_RATIO_EXCEEDED, "5 of 8")
    assert writer.set_degraded(True, job_status.INFRA_FAILURE_RATIO_EXCEEDED, "6 of 8")
    assert writer.set_degraded(False, job_status.RECOVERED, "resumed")
    method, path, content_type, body = FakeApi.seen[0]
    assert method == "PATCH" and content_type == "application/apply-patch+yaml"
    status = "/apis/toolrl.dev/v1alpha1/namespaces/rl/toolrljobs/j/status"
    assert path == f"{status}?fieldManager=toolrl-trainer&force=true"
    assert body["apiVersion"] == "toolrl.dev/v1alpha1" and body["kind"] == "ToolRLJob"
    assert body["metadata"] == {"name": "j", "namespace": "rl"}
    first, second, third = conditions()
    assert first == {
        "type": "ToolPoolDegraded",
        "status": "True",
        "lastTransitionTime": "2026-01-01T00:00:01Z",
        "reason": "InfraFailureRatioExceeded",
        "message": "5 of 8",
    }
    assert second["lastTransitionTime"] == first["lastTransitionTime"]  # still True: no transition
    assert (third["status"], third["reason"]) == ("False", "Recovered")
    assert third["lastTransitionTime"] == "2026-01-01T00:00:02Z"
    assert writer.uid == "uid-1"  # learnt from the API's answer, for the Events


def test_events_name_the_job_and_say_why(api) -> None:
    writer = JobStatusWriter(api, "rl", "j", uid="abc")
    assert writer.event(job_status.WARNING, job_status.TRAJECTORIES_EXCLUDED, "3 excluded")
    method, path, _, body = FakeApi.seen[0]
    assert (method, path) == ("POST", "/api/v1/namespaces/rl/events")
    assert body["involvedObject"] == {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "name": "j",
        "namespace": "rl",
        "uid": "abc",
    }
    assert (body["type"], body["reason"], body["message"]) == (
        "Warning",
        "TrajectoriesExcluded",
        "3 excluded",
    )
    assert body["source"] == {"component": "toolrl-trainer"}


@pytest.fixture
def hub(api, monkeypatch) -> MetricsHub:
    from harness.localcluster import free_port

    settings = HubSettings(
        port=free_port(),
        trajectories_per_step=8,
        expected_calls_per_trajectory=1.0,
        job_name="j",
        namespace="rl",
        report_progress=False,
    )
    hub = MetricsHub(settings)
    hub.progress = ProgressReporter(api, "rl", "j", min_interval=0.0)
    hub.job = JobStatusWriter(api, "rl", "j", uid="abc")
    hub.set_total_steps(10)
    return hub


def test_a_step_with_exclusions_reports_them_by_reason(hub: MetricsHub) -> None:
    hub.observe_trajectories(["rejected", "rejected", "unreachable"])
    hub.observe_trajectories([None] * 5)
    hub.record_step({"timing_s/step": 1.0, "critic/score/mean": 0.5}, step=1)
    [(_, _, _, patch)] = [s for s in FakeApi.seen if s[0] == "PATCH"]
    progress = patch["status"]["progress"]
    assert progress["step"] == 1
    assert progress["trajectories"] == 8
    assert progress["trajectoriesExcluded"] == {"rejected": 2, "unreachable": 1}
    assert progress["trajectoriesDiscarded"] == 0
    [event] = events()
    assert event["reason"] == "TrajectoriesExcluded" and event["type"] == "Warning"
    assert event["message"] == (
        "step 1: 3 trajectories excluded from the update for infrastructure failures of their tool calls "
        "(rejected 2, unreachable 1); in the run so far 3 of 8"
    )
    hub.observe_trajectories([None] * 8)
    hub.record_step({"timing_s/step": 1.0}, step=2)
    assert len(events()) == 1, "a step without exclusions posts nothing"


def test_the_breaker_holds_and_releases_the_condition_with_one_event_each(hub: MetricsHub) -> None:
    hub.observe_trajectories(["timeout"] * 6)
    hub.breaker_open(4, 6, 8, 0.2, 2)
    hub.observe_trajectories(["timeout"] * 7)
    hub.breaker_open(4, 7, 8, 0.2, 1)  # the regenerated batch failed too: same hold, no second Event
    assert hub.metrics.tool_pool_degraded._value.get() == 1
    hub.breaker_closed(4, 0, 8, 95.0)
    assert hub.metrics.tool_pool_degraded._value.get() == 0
    held, again, released = conditions()
    assert (held["status"], held["reason"]) == ("True", "InfraFailureRatioExceeded")
    assert held["message"] == (
        "step 4: 6 of 8 trajectories excluded for infrastructure failures (timeout 6), above "
        "rollout.toolCall.maxInfraFailureRatio 0.2: training waits for the tool pool and then generates "
        "the batch again"
    )
    assert "7 of 8" in again["message"] and again["status"] == "True"
    assert (released["status"], released["reason"]) == ("False", "Recovered")
    assert released["message"] == "step 4 resumed after 95s on a new batch with 0 of 8 trajectories excluded"
    assert [(e["type"], e["reason"]) for e in events()] == [
        ("Warning", "ToolPoolDegraded"),
        ("Normal", "ToolPoolRecovered"),
    ]
    assert hub.metrics.total_discarded == 3


def test_a_pool_that_never_recovers_leaves_the_condition_saying_so(hub: MetricsHub) -> None:
    hub.breaker_open(2, 8, 8, 0.2, 0)
    hub.breaker_failed("the tool pool did not recover within 600s: ...")
    last = conditions()[-1]
    assert (last["status"], last["reason"]) == ("True", "PoolNotRecovered")
    assert events()[-1]["reason"] == "PoolNotRecovered"


def test_an_attempt_starts_by_clearing_what_an_earlier_one_left(hub: MetricsHub) -> None:
    hub.training_started(12)
    [started] = conditions()
    assert (started["status"], started["reason"]) == ("False", "PoolReady")
    assert hub.total_steps == 12 and hub.metrics.total_steps._value.get() == 12


def test_a_run_without_one_tool_call_says_so_at_its_end(hub: MetricsHub) -> None:
    hub.observe_trajectories([None] * 8)
    hub.record_step({"timing_s/step": 1.0}, step=1)
    hub.finish()
    [event] = events()
    assert (event["type"], event["reason"]) == ("Warning", "NoToolCalls")
    assert event["message"].startswith("the run made no tool call in its 8 trajectories"), event


def test_a_run_with_a_tool_call_ends_without_that_warning(hub: MetricsHub) -> None:
    hub.observe_tool_calls([("python", "error", 0.01)])  # a failed call is a call the model made
    hub.observe_trajectories([None] * 8)
    hub.finish()
    assert not events()
