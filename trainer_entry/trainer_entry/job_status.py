"""What the trainer tells its job besides `status.progress`: the `ToolPoolDegraded` condition and Events
that say how many trajectories were excluded and why (issue 16: nothing silent).

The trainer owns this condition: only it knows, with the numbers, when the circuit breaker holds a step
and when it resumes (the operator would see it a scrape or a reconcile later, and could not tell a
held step from a slow one). It writes it by server-side apply under its own field manager: the job's
conditions are a list keyed by type, so the operator's conditions (applied as `toolrl-operator`) and
this one never overwrite each other. The `J-trainer` Role allows patching the job's status and creating
Events in its namespace. A failed write is logged, never fatal: the run goes on.

The names below are the trainer's; the operator never writes this condition and does not name it.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from toolrl_api import API_VERSION, KIND
from toolrl_api.status_types import StatusCondition

from trainer_entry.progress import ApiTarget, status_path, timestamp

log = logging.getLogger(__name__)

FIELD_MANAGER = "toolrl-trainer"
TOOL_POOL_DEGRADED = "ToolPoolDegraded"  # the condition's type, and the Event when it turns True
# reasons of the condition
INFRA_FAILURE_RATIO_EXCEEDED = "InfraFailureRatioExceeded"  # True: the breaker holds a step
POOL_NOT_RECOVERED = "PoolNotRecovered"  # True: the bound passed, the run fails
RECOVERED = "Recovered"  # False: the step resumed on a new batch
POOL_READY = "PoolReady"  # False: training (an attempt) started with the pool ready
# Event reasons (besides TOOL_POOL_DEGRADED and POOL_NOT_RECOVERED)
TOOL_POOL_RECOVERED = "ToolPoolRecovered"
TRAJECTORIES_EXCLUDED = "TrajectoriesExcluded"
RAY_NODE_LOST = "RayNodeLost"  # Warning: a Ray node died mid-run; the attempt ends (node_watch.py)
# Warning: a placement group of verl's stayed pending past runPolicy.placementTimeoutSeconds; the attempt ends
PLACEMENT_PENDING = "PlacementPending"
REWARD_FUNCTION_FAILED = "RewardFunctionFailed"  # Warning: the reward raised on an answer; the run stops
NO_TOOL_CALLS = "NoToolCalls"  # Warning: the run ended without one tool call
NORMAL, WARNING = "Normal", "Warning"


def condition_apply(namespace: str, name: str, condition: dict[str, Any]) -> dict[str, Any]:
    """The server-side apply body that owns exactly one condition of the job's status."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"conditions": [condition]},
    }


def degraded_condition(degraded: bool, reason: str, message: str, since: datetime) -> dict[str, Any]:
    """`ToolPoolDegraded` in metav1.Condition shape (the API's StatusCondition: its bounds checked);
    `since` is when its status last changed."""
    condition = StatusCondition(
        type=TOOL_POOL_DEGRADED,
        status="True" if degraded else "False",
        last_transition_time=timestamp(since),
        reason=reason,
        message=message,
    )
    return condition.model_dump(by_alias=True, exclude_none=True)


def event_body(
    namespace: str, name: str, uid: str, type_: str, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    """A core/v1 Event about the job, from the trainer."""
    involved = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "namespace": namespace}
    if uid:
        involved["uid"] = uid
    stamp = now.astimezone(UTC).isoformat()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "involvedObject": involved,
        "reportingComponent": FIELD_MANAGER,
        "source": {"component": FIELD_MANAGER},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def no_tool_calls_message(trajectories: int) -> str:
    """What a run that ended without one tool call says (its rewards say nothing of the tools)."""
    return (
        f"the run made no tool call in its {trajectories} trajectories: the model never called spec.tools,"
        " so its rewards say nothing about them. Check that the data's prompts teach"
        " spec.rollout.protocol (python -m trainer_entry.data --protocol) and that the model can follow"
        " them (python -m trainer_entry.tiny_model --spec measures a call rate)"
    )


def excluded_message(step: int, reasons: dict[str, int], totals: dict[str, Any]) -> str:
    """The TrajectoriesExcluded Event: this step's exclusions by reason, and the run's so far."""
    by_reason = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
    run = totals.get("trajectoriesExcluded") or {}
    return (
        f"step {step}: {sum(reasons.values())} trajectories excluded from the update for infrastructure "
        f"failures of their tool calls ({by_reason}); in the run so far {sum(run.values())} of "
        f"{totals.get('trajectories', 0)}"
    )


class JobStatusWriter:
    """Applies the trainer's condition and posts its Events for one job."""

    def __init__(
        self,
        target: ApiTarget,
        namespace: str,
        name: str,
        uid: str = "",
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.target, self.namespace, self.name, self.uid, self.now = target, namespace, name, uid, now
        self._degraded: bool | None = None
        self._since = self.now()

    def set_degraded(self, degraded: bool, reason: str, message: str) -> bool:
        """Apply `ToolPoolDegraded`; returns whether the API took it."""
        if degraded != self._degraded:
            self._degraded, self._since = degraded, self.now()
        body = condition_apply(
            self.namespace, self.name, degraded_condition(degraded, reason, message, self._since)
        )
        query = urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        path = f"{status_path(self.namespace, self.name)}?{query}"
        answer = self._send(
            self.target.request("PATCH", path, body, "application/apply-patch+yaml"), "condition"
        )
        if answer is not None and not self.uid:
            self.uid = str((answer.get("metadata") or {}).get("uid") or "")
        return answer is not None

    def event(self, type_: str, reason: str, message: str) -> bool:
        """Post an Event about the job; returns whether the API took it."""
        body = event_body(self.namespace, self.name, self.uid, type_, reason, message, self.now())
        path = f"/api/v1/namespaces/{self.namespace}/events"
        return (
            self._send(self.target.request("POST", path, body, "application/json"), f"{reason} event")
            is not None
        )

    def _send(self, request: urllib.request.Request, what: str) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.target.ssl_context) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            log.warning(
                "the job's %s was refused (HTTP %s): %s; check the J-trainer Role (patch toolrljobs/status, "
                "create events)",
                what,
                exc.code,
                exc.read()[:200],
            )
            return None
        except (urllib.error.URLError, OSError) as exc:
            log.warning("the job's %s could not be sent: %s", what, exc)
            return None
        try:
            answer = json.loads(text or b"{}")
        except ValueError:
            answer = {}
        return answer if isinstance(answer, dict) else {}
