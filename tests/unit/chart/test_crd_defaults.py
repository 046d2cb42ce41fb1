"""The generated modules of the CRD's defaults: each distribution's copy follows a changed CRD, and the
committed copies are the CRD's (`make chart-check`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from chartgen.crd_defaults import DISTRIBUTIONS, MODULE, apply_defaults, spec_schema
from chartgen.outputs import CRD_DEFAULTS_MODULES, CRD_SOURCE, REPO, stale_outputs


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"generated_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_changed_crd_default_reaches_every_distribution(tmp_path: Path) -> None:
    crd = yaml.safe_load(CRD_SOURCE.read_text())
    spec = spec_schema(crd)
    tool_call = spec["properties"]["rollout"]["properties"]["toolCall"]["properties"]
    tool = spec["properties"]["tools"]["items"]["properties"]
    custom = spec["properties"]["reward"]["properties"]["custom"]["properties"]
    assert (tool_call["maxRetries"]["default"], tool["timeoutSeconds"]["default"]) == (3, 10)
    tool_call["maxRetries"]["default"] = 7
    tool["timeoutSeconds"]["default"] = 11
    custom["key"]["default"] = "score.py"
    changed = tmp_path / "changed-crd.yaml"
    changed.write_text(yaml.safe_dump(crd, sort_keys=False))
    out = tmp_path / "repo"

    subprocess.run(
        [sys.executable, "-m", "chartgen", "--crd", str(changed), "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )

    modules = sorted((out / d / MODULE for d in DISTRIBUTIONS), key=str)
    assert len(modules) >= 2 and all(m.is_file() for m in modules), modules
    for path in modules:
        generated = load(path)
        where = path.relative_to(out)
        assert generated.SPEC_DEFAULTS["rollout"]["toolCall"]["maxRetries"] == 7, where
        assert generated.DEFAULTS_WHEN_PRESENT["tools[]"]["timeoutSeconds"] == 11, where
        assert generated.DEFAULTS_WHEN_PRESENT["reward.custom"]["key"] == "score.py", where
    committed = load(REPO / DISTRIBUTIONS[0] / MODULE)
    assert committed.SPEC_DEFAULTS["rollout"]["toolCall"]["maxRetries"] == 3  # the repository's untouched


def test_the_committed_modules_are_current() -> None:
    stale = [p for p in stale_outputs() if p in CRD_DEFAULTS_MODULES]
    assert stale == [], "run `make chart-generate` and commit the result"
    for path in CRD_DEFAULTS_MODULES:
        assert "GENERATED from crds/toolrl.dev_toolrljobs.yaml by `make chart-generate`" in path.read_text()


def test_the_module_is_the_schemas_defaulting() -> None:
    """SPEC_DEFAULTS is what the apiserver makes of a spec that gives only the required objects; the
    per-item defaults are what it adds to a bare tool, a bare custom reward and bare rollout workers."""
    schema = spec_schema(yaml.safe_load(CRD_SOURCE.read_text()))
    generated = load(CRD_DEFAULTS_MODULES[0])
    bare = {
        "model": {},
        "data": {},
        "tools": [{}],
        "reward": {"custom": {}},
        "cluster": {"rolloutWorkers": {}},
    }
    defaulted = apply_defaults(schema, bare)
    assert defaulted.pop("tools") == [generated.DEFAULTS_WHEN_PRESENT["tools[]"]]
    assert defaulted["reward"].pop("custom") == generated.DEFAULTS_WHEN_PRESENT["reward.custom"]
    rollout_workers = defaulted["cluster"].pop("rolloutWorkers")
    assert rollout_workers == generated.DEFAULTS_WHEN_PRESENT["cluster.rolloutWorkers"]
    defaulted.pop("model")  # required, nothing in it defaulted
    assert defaulted == generated.SPEC_DEFAULTS
    assert set(generated.DEFAULTS_WHEN_PRESENT) == {
        "tools[]",
        "tools[].function",
        "reward.custom",
        "cluster.rolloutWorkers",
    }
    item = schema["properties"]["tools"]["items"]  # a function tool's source reference
    function = apply_defaults(item, {"function": {"configMap": {}}})["function"]
    assert function == generated.DEFAULTS_WHEN_PRESENT["tools[].function"]


def test_check_refuses_another_crd_or_root(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chartgen", "--check", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "give no --crd or --out" in result.stderr


@pytest.mark.parametrize("bad", [object(), b"bytes"])
def test_a_default_without_a_python_literal_is_an_error(bad: object) -> None:
    from chartgen.crd_defaults import python_literal

    with pytest.raises(TypeError, match="has no Python literal"):
        python_literal({"x": bad})


def test_a_changed_crd_default_reaches_the_operators_typed_spec(tmp_path: Path) -> None:
    """The operator reads jobs through spec_types.py (generated from the CRD): a default changed in a
    copy of the CRD is the generated classes' default, and so what a job that omits it builds with."""
    from chartgen import spec_types
    from chartgen.outputs import SPEC_TYPES_MODULES, write_outputs

    crd = yaml.safe_load(CRD_SOURCE.read_text())
    spec = spec_schema(crd)
    pool = spec["properties"]["toolPool"]["properties"]
    tool = spec["properties"]["tools"]["items"]["properties"]
    assert (pool["capacityPerReplica"]["default"], tool["diskLimitMiB"]["default"]) == (32, 32)
    pool["capacityPerReplica"]["default"] = 48
    tool["diskLimitMiB"]["default"] = 40
    changed = tmp_path / "changed-crd.yaml"
    changed.write_text(yaml.safe_dump(crd, sort_keys=False))
    out = tmp_path / "repo"

    written = write_outputs(out, changed)

    (module,) = [out / d / spec_types.MODULE for d in spec_types.DISTRIBUTIONS]
    assert module in written and len(SPEC_TYPES_MODULES) == 1
    job = {"model": {"path": "m"}, "data": {"trainFiles": ["t"]}, "tools": [{"name": "p", "type": "python"}]}
    generated = load(module).Spec.model_validate(job)
    assert (generated.tool_pool.capacity_per_replica, generated.tools[0].disk_limit_mib) == (48, 40)
    committed = load(SPEC_TYPES_MODULES[0]).Spec.model_validate(job)
    assert committed.tool_pool.capacity_per_replica == 32  # the repository's untouched
    # and what the operator builds follows: the pool's /tmp holds every slot's disk budget
    from toolrl_operator.toolpool import TMP_HEADROOM_MIB, tmp_size_mib

    sessions = generated.tool_pool.max_sessions_per_replica
    assert tmp_size_mib(generated) == 40 * (48 + sessions) + TMP_HEADROOM_MIB
