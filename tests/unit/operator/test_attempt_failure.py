"""`status.lastAttemptFailure`: why the last retried attempt failed (runPolicy.backoffLimit). KubeRay
shows it only while it moves the RayJob to Retrying and deletes the failed attempt's Ray cluster,
then clears its reason and message for the next attempt; the job's status keeps it, sync after sync,
while the next attempt starts and runs and after the job ends."""

from __future__ import annotations

from typing import Any

from toolrl_operator.status import compute_status, status_changes

from .test_status import deployment, rayjob

T0, T1, T2, T3, T4 = (f"2026-01-01T00:0{i}:00Z" for i in range(5))
WHY = "Job entrypoint command failed with exit code 1"  # KubeRay's message: the Ray job's


def sync(
    make_job, old: dict[str, Any], rj: dict[str, Any] | None, now: str, limit: int = 2
) -> dict[str, Any]:
    """One sync: the status computed from the RayJob with the last status as the record (as the
    operator overlays what it last wrote), merged as the server-side apply leaves it."""
    job = make_job(status=old, runPolicy={"backoffLimit": limit})
    return {**old, **compute_status(job, rj, deployment(), 3, now)}


def test_a_retried_attempt_s_failure_stays_in_the_status_while_the_next_attempt_starts_and_runs(
    make_job,
) -> None:
    running = sync(make_job, {}, rayjob("Running", "RUNNING"), T0)
    assert "lastAttemptFailure" not in running, "no attempt failed yet"

    # the Ray job failed; KubeRay has not counted it yet (its submitter is still ending)
    ending = sync(make_job, running, rayjob("Running", "FAILED", message=WHY), T1)
    assert ending["lastAttemptFailure"] == {"attempt": 1, "reason": "JobFailed", "message": WHY, "time": T1}
    # KubeRay counts it and retries: its reason now, the time it was first seen kept
    rj = rayjob("Retrying", "FAILED", failed=1, reason="AppFailed", message=WHY, rayClusterName="c-1")
    retrying = sync(make_job, ending, rj, T2)
    failure = {"attempt": 1, "reason": "AppFailed", "message": WHY, "time": T1}
    assert retrying["lastAttemptFailure"] == failure
    # one source: the phase's message says the same as the field
    assert retrying["message"] == f"attempt 1 failed ({WHY}); KubeRay retries"
    assert sync(make_job, retrying, rj, T2) == retrying, "the same observation again changes nothing"

    # KubeRay cleared its status for attempt 2: the RayJob no longer says why attempt 1 failed
    for rj, at in (
        (rayjob("", "", failed=1), T2),
        (rayjob("Initializing", "", failed=1, rayClusterName="c-2"), T3),
        (rayjob("Running", "RUNNING", failed=1, rayClusterName="c-2"), T3),
    ):
        later = sync(make_job, retrying, rj, at)
        assert later["attempt"] == 2 and later["lastAttemptFailure"] == failure, (rj, later)
        assert "lastAttemptFailure" not in status_changes(retrying, later), "nothing to write for it"
        retrying = later

    # nothing is cleared when the job succeeds, nor once its RayJob is gone (its TTL)
    done = {**retrying, "progress": {"step": 10, "totalSteps": 10}}
    succeeded = sync(make_job, done, rayjob("Complete", "SUCCEEDED", failed=1, succeeded=1), T4)
    assert succeeded["phase"] == "Succeeded" and succeeded["lastAttemptFailure"] == failure
    gone = sync(make_job, succeeded, None, T4)
    assert gone["phase"] == "Succeeded" and gone["lastAttemptFailure"] == failure


def test_each_retried_failure_replaces_the_last_and_the_final_failure_is_the_phase_s(make_job) -> None:
    first = {"attempt": 1, "reason": "AppFailed", "message": WHY, "time": T1}
    running = sync(make_job, {"lastAttemptFailure": first}, rayjob("Running", "RUNNING", failed=1), T2)
    assert running["lastAttemptFailure"] == first, "as an operator restarted mid-attempt reads its record"

    rj = rayjob("Retrying", "FAILED", failed=2, reason="SubmissionFailed", message="submitter failed")
    second = sync(make_job, running, rj, T3)
    assert second["lastAttemptFailure"] == {
        "attempt": 2,
        "reason": "SubmissionFailed",
        "message": "submitter failed",
        "time": T3,
    }

    # the last attempt fails with no retry left: the phase says why, the field the attempt before
    rj = rayjob("Failed", "FAILED", failed=3, reason="AppFailed", message="exit 1")
    spent = sync(make_job, second, rj, T4)
    assert (spent["phase"], spent["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert spent["lastAttemptFailure"] == second["lastAttemptFailure"]


def test_a_job_without_retries_has_no_retried_attempt(make_job) -> None:
    for rj in (rayjob("Running", "FAILED", message=WHY), rayjob("Failed", "FAILED", failed=1, message=WHY)):
        status = sync(make_job, {}, rj, T1, limit=0)
        assert status["phase"] == "Failed" and "lastAttemptFailure" not in status, status


def test_the_crd_declares_last_attempt_failure(schema: dict[str, Any], make_job) -> None:
    """The API server prunes undeclared status fields: the field and each of its keys is declared."""
    rj = rayjob("Retrying", "FAILED", failed=1, reason="AppFailed", message=WHY)
    field = sync(make_job, {}, rj, T1)["lastAttemptFailure"]
    declared = schema["properties"]["status"]["properties"]["lastAttemptFailure"]
    assert declared["type"] == "object"
    types = {"attempt": "integer", "reason": "string", "message": "string", "time": "string"}
    assert {key: declared["properties"][key]["type"] for key in field} == types
    assert declared["properties"]["time"]["format"] == "date-time"
