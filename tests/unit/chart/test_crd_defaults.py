"""The CRD's defaults in each distribution: the API's generated defaults module (the tool pool's) and the
defaults the trainer derives from the API's generated schema both follow a changed CRD, and the
committed copies are the CRD's (`make chart-check`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import tool_sandbox.config
import trainer_entry.spec
import yaml
from chartgen import crd_schema
from chartgen.crd_defaults import DISTRIBUTIONS, MODULE, spec_schema
from chartgen.outputs import CRD_DEFAULTS_MODULES, CRD_SOURCE, stale_outputs
from toolrl_api.defaulting import apply_defaults


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"generated_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_against(module: ModuleType, generated: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch):
    """A fresh copy of a distribution's `module` whose imports of the API's generated modules (full name
    -> module) get the ones given: what the distribution is after regenerating."""
    package = module.__name__.rpartition(".")[0]
    for name, replacement in generated.items():
        monkeypatch.setitem(sys.modules, name, replacement)
    name = f"{package}.changed_{module.__name__.rpartition('.')[2]}"
    spec = importlib.util.spec_from_file_location(name, module.__file__)
    assert spec is not None and spec.loader is not None, module
    changed = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, changed)  # dataclasses look their module up
    spec.loader.exec_module(changed)
    return changed


def test_a_changed_crd_default_reaches_every_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crd = yaml.safe_load(CRD_SOURCE.read_text())
    spec = spec_schema(crd)
    tool_call = spec["properties"]["rollout"]["properties"]["toolCall"]["properties"]
    tool = spec["properties"]["tools"]["items"]["properties"]
    custom = spec["properties"]["reward"]["properties"]["custom"]["properties"]
    pool = spec["properties"]["toolPool"]["properties"]
    assert (tool_call["maxRetries"]["default"], tool["timeoutSeconds"]["default"]) == (3, 10)
    tool_call["maxRetries"]["default"] = 7
    tool["timeoutSeconds"]["default"] = 11
    custom["key"]["default"] = "score.py"
    pool["capacityPerReplica"]["default"] += 1
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

    # the tool pool: its generated module, and the config that reads it
    (pool_defaults,) = (load(out / d / MODULE) for d in DISTRIBUTIONS)
    assert pool_defaults.DEFAULTS_WHEN_PRESENT["tools[]"]["timeoutSeconds"] == 11
    config = load_against(tool_sandbox.config, {"toolrl_api.crd_defaults": pool_defaults}, monkeypatch)
    assert config.ToolConfig(name="python", type="python").timeout_seconds == 11
    assert config.ServerSettings().capacity == pool["capacityPerReplica"]["default"]
    # the trainer: the defaults its spec module derives from the generated schema
    (schema,) = (load(out / d / crd_schema.MODULE) for d in crd_schema.DISTRIBUTIONS)
    changed_spec = load_against(trainer_entry.spec, {"toolrl_api.crd_schema": schema}, monkeypatch)
    assert changed_spec.DEFAULTS["rollout"]["toolCall"]["maxRetries"] == 7
    assert changed_spec.TOOL_DEFAULTS["timeoutSeconds"] == 11
    assert changed_spec.CUSTOM_REWARD_DEFAULTS["key"] == "score.py"
    bare = {"tools": [{"name": "python", "type": "python"}], "reward": {"custom": {"configMap": "r"}}}
    defaulted = changed_spec.with_defaults(bare)
    assert defaulted["tools"][0]["timeoutSeconds"] == 11
    assert defaulted["reward"]["custom"]["key"] == "score.py"
    # the repository's own are untouched
    assert trainer_entry.spec.DEFAULTS["rollout"]["toolCall"]["maxRetries"] == 3
    assert tool_sandbox.config.ToolConfig(name="python", type="python").timeout_seconds == 10


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
    assert generated.SPEC_DEFAULTS == trainer_entry.spec.DEFAULTS  # the trainer derives the same
    assert generated.DEFAULTS_WHEN_PRESENT == trainer_entry.spec.DEFAULTS_WHEN_PRESENT
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
