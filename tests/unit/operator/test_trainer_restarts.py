"""A lost trainer (its submitter pod failed mid-attempt, as when the Ray head pod is lost): counted
once in `status.restarts`, said by the Recovering condition and Events until the restarted trainer
reports progress, and never counted twice, also across operator restarts (the status is the record)."""

from __future__ import annotations

from typing import Any

from toolrl_operator import events
from toolrl_operator.naming import SUBMITTER_CONTAINER
from toolrl_operator.reconcile import status_announcements
from toolrl_operator.status import (
    RECOVERING,
    RESUMED,
    TRAINER_RESTARTED,
    LostTrainer,
    Problems,
    compute_status,
    lost_trainer,
)

from .test_status import deployment, rayjob

T0, T1, T2, T3 = (f"2026-01-01T00:0{i}:00Z" for i in range(4))


def submitter_pod(name: str, phase: str, finished: str = T1, exit_code: int = 1) -> dict[str, Any]:
    terminated = {"reason": "Error", "exitCode": exit_code, "finishedAt": finished}
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": SUBMITTER_CONTAINER}]},
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": SUBMITTER_CONTAINER, "state": {"terminated": terminated}}],
        },
    }


def test_only_a_failed_submitter_pod_shows_a_lost_trainer() -> None:
    assert lost_trainer(submitter_pod("s-1", "Failed")) == LostTrainer(T1, "s-1", "Error, exit code 1")
    assert lost_trainer(submitter_pod("s-1", "Succeeded", exit_code=0)) is None
    assert lost_trainer(submitter_pod("s-1", "Running")) is None
    head = submitter_pod("head", "Failed")
    head["spec"]["containers"] = [{"name": "ray-head"}]
    assert lost_trainer(head) is None, "KubeRay replaces Ray pods; the submitter shows the trainer's fate"
    evicted = {
        "metadata": {"name": "s-2"},
        "spec": {"containers": [{"name": SUBMITTER_CONTAINER}]},
        "status": {"phase": "Failed", "reason": "Evicted", "message": "the node was low on memory"},
    }
    assert lost_trainer(evicted) == LostTrainer("", "s-2", "Evicted: the node was low on memory")


def _status(make_job, old: dict[str, Any], lost: tuple[LostTrainer, ...]) -> dict[str, Any]:
    job = make_job(status=old)
    problems = Problems(lost_trainers=lost)
    return compute_status(job, rayjob("Running", "RUNNING"), deployment(), 3, T2, problems)


def test_a_lost_trainer_is_counted_once_and_recovering_until_progress_after_it(make_job) -> None:
    before = _status(make_job, {"progress": {"step": 5, "lastUpdateTime": T0}}, ())
    assert before["restarts"] == 0 and RECOVERING not in {c["type"] for c in before["conditions"]}

    lost = (LostTrainer(T1, "s-1", "Error, exit code 1"),)
    during = _status(make_job, {**before, "progress": {"step": 5, "lastUpdateTime": T0}}, lost)
    assert during["restarts"] == 1
    assert during["lastRestart"] == {"time": T1, "pod": "s-1", "detail": "Error, exit code 1"}
    recovering = {c["type"]: c for c in during["conditions"]}[RECOVERING]
    assert (recovering["status"], recovering["reason"]) == ("True", TRAINER_RESTARTED)
    assert "s-1" in recovering["message"] and "resumes from the last checkpoint" in recovering["message"]
    assert (during["phase"], during["reason"]) == ("Running", TRAINER_RESTARTED), "kubectl shows it too"
    assert [r for _, r, _ in status_announcements(before, during)] == [TRAINER_RESTARTED]

    again = _status(make_job, {**during, "progress": {"step": 5, "lastUpdateTime": T0}}, lost)
    assert again["restarts"] == 1, "the same lost trainer, seen again (or by a restarted operator)"
    assert status_announcements(during, again) == []

    resumed = _status(make_job, {**again, "progress": {"step": 5, "lastUpdateTime": T3}}, lost)
    assert resumed["restarts"] == 1
    recovering = {c["type"]: c for c in resumed["conditions"]}[RECOVERING]
    assert (recovering["status"], recovering["reason"]) == ("False", RESUMED)
    assert resumed["reason"] == "RayJobRunning"
    assert status_announcements(again, resumed) == [(events.NORMAL, RESUMED, recovering["message"])]

    second = (*lost, LostTrainer(T3, "s-2", "Error, exit code 1"))
    twice = _status(make_job, {**resumed, "progress": {"step": 6, "lastUpdateTime": T2}}, second)
    assert twice["restarts"] == 2 and twice["lastRestart"]["pod"] == "s-2"
