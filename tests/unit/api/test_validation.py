"""The API checks a hand-written spec against the CRD's own schema and CEL rules (toolrl_api.validation,
from the generated toolrl_api.crd_schema): every rule runs, errors carry the CRD's messages, and a changed CRD
reaches the trainer by regeneration."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartgen.outputs import CRD_SOURCE
from toolrl_api.crd_schema import SPEC_SCHEMA
from toolrl_api.defaulting import apply_defaults
from toolrl_api.validation import (
    RULES_NOT_CHECKED,
    CrdValidator,
    Quantity,
    Rule,
    _places,
    crd_validator,
    escape,
    is_url,
    rules,
    to_cel,
)
from trainer_entry.spec import SpecError, parse_job

PVC = {"persistentVolumeClaim": {"claimName": "data"}}
PARAMETERS = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
EVERY_TOOL = [
    {"name": "python", "type": "python", "observationFormat": "sandbox-fusion"},
    {"name": "search", "type": "search", "corpus": "/data/corpus.jsonl"},
    {"name": "web", "type": "http", "url": "https://example.org/api"},
    {
        "name": "lookup",
        "type": "function",
        "function": {"configMap": {"name": "my-tools"}, "name": "lookup"},
        "parameters": PARAMETERS,
    },
    {"name": "remote", "type": "mcp", "mcp": {"url": "http://mcp.tools.svc:8000/mcp", "tools": ["search"]}},
]


def full_spec(**changes: Any) -> dict[str, Any]:
    """A valid spec (CPU, separate-async) in which every place that has a rule holds a value, defaulted
    as the apiserver would."""
    spec: dict[str, Any] = {
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "cache": {"volume": PVC}},
        "data": {
            "trainFiles": ["/data/train.parquet"],
            "valFiles": ["/data/val.parquet"],
            "valFreq": 5,
            "volume": PVC,
        },
        "algorithm": {"totalEpochs": 1},
        "tools": copy.deepcopy(EVERY_TOOL),
        "reward": {"preset": "code-execution", "custom": {"configMap": "reward"}},
        "checkpoint": {"volume": PVC, "saveFreq": 10, "resume": "/checkpoints/global_step_10"},
        "trainer": {"mode": "separate-async", "extraArgs": ["trainer.val_before_train=false"]},
        "cluster": {
            "workers": {"gpusPerWorker": 0, "resources": {"limits": {"cpu": "4"}}},
            "rolloutWorkers": {"gpusPerWorker": 0},
            "env": [{"name": "HF_TOKEN", "value": "x"}],
            "podLabels": {"team": "rl"},
        },
    }
    spec.update(copy.deepcopy(changes))
    return apply_defaults(SPEC_SCHEMA, spec)


def gpu_spec(cpu: str) -> dict[str, Any]:
    """A valid colocate-async spec on 8 GPUs whose workers have `cpu` CPUs (the rule wants > 25)."""
    workers = {"gpusPerWorker": 8, "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": cpu}}}
    return full_spec(
        model={"path": "Qwen/Qwen2.5-7B-Instruct", "cache": {"size": "20Gi"}},
        trainer={"mode": "colocate-async"},
        cluster={"workers": workers, "env": [{"name": "HF_TOKEN", "value": "x"}], "podLabels": {"a": "b"}},
    )


def crd_rules(schema: dict[str, Any]) -> list[dict[str, Any]]:
    out = list(schema.get("x-kubernetes-validations", []))
    for key in ("properties",):
        for sub in schema.get(key, {}).values():
            out += crd_rules(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += crd_rules(schema[key])
    return out


def the_rule(text: str, message: str = "") -> Rule:
    """The rule whose text holds `text` (a YAML anchor may repeat one
    at several places); `message`, what its message starts with, where two rules read alike."""
    matching = [r for r in rules() if text in r.rule and r.message.startswith(message)]
    (rule,) = {(r.rule, r.message, r.field_path): r for r in matching}.values()
    return rule


# ---- (a) every rule of the CRD compiles and runs ---------------------------------------------------------


def test_every_crd_rule_is_compiled_but_the_transition_ones() -> None:
    crd = yaml.safe_load(CRD_SOURCE.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    root = version["schema"]["openAPIV3Schema"]
    everything = crd_rules(root)
    about_metadata = root["x-kubernetes-validations"]  # the apiserver's business: the trainer reads spec
    assert len(about_metadata) == 2 and all("self.metadata.name" in r["rule"] for r in about_metadata)
    in_spec = rules()
    assert len(everything) == len(about_metadata) + len(in_spec)
    transition = [r for r in in_spec if r.transition]
    assert {r.place for r in transition} == {"spec", "spec.model"} and len(transition) == 3
    compiled = crd_validator().rules
    assert [c.rule for c in compiled] == [r for r in in_spec if not r.transition]
    assert len(compiled) == len(in_spec) - len(transition) >= 40


def test_every_compiled_rule_evaluates_to_true_on_valid_specs_with_every_place_present() -> None:
    """No rule is skipped for want of a value, and none fails to evaluate (a missing function, an
    escaping mistake or a type cel-python does not take would be an error here)."""
    validator = crd_validator()
    evaluated: set[str] = set()
    for spec in (full_spec(), gpu_spec("26")):
        assert validator.errors(spec) == []
        for compiled in validator.rules:
            for _path, value in _places(validator.schema, spec, compiled.rule.where, "spec"):
                result = compiled.program.evaluate({"self": to_cel(compiled.schema, value)})
                assert result is True or (type(result).__name__ == "BoolType" and bool(result)), compiled.rule
                evaluated.add(compiled.rule.rule)
    assert evaluated == {c.rule.rule for c in validator.rules}


# ---- (b) invalid specs are refused with the CRD's messages -----------------------------------------------


@pytest.mark.parametrize(
    ("changes", "rule", "place"),
    [
        (
            {"algorithm": {"totalEpochs": 1, "totalTrainingSteps": 5}},
            "has(self.algorithm.totalEpochs) != has(self.algorithm.totalTrainingSteps)",
            "spec",
        ),
        (
            {"cluster": {"workers": {"gpusPerWorker": 0}}},  # separate-async without rolloutWorkers
            "(self.trainer.mode == 'separate-async') == has(self.cluster.rolloutWorkers)",
            "spec",
        ),
        (
            {"tools": [EVERY_TOOL[0], {**EVERY_TOOL[1], "name": "python"}]},
            "self.all(t, self.filter(u, u.name == t.name).size() == 1)",
            "spec.tools",
        ),
        (
            {"tools": [EVERY_TOOL[0], {k: v for k, v in EVERY_TOOL[3].items() if k != "parameters"}]},
            "self.type != 'function' || has(self.parameters)",
            "spec.tools[1]",
        ),
        (
            {"tools": [EVERY_TOOL[0], {"name": "fn", "type": "function", "parameters": PARAMETERS}]},
            "self.type != 'function' || has(self.__function__)",
            "spec.tools[1]",
        ),
        (
            {
                "cluster": {
                    "workers": {"gpusPerWorker": 0},
                    "rolloutWorkers": {"gpusPerWorker": 0},
                    "env": [{"name": "TOOLRL_x", "value": "1"}],
                }
            },
            "!self.name.startsWith('TOOLRL_')",
            "spec.cluster.env[0]",
        ),
        (
            {"tools": [EVERY_TOOL[0], {**EVERY_TOOL[1], "observationFormat": "default"}]},
            "!has(self.observationFormat) || self.type == 'python'",
            "spec.tools[1]",
        ),
        (
            {"tools": [EVERY_TOOL[0], {"name": "web", "type": "http", "url": "ftp://example.org/x"}]},
            ("isURL(self)", "url must be"),
            "spec.tools[1].url",
        ),
        (
            {
                "cluster": {
                    "workers": {"gpusPerWorker": 0},
                    "rolloutWorkers": {"gpusPerWorker": 0},
                    "podLabels": {"toolrl.dev/job": "x"},
                }
            },
            "!self.exists(k, k in ['app.kubernetes.io/managed-by'",
            "spec.cluster.podLabels",
        ),
        (
            {"data": {"trainFiles": ["/data/t.parquet"], "volume": {"hostPath": {"path": "/"}}}},
            "!has(self.hostPath)",
            "spec.data.volume",
        ),
        (
            {"model": {"path": "m", "cache": {"volume": {"hostPath": {"path": "/"}}}}},
            "!has(self.hostPath)",
            "spec.model.cache.volume",
        ),
        (
            {"model": {"path": "m", "cache": {"volume": PVC, "size": "20Gi"}}},
            "has(self.volume) != has(self.size)",
            "spec.model.cache",
        ),
        ({"model": {"path": "m", "cache": {}}}, "has(self.volume) != has(self.size)", "spec.model.cache"),
        (
            {"model": {"path": "m", "cache": {"size": "512Ki"}}},
            "asApproximateFloat() >= 1048576.0",
            "spec.model.cache",
        ),
        (
            {"reward": {"preset": "math", "overlongPenalty": {"enabled": True}}},
            "!self.reward.overlongPenalty.enabled || has(self.reward.overlongPenalty.bufferLength)",
            "spec",
        ),
        (
            {"reward": {"preset": "math", "overlongPenalty": {"enabled": True, "bufferLength": 2048}}},
            (
                "self.reward.overlongPenalty.bufferLength < self.data.maxResponseLength",
                "reward.overlongPenalty.bufferLength must",
            ),
            "spec",
        ),
    ],
)
def test_an_invalid_spec_is_refused_with_the_crds_message(changes, rule, place) -> None:
    """One fault, one error: the field (the rule's place and its fieldPath) and the CRD's message."""
    found = the_rule(*rule) if isinstance(rule, tuple) else the_rule(rule)
    expected = f"{place}{found.field_path}: {found.message}"
    assert crd_validator().errors(full_spec(**changes)) == [expected]
    with pytest.raises(SpecError) as refused:
        parse_job({"metadata": {"name": "j"}, "spec": full_spec(**changes)})
    assert str(refused.value) == expected


def test_dapos_knobs_are_bounded_by_the_crd() -> None:
    """clipRatio.low in (0, 1), high above 0, lossAggregation one of verl's modes, the penalty's factor above
    0; the overlong penalty's buffer fits in the response (issue 38)."""
    validator = crd_validator()
    dapo = {"totalEpochs": 1, "clipRatio": {"low": 0.2, "high": 0.28}, "lossAggregation": "token-mean"}
    overlong = {"enabled": True, "bufferLength": 2047, "penaltyFactor": 1.0}
    math = {"preset": "math", "overlongPenalty": overlong}
    assert validator.errors(full_spec(algorithm=dapo, reward=math)) == []
    disabled = {"preset": "math", "overlongPenalty": {"bufferLength": 4096}}  # no penalty: no bound
    assert validator.errors(full_spec(reward=disabled)) == []
    bad = {"totalEpochs": 1, "clipRatio": {"low": 1.0, "high": 0}, "lossAggregation": "seq-sum"}
    no_penalty = {"enabled": True, "bufferLength": 8, "penaltyFactor": 0}
    math["overlongPenalty"] = no_penalty
    errors = validator.errors(full_spec(algorithm=bad, reward=math))
    assert "spec.algorithm.clipRatio.low: must be < 1, got 1.0" in errors
    assert "spec.algorithm.clipRatio.high: must be > 0, got 0" in errors
    modes = "token-mean, seq-mean-token-sum, seq-mean-token-mean"
    assert f"spec.algorithm.lossAggregation: unknown value 'seq-sum'; use one of {modes}" in errors
    assert "spec.reward.overlongPenalty.penaltyFactor: must be > 0, got 0" in errors


def test_a_gpu_worker_needs_three_cpus_per_gpu_plus_two_by_its_quantity() -> None:
    """Issue 32: 3 CPUs per GPU (the old rule) hangs: a storage unit and the vLLM servers need 2 more."""
    validator = crd_validator()
    assert validator.errors(gpu_spec("26")) == []
    assert validator.errors(gpu_spec("26000m")) == []
    assert validator.errors(gpu_spec("25500m")) == []  # Ray rounds a CPU limit up: 26
    for short in ("25", "24"):
        (error,) = validator.errors(gpu_spec(short))
        assert error.startswith(
            "spec.cluster.workers.resources: cluster.workers.resources: a GPU worker needs 3 CPUs per GPU + 2"
        )
        assert "3 x gpusPerWorker + 2 or more (26 for 8 GPUs)" in error
    assert Quantity("1.5Gi").value == 1.5 * 1024**3 and Quantity("2e3").value == 2000


def test_structural_errors_name_the_field_and_hold_back_the_rules() -> None:
    validator = crd_validator()
    spec = full_spec()
    spec["rollout"]["protocol"] = "xml"
    spec["rollout"]["gpuMemoryUtilization"] = 1.5
    spec["algorithm"]["learningRate"] = 0
    spec["trainer"]["loggers"] = ["console", "console"]
    del spec["model"]["path"]
    errors = validator.errors(spec)
    required = "spec.model.path: is required: Hugging Face hub id, or a path inside a mounted volume"
    assert any(e.startswith(required) for e in errors), errors
    protocols = "hermes, tool-tags, python-tags, react"
    assert f"spec.rollout.protocol: unknown value 'xml'; use one of {protocols}" in errors
    assert "spec.rollout.gpuMemoryUtilization: must be <= 0.95, got 1.5" in errors
    assert "spec.algorithm.learningRate: must be > 0, got 0" in errors
    assert "spec.trainer.loggers: has 'console' twice" in errors
    assert errors[-1] == RULES_NOT_CHECKED
    spec = full_spec()
    spec["algorithm"]["trainBatchSize"] = 0  # a bound: the rules still run, as in the apiserver
    spec["algorithm"]["ppoMiniBatchSize"] = 3
    errors = validator.errors(spec)
    assert errors[0] == "spec.algorithm.trainBatchSize: must be >= 1, got 0"
    assert RULES_NOT_CHECKED not in errors


def test_a_ray_groups_runtime_class_is_a_resource_name() -> None:
    spec = full_spec()
    spec["cluster"]["head"] = {**spec["cluster"].get("head", {}), "runtimeClassName": "nvidia"}
    spec["cluster"]["workers"] = {**spec["cluster"].get("workers", {}), "runtimeClassName": "Bad_Name"}
    pattern = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    assert crd_validator().errors(spec) == [
        f"spec.cluster.workers.runtimeClassName: 'Bad_Name' does not match the pattern {pattern}"
    ]


def test_property_names_are_escaped_as_kubernetes_does() -> None:
    assert [escape(n) for n in ("function", "in", "a.b", "x-y", "p/q", "a__b", "plain")] == [
        "__function__",
        "__in__",
        "a__dot__b",
        "x__dash__y",
        "p__slash__q",
        "a__underscores__b",
        "plain",
    ]
    assert bool(is_url("https://example.org:8080/x")) and bool(is_url("/abs/path"))
    assert not any(map(bool, map(is_url, ("", "example.org", "http://x:port/", "http://a b/"))))


# ---- (c) a changed CRD reaches the trainer by regeneration -----------------------------------------------


def test_a_changed_crd_rule_reaches_the_trainers_validator(tmp_path: Path) -> None:
    crd = yaml.safe_load(CRD_SOURCE.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    (epochs,) = [r for r in spec_schema["x-kubernetes-validations"] if "totalEpochs" in r["rule"]]
    epochs["message"] = "pick one: totalEpochs or totalTrainingSteps"
    spec_schema["properties"]["algorithm"]["properties"]["rolloutsPerPrompt"]["maximum"] = 16
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
    path = out / "api" / "toolrl_api" / "crd_schema.py"
    module_spec = importlib.util.spec_from_file_location("changed_crd_schema", path)
    assert module_spec is not None and module_spec.loader is not None
    generated = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(generated)

    validator = CrdValidator(generated.SPEC_SCHEMA)
    both = full_spec(algorithm={"totalEpochs": 1, "totalTrainingSteps": 5, "rolloutsPerPrompt": 32})
    assert validator.errors(both) == [
        "spec.algorithm.rolloutsPerPrompt: must be <= 16, got 32",
        "spec.algorithm: pick one: totalEpochs or totalTrainingSteps",
    ]
    assert crd_validator().errors(both) == [  # the committed copy is the repository's CRD, untouched
        f"spec.algorithm: {the_rule('has(self.algorithm.totalEpochs)').message}"
    ]


def test_the_committed_schema_is_the_crds() -> None:
    from chartgen.outputs import CRD_SCHEMA_MODULES, stale_outputs

    assert [p for p in stale_outputs() if p in CRD_SCHEMA_MODULES] == [], "run `make chart-generate`"


def test_a_message_expression_words_the_error_and_a_transition_rule_is_skipped() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {
                "type": "integer",
                "x-kubernetes-validations": [
                    {"rule": "self < 3", "message": "too big", "messageExpression": "'n is ' + string(self)"},
                    {"rule": "self == oldSelf", "message": "immutable"},
                ],
            }
        },
    }
    validator = CrdValidator(schema)
    assert [c.rule.rule for c in validator.rules] == ["self < 3"]
    assert validator.errors({"n": 5}) == ["spec.n: n is 5"]
    assert validator.errors({"n": 2}) == []
