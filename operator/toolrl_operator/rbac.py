"""The trainer's identity: a ServiceAccount allowed only to patch its own job's status (progress, and
its ToolPoolDegraded condition) and to post Events about it (trajectories excluded, the pool degraded)."""

from __future__ import annotations

from typing import Any

from .job import Job
from .naming import COMPONENT_TRAINER, GROUP, PLURAL, child_metadata, trainer_name


def build_service_account(job: Job) -> dict[str, Any]:
    name = job.name
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_metadata(job.body, trainer_name(name), COMPONENT_TRAINER),
    }


def build_role(job: Job) -> dict[str, Any]:
    name = job.name
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": child_metadata(job.body, trainer_name(name), COMPONENT_TRAINER),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": [f"{PLURAL}/status"],
                "resourceNames": [name],
                "verbs": ["patch"],
            },
            # Events cannot be scoped to an involved object by RBAC: create in the job's namespace
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ],
    }


def build_role_binding(job: Job) -> dict[str, Any]:
    """The Role for the operator's per-job account, and for `cluster.serviceAccountName` when the
    Ray pods run as the user's own account instead."""
    name = job.name
    meta = child_metadata(job.body, trainer_name(name), COMPONENT_TRAINER)
    accounts = [trainer_name(name)]
    workload = job.spec.cluster.service_account_name
    if workload and workload != accounts[0]:
        accounts.append(workload)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": trainer_name(name)},
        "subjects": [
            {"kind": "ServiceAccount", "name": sa, "namespace": meta["namespace"]} for sa in accounts
        ],
    }
