"""kwok's stages as the local cluster's fake nodes use them: every Job's pod completes at once, except
KubeRay's submitter, which stays Running as on a real node until its Ray job ends."""

from __future__ import annotations

import yaml
from harness.localcluster.cluster import SUBMITTER_CONTAINER, fake_node_stages
from toolrl_operator import rayjob

# kwok v0.8's kustomize/stage/pod/fast/pod-complete.yaml, its selector as shipped (template cut)
STOCK = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: 'DoesNotExist'}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: 'DoesNotExist'}
    - {key: '.status.phase', operator: 'In', values: ['Running']}
    - {key: '.metadata.ownerReferences.[].kind', operator: 'In', values: ['Job']}
  next:
    statusTemplate: |
      phase: Succeeded
"""


def _expressions(text: str) -> dict[str, list[dict]]:
    return {
        s["metadata"]["name"]: s["spec"]["selector"]["matchExpressions"] for s in yaml.safe_load_all(text)
    }


def test_job_pods_complete_except_kuberays_submitter() -> None:
    before, after = _expressions(STOCK), _expressions(fake_node_stages(STOCK))
    assert after["pod-ready"] == before["pod-ready"]
    assert after["pod-complete"][:3] == before["pod-complete"]
    assert after["pod-complete"][3] == {
        "key": ".spec.containers.[].name",
        "operator": "NotIn",
        "values": ["ray-job-submitter"],
    }
    [complete] = [
        s for s in yaml.safe_load_all(fake_node_stages(STOCK)) if s["metadata"]["name"] == "pod-complete"
    ]
    assert complete["spec"]["next"]["statusTemplate"] == "phase: Succeeded\n"


def test_the_submitter_the_stage_spares_is_the_operators() -> None:
    assert SUBMITTER_CONTAINER == rayjob.SUBMITTER_CONTAINER
