# ruff: noqa: E501
"""The ToolRLJob CRD's `status` as pydantic models: one class per object, attributes in
snake_case aliased to the CRD's camelCase, the CRD's enums and bounds; every field optional, as a writer's fragment has it.

GENERATED from crds/toolrl.dev_toolrljobs.yaml by `make chart-generate`
(charts/chartgen/spec_types.py): do not edit; change the CRD and regenerate.
`make chart-check` fails while this file is stale.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Object(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)


class StatusLastRestart(_Object):
    """`status.lastRestart`."""

    time: str | None = Field(default=None, alias="time")
    pod: str | None = Field(default=None, alias="pod")
    detail: str | None = Field(default=None, alias="detail")


class StatusLastAttemptFailure(_Object):
    """`status.lastAttemptFailure`."""

    attempt: int | None = Field(default=None, alias="attempt")
    reason: str | None = Field(default=None, alias="reason")
    message: str | None = Field(default=None, alias="message")
    time: str | None = Field(default=None, alias="time")


class StatusToolPool(_Object):
    """`status.toolPool`."""

    replicas: int | None = Field(default=None, alias="replicas")
    ready_replicas: int | None = Field(default=None, alias="readyReplicas")
    desired_replicas: int | None = Field(default=None, alias="desiredReplicas")
    endpoint: str | None = Field(default=None, alias="endpoint")
    summary: str | None = Field(default=None, alias="summary")


class StatusWorkerGroup(_Object):
    """`status.workerGroups[]`."""

    name: str | None = Field(default=None, alias="name")
    replicas: int | None = Field(default=None, alias="replicas")
    ready_replicas: int | None = Field(default=None, alias="readyReplicas")
    gpus_per_worker: int | None = Field(default=None, alias="gpusPerWorker")


class StatusProgress(_Object):
    """`status.progress`."""

    step: int | None = Field(default=None, alias="step")
    total_steps: int | None = Field(default=None, alias="totalSteps")
    reward_mean: int | float | None = Field(default=None, alias="rewardMean")
    last_update_time: str | None = Field(default=None, alias="lastUpdateTime")
    trajectories: int | None = Field(default=None, alias="trajectories")
    trajectories_excluded: dict[str, Any] | None = Field(default=None, alias="trajectoriesExcluded")
    trajectories_discarded: int | None = Field(default=None, alias="trajectoriesDiscarded")


class StatusCondition(_Object):
    """`status.conditions[]`."""

    type: str = Field(alias="type", max_length=316)
    status: Literal["True", "False", "Unknown"] = Field(alias="status")
    observed_generation: int | None = Field(default=None, alias="observedGeneration", ge=0)
    last_transition_time: str = Field(alias="lastTransitionTime")
    reason: str = Field(alias="reason", max_length=1024)
    message: str = Field(alias="message", max_length=32768)


class Status(_Object):
    """`status`."""

    phase: Literal["Pending", "Provisioning", "Running", "Succeeded", "Failed", "Suspended"] | None = Field(default=None, alias="phase")
    reason: str | None = Field(default=None, alias="reason")
    attempt: int | None = Field(default=None, alias="attempt")
    restarts: int | None = Field(default=None, alias="restarts")
    last_restart: StatusLastRestart | None = Field(default=None, alias="lastRestart")
    last_attempt_failure: StatusLastAttemptFailure | None = Field(default=None, alias="lastAttemptFailure")
    message: str | None = Field(default=None, alias="message")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")
    ray_job_name: str | None = Field(default=None, alias="rayJobName")
    ray_cluster_name: str | None = Field(default=None, alias="rayClusterName")
    dashboard_url: str | None = Field(default=None, alias="dashboardURL")
    start_time: str | None = Field(default=None, alias="startTime")
    completion_time: str | None = Field(default=None, alias="completionTime")
    tool_pool: StatusToolPool | None = Field(default=None, alias="toolPool")
    worker_groups: list[StatusWorkerGroup] | None = Field(default=None, alias="workerGroups")
    progress: StatusProgress | None = Field(default=None, alias="progress")
    conditions: list[StatusCondition] | None = Field(default=None, alias="conditions")
