"""The daemon's pure parts: when it acts, and the condition it writes."""

from toolrl_operator import autoscaling


def job(phase="Running", **spec):
    return {
        "metadata": {"name": "j", "namespace": "n"},
        "spec": {"toolPool": {}, **spec},
        "status": {"phase": phase},
    }


def test_acts_only_on_live_native_jobs():
    assert autoscaling.native(job())
    assert not autoscaling.native(job(suspend=True))
    assert not autoscaling.native(job(phase="Succeeded"))
    assert not autoscaling.native(job(toolPool={"autoscaler": "keda"}))
    deleting = job()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not autoscaling.native(deleting)


def test_condition_says_why_it_holds_and_keeps_the_transition_time():
    bad = autoscaling.condition(False, "Prometheus at http://p did not answer", None, "T1")
    assert bad == {
        "type": "AutoscalerHealthy",
        "status": "False",
        "lastTransitionTime": "T1",
        "reason": "MetricsUnavailable",
        "message": "holding the pool's size: Prometheus at http://p did not answer",
    }
    still_bad = autoscaling.condition(False, "other", bad, "T2")
    assert still_bad["lastTransitionTime"] == "T1"
    good = autoscaling.condition(True, "", still_bad, "T3")
    assert (good["status"], good["reason"], good["lastTransitionTime"]) == ("True", "MetricsAvailable", "T3")
