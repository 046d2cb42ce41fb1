"""Events the operator posts, and every reason it posts them with (one place, as KubeRay's
utils/constant.go). Reasons computed from a status (`Phase<phase>`, a RayJob's failure reason, a
condition's reason) come from status.py.

`kopf.info`/`kopf.warn` work only inside a handler kopf runs for that object; the reconcile
workers and the autoscaling loop run beside the handlers, so they post Events themselves, in the
shape kopf gives them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from .naming import MANAGED_BY

# Reconciliation (reconcile.py)
CREATED = "Created"  # the first sync of a new job applied its children
SPEC_APPLIED = "SpecApplied"  # a new generation of the spec was applied
SUSPENDED = "Suspended"  # the RayJob was suspended and the pool scaled to 0
RESUMED = "Resumed"
CHILD_DELETED = "ChildDeleted"  # a deleted child was re-created
RECONCILE_ERROR = "ReconcileError"  # Warning: once per error (permanent) or per streak (transient)
PHASE_PREFIX = "Phase"  # Phase<phase>, on each phase change; a failure is posted with its reason
# ClusterReady/ToolPoolReady changes are posted with the condition's reason (status.py); this one, the
# reason of either while a node holding the job's pods is not Ready, as a Warning
NODE_NOT_READY = "NodeNotReady"
# The autoscaler (scale_loop.py)
TOOL_POOL_SCALED = "ToolPoolScaled"
AUTOSCALER_HOLDING = "AutoscalerHolding"
AUTOSCALER_SCALE_FAILED = "AutoscalerScaleFailed"  # Warning: once per streak of failed writes

NORMAL, WARNING = "Normal", "Warning"
MAX_MESSAGE = 1024  # longer messages are cut in the middle, as kopf does


def once_name(obj: Mapping[str, Any], reason: str) -> str:
    """The name of the one Event of `reason` about `obj` in its life: posted twice (by a sync cut
    short and its retry), the second is refused as a conflict."""
    meta = obj["metadata"]
    return f"{meta['name']}.{meta['uid']}.{reason.lower()}"


def event_manifest(
    obj: Mapping[str, Any], type_: str, reason: str, message: str, now: dt.datetime, once: bool = False
) -> dict[str, Any]:
    """A core/v1 Event about `obj` (a namespaced object with metadata.uid); `type_` is Normal or
    Warning. `once`: named by once_name, otherwise a generated name."""
    if type_ not in ("Normal", "Warning"):
        raise ValueError(f"event type {type_!r}: use Normal or Warning")
    meta = obj["metadata"]
    if len(message) > MAX_MESSAGE:
        half = (MAX_MESSAGE - 3) // 2
        message = f"{message[:half]}...{message[-half:]}"
    stamp = now.astimezone(dt.UTC).isoformat()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            **({"name": once_name(obj, reason)} if once else {"generateName": f"{meta['name']}."}),
            "namespace": meta["namespace"],
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reportingComponent": MANAGED_BY,
        "source": {"component": MANAGED_BY},  # the "From" column of `kubectl describe`
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
