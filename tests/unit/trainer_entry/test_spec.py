"""Spec checks: values verl would accept and fail on later are rejected, naming the field to fix."""

import json

import pytest
from trainer_entry.spec import DEFAULTS, SpecError, load_job, parse_job


def doc(**spec):
    base = {
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "data": {"trainFiles": ["/data/train.parquet"]},
        "tools": [{"name": "python", "type": "python"}],
    }
    base.update(spec)
    return {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": "j", "namespace": "rl", "uid": "u"},
        "spec": base,
    }


def test_defaults_fill_what_the_spec_leaves_out():
    job = parse_job(doc())
    assert (job.name, job.namespace, job.uid) == ("j", "rl", "u")
    assert job.spec["rollout"]["toolCall"] == DEFAULTS["rollout"]["toolCall"]
    assert job.spec["algorithm"]["rolloutsPerPrompt"] == 8


def test_given_values_win_over_defaults_deeply():
    job = parse_job(doc(rollout={"toolCall": {"maxRetries": 0}}))
    assert job.spec["rollout"]["toolCall"]["maxRetries"] == 0
    assert job.spec["rollout"]["toolCall"]["timeoutSeconds"] == 30


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"rollout": {"engine": "trtllm"}}, "spec.rollout.engine"),
        ({"rollout": {"protocol": "xml"}}, "spec.rollout.protocol"),
        ({"algorithm": {"advantageEstimator": "ppo"}}, "spec.algorithm.advantageEstimator"),
        ({"algorithm": {"rolloutsPerPrompt": 1}}, "spec.algorithm.rolloutsPerPrompt"),
        ({"algorithm": {"trainBatchSize": 0}}, "spec.algorithm.trainBatchSize"),
        ({"algorithm": {"trainBatchSize": 8, "ppoMiniBatchSize": 16}}, "spec.algorithm.ppoMiniBatchSize"),
        ({"data": {"trainFiles": ["/data/train.jsonl"]}}, "spec.data.trainFiles[0]"),
        ({"data": {"trainFiles": []}}, "spec.data.trainFiles"),
        ({"model": {}}, "spec.model.path"),
        ({"tools": [{"name": "my tool", "type": "python"}]}, "spec.tools[0].name"),
        ({"tools": [{"name": "python", "type": "shell"}]}, "spec.tools[0].type"),
        ({"tools": [{"name": "a", "type": "python"}, {"name": "a", "type": "search"}]}, "spec.tools[1].name"),
        ({"reward": {"preset": "bleu"}}, "spec.reward.preset"),
        ({"reward": {"preset": "custom"}}, "spec.reward.custom.configMap"),
        (
            {"reward": {"preset": "toolbench", "toolbench": {"finishBonus": "big"}}},
            "spec.reward.toolbench.finishBonus",
        ),
        ({"rollout": {"gpuMemoryUtilization": 1.5}}, "spec.rollout.gpuMemoryUtilization"),
        (
            {"rollout": {"tensorParallelSize": 3}, "cluster": {"workers": {"gpusPerWorker": 8}}},
            "spec.rollout.tensorParallelSize",
        ),
        ({"checkpoint": {"resume": "latest"}}, "spec.checkpoint.resume"),
        ({"trainer": {"extraArgs": ["--verbose"]}}, "spec.trainer.extraArgs"),
    ],
)
def test_bad_values_name_the_field(spec, field):
    with pytest.raises(SpecError) as err:
        parse_job(doc(**spec))
    assert str(err.value).startswith(field + ":")


def test_code_protocols_need_a_python_tool():
    with pytest.raises(SpecError, match=r"spec.tools: protocol python-tags runs code"):
        parse_job(
            doc(
                rollout={"protocol": "python-tags"},
                tools=[{"name": "s", "type": "search"}],
                reward={"preset": "exact-match"},
            )
        )


def test_load_job_reports_missing_and_broken_files(tmp_path):
    with pytest.raises(SpecError, match="job spec not found"):
        load_job(tmp_path / "missing.json")
    bad = tmp_path / "job.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_job(bad)
    bad.write_text(json.dumps({"metadata": {"name": "x"}}))
    with pytest.raises(SpecError, match="expected an object with 'spec'"):
        load_job(bad)
