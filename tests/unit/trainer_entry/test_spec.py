"""Spec checks: values verl would accept and fail on later are rejected, naming the field to fix.

The CRD's bounds and rules are applied from the CRD (tests/unit/api/test_validation.py): a SpecError
lists every broken one, a line each, with the CRD's message; patterns here match a line (re.M)."""

import json
import re
from pathlib import Path

import pytest
import yaml
from toolrl_api.defaulting import apply_defaults
from trainer_entry.rewards.toolbench import DEFAULT_WEIGHTS
from trainer_entry.spec import (
    CUSTOM_REWARD_DEFAULTS,
    DEFAULTS,
    DEFAULTS_WHEN_PRESENT,
    ENGINES,
    ROLLOUT_WORKERS_DEFAULTS,
    TOOL_DEFAULTS,
    SpecError,
    cpu_only,
    load_job,
    parse_job,
    with_defaults,
)

CRD = Path(__file__).resolve().parents[3] / "crds" / "toolrl.dev_toolrljobs.yaml"


def doc(**spec):
    base = {
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "data": {"trainFiles": ["/data/train.parquet"]},
        "algorithm": {"totalEpochs": 1},
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
        ({"algorithm": {"advantageEstimator": "ppo", "totalEpochs": 1}}, "spec.algorithm.advantageEstimator"),
        ({"algorithm": {"rolloutsPerPrompt": 1, "totalEpochs": 1}}, "spec.algorithm.rolloutsPerPrompt"),
        ({"algorithm": {"trainBatchSize": 0, "totalEpochs": 1}}, "spec.algorithm.trainBatchSize"),
        (
            {"algorithm": {"trainBatchSize": 8, "ppoMiniBatchSize": 16, "totalEpochs": 1}},
            "spec.algorithm.ppoMiniBatchSize",
        ),
        ({"data": {"trainFiles": ["/data/train.jsonl"]}}, "spec.data.trainFiles[0]"),
        ({"data": {"trainFiles": []}}, "spec.data.trainFiles"),
        ({"model": {}}, "spec.model.path"),
        ({"tools": [{"name": "my tool", "type": "python"}]}, "spec.tools[0].name"),
        ({"tools": [{"name": "python", "type": "shell"}]}, "spec.tools[0].type"),
        (
            {"tools": [{"name": "a", "type": "python"}, {"name": "a", "type": "search", "corpus": "/d/c"}]},
            "spec.tools",
        ),
        ({"reward": {"preset": "bleu"}}, "spec.reward.preset"),
        ({"reward": {"preset": "custom"}}, "spec.reward"),
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
        (
            {"cluster": {"workers": {"gpusPerWorker": -1}}, "rollout": {"engine": "hf"}},
            "spec.cluster.workers.gpusPerWorker",
        ),
        (
            {
                "cluster": {"workers": {"gpusPerWorker": 0}},
                "rollout": {"engine": "hf", "tensorParallelSize": 2},
            },
            "spec.rollout.tensorParallelSize",
        ),
        ({"trainer": {"extraArgs": ["--verbose"]}}, "spec.trainer.extraArgs[0]"),
        ({"trainer": {"loggers": ["neptune"]}}, "spec.trainer.loggers[0]"),
    ],
)
def test_bad_values_name_the_field(spec, field):
    with pytest.raises(SpecError) as err:
        parse_job(doc(**spec))
    assert str(err.value).startswith(field + ":")


def test_code_protocols_need_a_python_tool():
    with pytest.raises(SpecError, match=r"spec.tools: rollout.protocol tool-tags and python-tags run code"):
        parse_job(
            doc(
                rollout={"protocol": "python-tags"},
                tools=[{"name": "s", "type": "search", "corpus": "/data/c"}],
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


def crd_spec_schema() -> dict:
    doc = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in doc["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_the_trainer_defaults_a_spec_as_the_apiserver_does():
    """The trainer's merge of the defaults it derives from the generated schema gives what the CRD's
    structural defaulting gives (tests/unit/chart/test_crd_defaults.py: they follow a changed CRD)."""
    assert TOOL_DEFAULTS is DEFAULTS_WHEN_PRESENT["tools[]"]
    assert CUSTOM_REWARD_DEFAULTS is DEFAULTS_WHEN_PRESENT["reward.custom"]
    assert ROLLOUT_WORKERS_DEFAULTS is DEFAULTS_WHEN_PRESENT["cluster.rolloutWorkers"]
    assert DEFAULT_WEIGHTS is DEFAULTS["reward"]["toolbench"]  # the toolbench preset uses the same table
    given = doc(
        tools=[{"name": "python", "type": "python"}, {"name": "s", "type": "search", "corpus": "/data/c"}],
        reward={"preset": "custom", "custom": {"configMap": "r"}},
        checkpoint={"saveFreq": -1},  # the one default the trainer adds (saveFreq, by volume)
        trainer={"mode": "separate-async"},
        cluster={"workers": {"gpusPerWorker": 0}, "rolloutWorkers": {"gpusPerWorker": 0}},
    )["spec"]
    assert with_defaults(given) == apply_defaults(crd_spec_schema(), json.loads(json.dumps(given)))


def test_gpus_per_worker_defaults_to_the_crds_8():
    assert parse_job(doc()).spec["cluster"]["workers"]["gpusPerWorker"] == 8


def test_tool_and_custom_reward_defaults_apply_per_entry():
    job = parse_job(
        doc(
            tools=[
                {"name": "python", "type": "python"},
                {"name": "s", "type": "search", "corpus": "/data/c", "timeoutSeconds": 2},
            ],
            reward={"preset": "custom", "custom": {"configMap": "r"}},
        )
    )
    assert [t["timeoutSeconds"] for t in job.spec["tools"]] == [10, 2]
    assert job.spec["reward"]["custom"] == {"configMap": "r", "key": "reward.py", "function": "compute_score"}


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        (
            {},
            "spec.algorithm: set exactly one of spec.algorithm.totalEpochs or spec.algorithm.totalTr",
        ),
        ({"totalEpochs": 1, "totalTrainingSteps": 5}, "spec.algorithm: set exactly one"),
    ],
)
def test_fields_without_a_crd_default_must_be_given(algorithm, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_job(doc(algorithm=algorithm))


def test_missing_tools_names_the_field():
    d = doc()
    del d["spec"]["tools"]
    with pytest.raises(SpecError, match=r"spec\.tools: is required"):
        parse_job(d)


def test_a_field_the_crd_lacks_stops_the_load_naming_it():
    """The apiserver would drop it without a word; a hand-written job.json is told (the typed spec)."""
    with pytest.raises(SpecError, match=r"spec\.rollout\.temprature: Extra inputs are not permitted"):
        parse_job(doc(rollout={"temprature": 0.7}))


def test_every_engine_runs_on_cpus():
    for engine in ENGINES:
        cpu = parse_job(doc(cluster={"workers": {"gpusPerWorker": 0}}, rollout={"engine": engine}))
        assert cpu_only(cpu.spec)
    assert not cpu_only(parse_job(doc(rollout={"engine": "hf"})).spec), "hf on GPUs is not a CPU job"


# ---- issue 23: what cannot run is not accepted ---------------------------------------------------


def test_sglang_is_refused_with_what_to_use():
    with pytest.raises(
        SpecError,
        match=r"^spec\.rollout\.engine: rollout\.engine must be vllm or hf; sglang is not supported yet .*: "
        r"use vllm$",
    ):
        parse_job(doc(rollout={"engine": "sglang"}))


def test_the_crd_admits_the_trainers_engines_only():
    (rule,) = crd_spec_schema()["properties"]["rollout"]["properties"]["engine"]["x-kubernetes-validations"]
    assert rule["rule"] == "self in [" + ", ".join(f"'{e}'" for e in ENGINES) + "]"
    assert "sglang is not supported yet" in rule["message"] and "use vllm" in rule["message"]


def test_checkpoints_are_saved_only_with_a_checkpoint_volume():
    claim = {"persistentVolumeClaim": {"claimName": "ckpt"}}
    assert parse_job(doc()).spec["checkpoint"]["saveFreq"] == -1
    assert parse_job(doc(checkpoint={"volume": claim})).spec["checkpoint"]["saveFreq"] == 20
    assert parse_job(doc(checkpoint={"volume": claim, "saveFreq": 5})).spec["checkpoint"]["saveFreq"] == 5
    with pytest.raises(
        SpecError,
        match=r"^spec\.checkpoint\.saveFreq: checkpoint\.saveFreq needs checkpoint\.volume: .*set saveFreq",
    ):
        parse_job(doc(checkpoint={"saveFreq": 5}))
    assert "default" not in crd_spec_schema()["properties"]["checkpoint"]["properties"]["saveFreq"]


# ---- issue 20: the trainer's modes -------------------------------------------------------------------


def test_the_trainer_mode_defaults_to_sync_with_verls_async_defaults():
    trainer = parse_job(doc()).spec["trainer"]
    assert trainer["mode"] == "sync"
    # verl 0.9.1's own defaults (trainer.v1.colocate_async.num_warmup_batches, trainer.v1.sampler.*)
    # (parameterSyncStep 1: verl's default is 4, which would need ppoMiniBatchSize = trainBatchSize / 4)
    assert trainer["async"] == {
        "warmupBatches": 1,
        "maxPolicyVersions": 8,
        "onStale": "drop",
        "parameterSyncStep": 1,
    }


SEPARATE = {"mode": "separate-async", "async": {"maxPolicyVersions": 2}}
CPU_ROLLOUT = {"replicas": 1, "gpusPerWorker": 0}


def test_separate_async_runs_with_its_rollout_worker_group():
    job = parse_job(
        doc(trainer=SEPARATE, cluster={"workers": {"gpusPerWorker": 0}, "rolloutWorkers": CPU_ROLLOUT})
    )
    assert job.spec["trainer"]["mode"] == "separate-async"
    assert job.spec["cluster"]["rolloutWorkers"] == CPU_ROLLOUT
    given = {"gpusPerWorker": 0}  # replicas: the CRD's default
    job = parse_job(doc(trainer=SEPARATE, cluster={"workers": {"gpusPerWorker": 0}, "rolloutWorkers": given}))
    assert job.spec["cluster"]["rolloutWorkers"] == CPU_ROLLOUT


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"trainer": SEPARATE},
            r"^spec\.cluster\.rolloutWorkers: cluster\.rolloutWorkers \(the worker group that generates\) is "
            r"required with trainer\.mode separate-async and only there: add it",
        ),
        (
            {"cluster": {"rolloutWorkers": CPU_ROLLOUT, "workers": {"gpusPerWorker": 0}}},
            r"^spec\.cluster\.rolloutWorkers: .* required with trainer\.mode separate-async and only there: "
            r".*"
            r"or remove it for sync and colocate-async, which generate on cluster\.workers$",
        ),
        (
            {"trainer": SEPARATE, "cluster": {"rolloutWorkers": CPU_ROLLOUT}},
            r"^spec\.cluster\.rolloutWorkers\.gpusPerWorker: cluster\.rolloutWorkers\.gpusPerWorker and "
            r"cluster\.workers\.gpusPerWorker must both be 0 \(CPU\) or both above 0 \(GPUs\)$",
        ),
        (
            {"trainer": SEPARATE, "cluster": {"rolloutWorkers": {"replicas": 0, "gpusPerWorker": 8}}},
            r"^spec\.cluster\.rolloutWorkers\.replicas: must be >= 1, got 0$",
        ),
        (
            {
                "trainer": SEPARATE,
                "cluster": {"rolloutWorkers": {"replicas": 1, "gpusPerWorker": 3}},
                "rollout": {"tensorParallelSize": 2},
            },
            r"^spec\.cluster\.rolloutWorkers\.gpusPerWorker: rollout\.tensorParallelSize must divide "
            r"cluster\.rolloutWorkers\.gpusPerWorker; change one of them$",
        ),
        (
            {
                "trainer": {**SEPARATE, "async": {"maxPolicyVersions": 2, "parameterSyncStep": 2}},
                "cluster": {"rolloutWorkers": {"replicas": 1, "gpusPerWorker": 8}},
                "algorithm": {"trainBatchSize": 8, "ppoMiniBatchSize": 8, "totalEpochs": 1},
            },
            r"^spec\.trainer\.async\.parameterSyncStep: .*algorithm\.trainBatchSize must equal "
            r"parameterSyncStep x algorithm\.ppoMiniBatchSize \(verl's rule; .*\): change one of them$",
        ),
        (
            {
                "trainer": {"mode": "separate-async", "async": {"maxPolicyVersions": 1}},
                "cluster": {"rolloutWorkers": {"replicas": 1, "gpusPerWorker": 8}},
            },
            r"^spec\.trainer\.async\.maxPolicyVersions: an asynchronous trainer\.mode .* with "
            r"trainer\.async\.maxPolicyVersions 1 drops .*: set maxPolicyVersions to 2 or more",
        ),
    ],
)
def test_separate_async_settings_that_cannot_run_name_what_to_change(spec, message):
    with pytest.raises(SpecError, match=re.compile(message, re.M)):
        parse_job(doc(**spec))


def test_separate_async_on_gpus_is_refused_with_why_and_what_to_use():
    gpus = {"workers": {"gpusPerWorker": 8}, "rolloutWorkers": {"gpusPerWorker": 8}}
    with pytest.raises(
        SpecError, match=r"^spec\.trainer\.mode: separate-async runs on CPU workers only .*cupy"
    ):
        parse_job(doc(trainer=SEPARATE, cluster=gpus))
    (rule,) = [
        r for r in crd_spec_schema()["x-kubernetes-validations"] if r.get("fieldPath") == ".trainer.mode"
    ]
    assert "separate-async runs on CPU workers only" in rule["message"]


def test_separate_async_mini_batch_defaults_to_one_sync_interval():
    from trainer_entry.spec import mini_batch_size

    trainer = {**SEPARATE, "async": {"maxPolicyVersions": 2, "parameterSyncStep": 4}}
    job = parse_job(
        doc(
            trainer=trainer,
            algorithm={"trainBatchSize": 8, "totalEpochs": 1},
            cluster={"workers": {"gpusPerWorker": 0}, "rolloutWorkers": {"gpusPerWorker": 0}},
        )
    )
    assert mini_batch_size(job.spec) == 2
    assert mini_batch_size(parse_job(doc(algorithm={"trainBatchSize": 8, "totalEpochs": 1})).spec) == 8


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        (
            {"mode": "async"},
            r"spec\.trainer\.mode: unknown value 'async'; use one of sync, colocate-async, separate-async",
        ),
        (
            {"mode": "colocate-async", "async": {"maxPolicyVersions": 1}},
            r"spec\.trainer\.async\.maxPolicyVersions: .*maxPolicyVersions 1 drops every sample begun before "
            r"the last update .*: set maxPolicyVersions to 2 or more, or use trainer\.mode sync",
        ),
        (
            {"async": {"maxPolicyVersions": 0}},
            r"spec\.trainer\.async\.maxPolicyVersions: must be >= 1, got 0",
        ),
        ({"async": {"warmupBatches": -1}}, r"spec\.trainer\.async\.warmupBatches: must be >= 0, got -1"),
        (
            {"async": {"onStale": "keep"}},
            r"spec\.trainer\.async\.onStale: unknown value 'keep'; use one of drop, wait",
        ),
    ],
)
def test_async_settings_that_cannot_run_name_what_to_change(trainer, message):
    with pytest.raises(SpecError, match=message):
        parse_job(doc(trainer=trainer))


def test_the_trainer_modes_are_the_crds_enum_and_each_mode_the_code_names_is_in_it():
    from trainer_entry.spec import (
        COLOCATE_TRAINER_MODE,
        SEPARATE_TRAINER_MODE,
        SYNC_TRAINER_MODE,
        TRAINER_MODES,
    )

    from trainer_entry import verl_entry_points

    trainer = crd_spec_schema()["properties"]["trainer"]["properties"]
    assert tuple(trainer["mode"]["enum"]) == TRAINER_MODES  # the list lives in the CRD only
    assert "x-kubernetes-validations" not in trainer["mode"]  # no rule restating the enum
    assert trainer["mode"]["default"] == SYNC_TRAINER_MODE == DEFAULTS["trainer"]["mode"]
    assert {SYNC_TRAINER_MODE, COLOCATE_TRAINER_MODE, SEPARATE_TRAINER_MODE} == set(TRAINER_MODES)
    assert set(verl_entry_points.TRAINER_MODES) == set(TRAINER_MODES), "each mode has our trainer"
    assert trainer["async"]["properties"]["parameterSyncStep"]["default"] == 1
    rules = {r["fieldPath"]: r for r in crd_spec_schema()["x-kubernetes-validations"] if "fieldPath" in r}
    assert "verl's rule" in rules[".trainer.async.parameterSyncStep"]["message"]
    assert "required with trainer.mode separate-async" in rules[".cluster.rolloutWorkers"]["message"]
    assert tuple(trainer["async"]["properties"]["onStale"]["enum"]) == ("drop", "wait")
    cross = [r for r in crd_spec_schema()["x-kubernetes-validations"] if "maxPolicyVersions" in r["rule"]]
    assert cross and "set maxPolicyVersions to 2 or more, or use trainer.mode sync" in cross[0]["message"]


def test_a_function_tool_needs_an_object_schema_of_its_arguments():
    tool = {"name": "lookup", "type": "function", "function": {"configMap": {"name": "my-tools"}}}
    with pytest.raises(SpecError, match=r"spec.tools\[0\].parameters: a tool of type function needs param"):
        parse_job(doc(tools=[tool], rollout={"protocol": "hermes"}, reward={"preset": "exact-match"}))
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    job = parse_job(
        doc(
            tools=[{**tool, "parameters": schema}],
            rollout={"protocol": "hermes"},
            reward={"preset": "exact-match"},
        )
    )
    assert job.spec["tools"][0]["parameters"] == schema


def test_an_mcp_tool_needs_the_servers_url():
    tool = {"name": "remote", "type": "mcp", "mcp": {"url": "my-mcp:8000"}}
    with pytest.raises(
        SpecError, match=r"spec.tools\[0\].mcp.url: mcp.url must be an absolute http:// or https:// URL"
    ):
        parse_job(doc(tools=[tool], rollout={"protocol": "hermes"}, reward={"preset": "exact-match"}))
    tool["mcp"]["url"] = "http://my-mcp.tools.svc:8000/mcp"
    job = parse_job(doc(tools=[tool], rollout={"protocol": "hermes"}, reward={"preset": "exact-match"}))
    assert job.spec["tools"][0]["mcp"]["url"] == "http://my-mcp.tools.svc:8000/mcp"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"rollout": {"maxToolTurns": 0}}, r"rollout\.maxToolTurns"),
        ({"rollout": {"toolCall": {"timeoutSeconds": 0.05}}}, r"rollout\.toolCall\.timeoutSeconds"),
        (
            {"reward": {"preset": "custom", "custom": {"configMap": "r", "function": "compute-score"}}},
            r"reward\.custom\.function",
        ),
    ],
)
def test_the_trainers_bounds_are_the_crds(spec, field):
    """Bounds the trainer needs (a tool turn, a 0.1 s call timeout, a Python function name) live in the
    CRD, so the apiserver refuses such a job before a trainer starts; a file spec meets the same rule."""
    with pytest.raises(SpecError, match=rf"^spec\.{field}: "):
        parse_job(doc(**spec))
