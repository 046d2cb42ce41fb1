"""The chart grants the operator exactly what the one list of child kinds says it needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolrl_operator.children import CHILD_KINDS


def _grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_every_child_kind_has_exactly_its_verbs(render: Callable[..., list[dict[str, Any]]]) -> None:
    [role] = [o for o in render({"keda": {"enabled": True}}) if o["kind"] == "ClusterRole"]
    grants = _grants(role["rules"])
    for child in CHILD_KINDS:
        assert grants.get((child.group, child.plural)) == set(child.verbs), child.kind
    [plain] = [o for o in render() if o["kind"] == "ClusterRole"]
    assert ("keda.sh", "scaledobjects") not in _grants(plain["rules"]), "KEDA's only with keda.enabled"


def test_child_kinds_are_unique_and_the_rayjob_goes_last() -> None:
    kinds = [child.kind for child in CHILD_KINDS]
    assert len(set(kinds)) == len(kinds)
    assert kinds[-1] == "RayJob", "its pods use every other child"
