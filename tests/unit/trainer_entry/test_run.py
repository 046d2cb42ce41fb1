"""The run command: dry run, generated working_dir, custom reward file, bounded wait for the pool."""

import json

import pytest
import yaml
from harness.localcluster import free_port
from trainer_entry.__main__ import main
from trainer_entry.run import (
    Environment,
    TrainingError,
    check_checkpoint_dir,
    check_custom_reward,
    check_data,
    check_model,
    describe,
    explain_ray_failure,
    wait_for_pool,
    write_tool_config,
    write_workdir,
)
from trainer_entry.spec import SpecError, parse_job
from trainer_entry.translate import tool_config, translate

SPEC = {
    "model": {"path": "Qwen/Qwen2.5-3B-Instruct"},
    "data": {"trainFiles": ["/data/t.parquet"]},
    "algorithm": {"totalEpochs": 1},
    "rollout": {"protocol": "react"},
    "tools": [{"name": "python", "type": "python"}],
    "reward": {"preset": "exact-match"},
}


def job(**spec):
    return parse_job({"metadata": {"name": "j", "namespace": "rl"}, "spec": {**SPEC, **spec}})


def test_dry_run_prints_the_verl_call_and_files(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "job.json"
    spec.write_text(
        json.dumps(
            {
                "apiVersion": "toolrl.dev/v1alpha1",
                "kind": "ToolRLJob",
                "metadata": {"name": "j", "namespace": "rl"},
                "spec": SPEC,
            }
        )
    )
    monkeypatch.setenv("TOOLRL_TOOL_POOL_URL", "http://j-tools.rl.svc:8080")
    assert main(["run", "--spec", str(spec), "--dry-run", "--overrides"]) == 0
    out = capsys.readouterr().out
    assert "python -m verl.trainer.main_ppo" in out
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=toolrl_react" in out
    assert "# --- toolrl_tools.yaml" in out and "pool_url: http://j-tools.rl.svc:8080" in out


def test_bad_spec_exits_with_the_field(tmp_path, capsys):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"metadata": {"name": "j"}, "spec": {**SPEC, "rollout": {"engine": "tgi"}}}))
    assert main(["run", "--spec", str(spec), "--dry-run"]) == 2
    assert "spec.rollout.engine: rollout.engine must be vllm or hf" in capsys.readouterr().err


def test_workdir_holds_what_verl_loads(tmp_path):
    j = job()
    write_workdir(j, translate(j, "http://pool:8080"), tmp_path)
    assert not (tmp_path / "toolrl_tools.yaml").exists()  # written once the pool's tools are read
    write_tool_config(tmp_path, tool_config(j, "http://pool:8080"))
    tools = yaml.safe_load((tmp_path / "toolrl_tools.yaml").read_text())
    assert tools["tools"][0]["class_name"] == "trainer_entry.tools.PoolTool"
    loops = yaml.safe_load((tmp_path / "toolrl_agent_loops.yaml").read_text())
    names = {entry["name"] for entry in loops}
    assert names == {"toolrl_tool_tags", "toolrl_python_tags", "toolrl_react", "toolrl_hermes"}
    text = describe(j, translate(j, "http://pool:8080"), tool_config(j, "http://pool:8080"), "job.json")
    assert text.count("toolrl_tools.yaml") >= 2


def test_verl_loads_our_tool_config(tmp_path):
    from verl.tools.tool_registry import initialize_tools_from_config

    web = {"name": "web", "type": "http", "url": "http://api.example:80/search"}  # the CRD needs a url
    tools = [{"name": "python", "type": "python", "timeoutSeconds": 3}, web]
    j = job(tools=tools)
    write_tool_config(tmp_path, tool_config(j, "http://pool:8080"))
    loaded = initialize_tools_from_config(str(tmp_path / "toolrl_tools.yaml"))
    assert [(t.name, t.tool_type, t.timeout) for t in loaded] == [
        ("python", "python", 3.0),
        ("web", "http", 10.0),  # the CRD default of tools[].timeoutSeconds
    ]


def test_custom_reward_is_copied_from_its_configmap_mount(tmp_path):
    j = job(reward={"preset": "custom", "custom": {"configMap": "my-reward", "function": "f"}})
    mount = tmp_path / "mount"
    with pytest.raises(SpecError, match=r"ConfigMap 'my-reward' must hold the key 'reward\.py'"):
        write_workdir(j, translate(j, "http://pool:8080"), tmp_path / "w", reward_dir=mount)
    mount.mkdir()
    (mount / "reward.py").write_text("def f(**kw):\n    return 1.0\n")
    write_workdir(j, translate(j, "http://pool:8080"), tmp_path / "w", reward_dir=mount)
    assert (tmp_path / "w" / "toolrl_custom_reward.py").read_text().startswith("def f")


@pytest.mark.parametrize(
    ("source", "error"),
    [
        (
            "def f(data_source, solution_str, ground_truth, extra_info=None):\n    return {} / 2\n",
            r"f\(\) raised TypeError: unsupported operand .* first training example",
        ),
        (
            "async def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1 / 0\n",
            r"f\(\) raised ZeroDivisionError: division by zero when scoring the first training example",
        ),
        ("import no_such_module\n", r"importing it raised ModuleNotFoundError"),
        ("def g(**kw):\n    return 1.0\n", r"defines no function 'f'"),
    ],
)
def test_a_custom_reward_that_cannot_score_one_answer_fails_before_training(tmp_path, source, error):
    """verl's agent loop hangs on a reward's exception; the trainer calls the reward once first."""
    import pandas as pd

    data = tmp_path / "train.parquet"
    row = {
        "data_source": "toy",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": {"i": 0},
    }
    pd.DataFrame([row]).to_parquet(data)
    j = job(
        data={"trainFiles": [str(data)]},
        reward={"preset": "custom", "custom": {"configMap": "r", "function": "f"}},
    )
    (tmp_path / "toolrl_custom_reward.py").write_text(source)
    with pytest.raises(TrainingError, match=error):
        check_custom_reward(j, tmp_path)
    seen = tmp_path / "seen.json"
    (tmp_path / "toolrl_custom_reward.py").write_text(
        "import json\n"
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    open({str(seen)!r}, 'w').write(json.dumps([data_source, solution_str, ground_truth]))\n"
        "    return 1.0\n"
    )
    check_custom_reward(j, tmp_path)
    assert json.loads(seen.read_text()) == ["toy", "7", "7"]


async def test_waiting_for_the_pool_is_bounded():
    with pytest.raises(TimeoutError, match=r"not ready after 0s: check the J-tools Deployment"):
        await wait_for_pool(f"http://127.0.0.1:{free_port()}", timeout=0.3, interval=0.1)


async def test_waiting_for_a_ready_pool(sandbox):
    await wait_for_pool(sandbox, timeout=5)


def test_our_trainer_is_registered_with_verl():
    from trainer_entry.runner import ToolRLTaskRunner, ToolRLTrainer
    from trainer_entry.verl_entry_points import TRAINER_MODE
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

    assert get_trainer_cls(TRAINER_MODE) is ToolRLTrainer and issubclass(ToolRLTrainer, PPOTrainerSync)
    assert hasattr(ToolRLTaskRunner, "remote")


def test_our_hooks_are_registered_for_each_trainer_mode_over_verls_trainer_of_that_mode():
    from trainer_entry.runner import (
        ToolRLColocateAsyncTrainer,
        ToolRLHooks,
        ToolRLSeparateAsyncTrainer,
        ToolRLTrainer,
    )
    from trainer_entry.spec import TRAINER_MODES as SPEC_MODES
    from trainer_entry.verl_entry_points import TRAINER_MODES
    from trainer_entry.verl_internals import TrainerStepHooks
    from verl.trainer.ppo.v1 import (
        PPOTrainerColocateAsync,
        PPOTrainerSeparateAsync,
        PPOTrainerSync,
        get_trainer_cls,
    )

    assert set(TRAINER_MODES) == set(SPEC_MODES), "every mode the spec accepts has a trainer"
    ours = {
        "sync": (ToolRLTrainer, PPOTrainerSync),
        "colocate-async": (ToolRLColocateAsyncTrainer, PPOTrainerColocateAsync),
        "separate-async": (ToolRLSeparateAsyncTrainer, PPOTrainerSeparateAsync),
    }
    for mode, (trainer, verls) in ours.items():
        assert get_trainer_cls(TRAINER_MODES[mode]) is trainer
        assert trainer.mode == mode, "the mode its idle fractions are computed for"
        # our hooks first, verl's trainer of that mode behind them (what their super() calls)
        assert trainer.__mro__[1:4] == (ToolRLHooks, TrainerStepHooks, verls), trainer.__mro__


def test_each_step_logs_its_idle_fractions_with_verls_metrics(monkeypatch):
    """verl computes a step's metrics (its timings among them), our hooks add the idle fractions of the
    trainer's mode, and verl's Tracking then logs them all: to its console and to our gauges."""
    from trainer_entry.hub import Sink, TrackingBackend, use_sink
    from trainer_entry.metrics import TrainerMetrics
    from trainer_entry.runner import ToolRLSeparateAsyncTrainer
    from verl.trainer.ppo.v1 import PPOTrainerSync

    def verls(self, batch, metrics, timing_raw, global_steps, epoch):  # verl's timing part of it
        metrics.update({f"timing_s/{name}": seconds for name, seconds in timing_raw.items()})

    owner = next(k for k in PPOTrainerSync.__mro__ if "_compute_metrics" in vars(k))
    monkeypatch.setattr(owner, "_compute_metrics", verls)
    gauges = TrainerMetrics()
    use_sink(Sink(local=gauges))
    trainer = ToolRLSeparateAsyncTrainer.__new__(ToolRLSeparateAsyncTrainer)  # the hooks only
    metrics: dict = {}
    timing = {"gen": 1.0, "update_actor": 2.0, "update_weights": 0.5, "step": 4.0}
    trainer._compute_metrics(None, metrics, timing, global_steps=3, epoch=0)
    assert metrics["toolrl/trainer_idle_fraction"] == 0.25
    assert metrics["toolrl/rollout_idle_fraction"] == 0.125  # separate-async: the weight sync only
    TrackingBackend().log(metrics, step=3)
    assert gauges.registry.get_sample_value("toolrl_trainer_rollout_idle_fraction") == 0.125
    assert gauges.registry.get_sample_value("toolrl_trainer_idle_fraction") == 0.25


class Replicas:
    """verl's CheckpointEngineManager as the trainers' hooks call it: records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: self.calls.append((name, *args))


def test_the_async_trainers_own_hooks_still_run_under_ours():
    """verl's colocate_async hooks pause generation for the update (abort and sleep the replicas after
    sampling), update the weights and resume generation after the step, and send the warm-up batches
    before the first: ours must not replace them."""
    from omegaconf import OmegaConf
    from trainer_entry.hub import Sink, use_sink
    from trainer_entry.metrics import TrainerMetrics
    from trainer_entry.runner import ToolRLColocateAsyncTrainer
    from verl.utils.tracking import Tracking

    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    trainer = ToolRLColocateAsyncTrainer.__new__(ToolRLColocateAsyncTrainer)  # the hooks only
    trainer.logger = Tracking(project_name="rl", experiment_name="j", default_backend=[])
    trainer.total_training_steps = 10
    trainer.global_steps = 3
    trainer.timing_raw = {}
    trainer.curr_step_profile = False
    trainer.checkpoint_manager = replicas = Replicas()
    warmups: list = []
    trainer._add_async_warmup_batches = warmups.append
    trainer.config = OmegaConf.create({"trainer": {"v1": {"colocate_async": {"num_warmup_batches": 1.5}}}})

    trainer.on_train_begin()
    assert warmups == [1.5], "verl's warm-up batches were not sent"
    assert "toolrl" in trainer.logger.logger
    trainer.on_step_begin()
    assert metrics.registry.get_sample_value("toolrl_trainer_rollout_phase", {"phase": "generating"}) == 1
    trainer.on_sample_end()
    assert metrics.registry.get_sample_value("toolrl_trainer_rollout_phase", {"phase": "scoring"}) == 1
    assert [c[0] for c in replicas.calls] == ["abort_replicas", "sleep_replicas"]
    trainer.on_step_end()
    assert replicas.calls[2:] == [("update_weights", 3), ("resume_generation_replicas",)]


def test_the_separate_async_trainers_own_hooks_still_run_under_ours():
    """verl's separate_async hooks send the warm-up batches before the first step and sync the weights
    to the standalone rollout after every step (its checkpoint engine): ours must not replace them."""
    from omegaconf import OmegaConf
    from trainer_entry.hub import Sink, use_sink
    from trainer_entry.metrics import TrainerMetrics
    from trainer_entry.runner import ToolRLSeparateAsyncTrainer
    from verl.trainer.config import HybridRolloutSwitchConfig
    from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode
    from verl.utils.tracking import Tracking

    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    trainer = ToolRLSeparateAsyncTrainer.__new__(ToolRLSeparateAsyncTrainer)  # the hooks only
    trainer.logger = Tracking(project_name="rl", experiment_name="j", default_backend=[])
    trainer.total_training_steps = 10
    trainer.global_steps = 3
    trainer.timing_raw = {}
    trainer.curr_step_profile = trainer.prev_step_profile = False
    trainer.standalone_checkpoint_manager = replicas = Replicas()
    trainer.hybrid_rollout_config = HybridRolloutSwitchConfig()
    trainer.current_mode = HybridEngineMode.TRAINER  # hybrid_engine false: never lends training workers
    warmups: list = []
    trainer._add_async_warmup_batches = warmups.append
    trainer.config = OmegaConf.create({"trainer": {"v1": {"separate_async": {"num_warmup_batches": 2}}}})

    trainer.on_train_begin()
    assert warmups == [2], "verl's warm-up batches were not sent"
    assert "toolrl" in trainer.logger.logger
    trainer.on_step_begin()
    assert metrics.registry.get_sample_value("toolrl_trainer_rollout_phase", {"phase": "generating"}) == 1
    trainer.on_sample_begin()
    trainer.on_sample_end()
    assert metrics.registry.get_sample_value("toolrl_trainer_rollout_phase", {"phase": "scoring"}) == 1
    trainer.on_step_end()
    assert replicas.calls == [("update_weights", 3)]


def test_trainer_hooks_feed_metrics_through_verls_tracking():
    from types import SimpleNamespace

    from trainer_entry.hub import Sink, use_sink
    from trainer_entry.metrics import TrainerMetrics
    from trainer_entry.runner import ToolRLTrainer
    from verl.utils.tracking import Tracking

    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    trainer = ToolRLTrainer.__new__(ToolRLTrainer)  # the hooks only, no GPU workers
    trainer.logger = Tracking(project_name="rl", experiment_name="j", default_backend=[])
    trainer.total_training_steps = 10
    trainer.checkpoint_manager = SimpleNamespace(sleep_replicas=lambda: None)
    trainer.curr_step_profile = False
    trainer.on_train_begin()
    trainer.on_step_begin()
    assert metrics.registry.get_sample_value("toolrl_trainer_rollout_phase", {"phase": "generating"}) == 1
    trainer.on_sample_end()
    assert metrics.registry.get_sample_value("toolrl_trainer_rollout_phase", {"phase": "scoring"}) == 1
    trainer.logger.log(data={"timing_s/step": 3.0, "critic/score/mean": 0.7}, step=1)
    assert metrics.registry.get_sample_value("toolrl_trainer_reward_mean") == 0.7
    assert metrics.registry.get_sample_value("toolrl_trainer_step") == 1


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TOOLRL_METRICS_PORT", "http", "TOOLRL_METRICS_PORT='http': must be an integer in [1, 65535]"),
        ("TOOLRL_METRICS_PORT", "70000", "TOOLRL_METRICS_PORT='70000': must be an integer in [1, 65535]"),
        ("TOOLRL_POOL_WAIT_SECONDS", "10m", "TOOLRL_POOL_WAIT_SECONDS='10m': must be a number >= 0"),
        ("TOOLRL_POOL_WAIT_SECONDS", "-1", "TOOLRL_POOL_WAIT_SECONDS='-1': must be a number >= 0"),
        ("TOOLRL_POOL_WAIT_SECONDS", "nan", "TOOLRL_POOL_WAIT_SECONDS='nan': must be a number >= 0"),
    ],
)
def test_bad_environment_exits_with_the_variable(tmp_path, capsys, monkeypatch, name, value, message):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"metadata": {"name": "j", "namespace": "rl"}, "spec": SPEC}))
    monkeypatch.setenv("TOOLRL_TOOL_POOL_URL", "http://j-tools.rl.svc:8080")
    monkeypatch.setenv(name, value)
    assert main(["run", "--spec", str(spec), "--workdir", str(tmp_path / "w")]) == 2
    assert message in capsys.readouterr().err


def test_environment_numbers_are_read(monkeypatch):
    monkeypatch.setenv("TOOLRL_TOOL_POOL_URL", "http://j-tools.rl.svc:8080")
    monkeypatch.setenv("TOOLRL_METRICS_PORT", "9500")
    monkeypatch.setenv("TOOLRL_POOL_WAIT_SECONDS", "2.5")
    env = Environment.from_env(job())
    assert (env.metrics_port, env.pool_wait_seconds) == (9500, 2.5)
    monkeypatch.delenv("TOOLRL_METRICS_PORT")
    monkeypatch.delenv("TOOLRL_POOL_WAIT_SECONDS")
    env = Environment.from_env(job())
    assert (env.metrics_port, env.pool_wait_seconds) == (9400, 600.0)


def test_a_model_path_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"spec\.model\.path: .*no-model does not exist"):
        check_model(str(tmp_path / "no-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        SpecError, match=r"spec\.model\.path: cannot load .*the directory holds no loadable model"
    ):
        check_model(str(tmp_path / "empty"))


def test_the_tiny_model_loads(tiny_model):
    check_model(str(tiny_model))


def test_ray_failures_name_their_cause():
    import ray.exceptions

    oom = ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.")
    assert explain_ray_failure(oom).startswith("out of memory: Ray killed a worker")
    # the chaos bench's lost worker pod: verl's task runner raised this, and the message blamed memory
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    death = "The actor is dead because its node has died. Node Id: 4f2a"  # Ray's GCS, NodeDied
    lost = ray.exceptions.ActorDiedError(
        ActorDiedErrorContext(error_message=death, actor_id=bytes(16), class_name="TaskRunner")
    )
    assert explain_ray_failure(lost).startswith("a Ray node was lost"), explain_ray_failure(lost)
    assert explain_ray_failure(ray.exceptions.ActorDiedError()).startswith("a Ray worker died")
    inner = ValueError("reward function raised: boom")
    failed = ray.exceptions.RayTaskError("update_actor", "Traceback ...\nValueError: boom", inner)
    assert (
        explain_ray_failure(failed)
        == "training failed in a Ray worker: ValueError: reward function raised: boom"
    )


@pytest.mark.parametrize("installed", [None, "0.24.0"], ids=["no-vllm", "gpu-build"])
def test_a_cpu_vllm_job_without_vllms_cpu_build_says_what_to_do(monkeypatch, installed):
    """Without the check, a missing (or GPU) vLLM failed only inside a Ray worker, minutes in."""
    from importlib import metadata

    from trainer_entry.run import check_engine

    real = metadata.version

    def version(name):
        if name != "vllm":
            return real(name)
        if installed:
            return installed
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    cpu = {"cluster": {"workers": {"gpusPerWorker": 0}}, "rollout": {"engine": "vllm"}}
    with pytest.raises(SpecError) as err:
        check_engine(job(**cpu))
    have = f"vllm {installed}" if installed else "no vLLM"
    message = str(err.value)
    assert "spec.rollout.engine: vllm with cluster.workers.gpusPerWorker 0 runs vLLM's CPU build" in message
    assert f"this environment has {have}" in message and "or use rollout.engine hf" in message
    check_engine(job(rollout={"engine": "vllm"}))  # on GPUs the image's vLLM is the GPU build
    check_engine(job(cluster={"workers": {"gpusPerWorker": 0}}, rollout={"engine": "hf"}))


def test_the_workspace_has_vllms_cpu_build_for_cpu_vllm_jobs():
    from trainer_entry.run import check_engine

    check_engine(job(cluster={"workers": {"gpusPerWorker": 0}}, rollout={"engine": "vllm"}))


def test_the_run_refuses_data_prepared_for_another_protocol(tmp_path, capsys):
    from trainer_entry.data import gsm8k_row, write_parquet

    train = tmp_path / "train.parquet"
    write_parquet(
        [gsm8k_row({"question": "q", "answer": "#### 1"}, 0, "train", "python", "python-tags")], train
    )
    with pytest.raises(
        SpecError, match=r"^spec.data: .*train.parquet: prepared for tool-call protocol python-tags"
    ):
        check_data(job(data={"trainFiles": [str(train)]}, rollout={"protocol": "hermes"}))
    check_data(job(data={"trainFiles": [str(train)]}, rollout={"protocol": "python-tags"}))


def test_a_run_that_saves_checkpoints_must_be_able_to_write_them(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a directory cannot be made under a file, whoever runs the test
    with pytest.raises(SpecError, match=r"^spec.checkpoint.volume: .*a-file/ckpt is not writable by uid"):
        check_checkpoint_dir(20, str(blocked / "ckpt"))
    check_checkpoint_dir(-1, str(blocked / "ckpt"))  # never saves: nothing to write
    check_checkpoint_dir(20, str(tmp_path / "ns" / "job"))
    assert (tmp_path / "ns" / "job").is_dir() and not list((tmp_path / "ns" / "job").iterdir())


@pytest.mark.parametrize("as_raised", ["task error", "as ray.get raises it"])
def test_a_checkpoint_that_cannot_be_written_stops_the_run_saying_so(monkeypatch, as_raised):
    """Issue 25 (7): a full or read-only volume failed the run with an OSError traceback from a worker.
    `ray.get` raises the worker's error as `RayTaskError(OSError)`, an OSError itself whose text is the
    traceback (seen on the real node: the job's status quoted it)."""
    import errno

    import ray.exceptions
    from omegaconf import OmegaConf
    from trainer_entry.runner import CheckpointWriteError, ToolRLTrainer
    from verl.trainer.ppo.v1 import PPOTrainerSync

    full = OSError(errno.ENOSPC, "No space left on device")
    in_worker = ray.exceptions.RayTaskError("save_checkpoint", "Traceback ...\nOSError: ...", full)
    if as_raised == "as ray.get raises it":
        in_worker = in_worker.as_instanceof_cause()
        assert isinstance(in_worker, OSError) and in_worker.strerror is None

    def save(self):
        raise in_worker

    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", save)
    trainer = ToolRLTrainer.__new__(ToolRLTrainer)  # only what _save_checkpoint reads
    trainer.global_steps = 6
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": "/checkpoints/ns/job"}})
    with pytest.raises(CheckpointWriteError) as err:
        trainer._save_checkpoint()
    message = str(err.value)
    assert message.startswith(
        "the checkpoint of step 6 could not be written to /checkpoints/ns/job: No space left on device; "
        "free space on the checkpoint volume (spec.checkpoint.volume)"
    ), message
    assert "a retry resumes from" in message
    # what the job's status says when the task runner raised it
    failed = ray.exceptions.RayTaskError("run", "Traceback ...", err.value)
    assert explain_ray_failure(failed) == message

    def other(self):
        raise ValueError("not about writing")

    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", other)
    with pytest.raises(ValueError, match="not about writing"):  # anything else goes on unchanged
        trainer._save_checkpoint()


def test_an_mcp_entry_the_pool_serves_no_tool_of_stops_the_start():
    from trainer_entry.run import check_pool_tools

    entry = {"name": "remote", "type": "mcp", "mcp": {"url": "http://my-mcp.tools.svc:8000/mcp"}}
    j = job(tools=[{"name": "python", "type": "python"}, entry])
    check_pool_tools(j, [{"name": "python", "type": "python"}, {"name": "remote__add", "type": "mcp"}])
    with pytest.raises(SpecError, match=r"serves no tool of the MCP server http://my-mcp.tools.svc:8000/mcp"):
        check_pool_tools(j, [{"name": "python", "type": "python"}])


def test_a_pool_that_does_not_serve_the_jobs_tools_stops_the_start():
    """The schemas the model is offered are the pool's (GET /v1/tools): a pool whose tools.yaml is not
    the job's, which would answer none of its calls, stops the run before training."""
    from trainer_entry.run import check_pool_tools

    j = job(tools=[{"name": "python", "type": "python"}, {"name": "find", "type": "search", "corpus": "/c"}])
    check_pool_tools(j, [{"name": "python", "type": "python"}, {"name": "find", "type": "search"}])
    with pytest.raises(SpecError, match=r"'find': the tool pool serves no search tool of that name"):
        check_pool_tools(j, [{"name": "python", "type": "python"}])
    served = r"\(served: python \(python\), find \(http\)\)"
    with pytest.raises(SpecError, match=rf"serves no search tool of that name {served}"):
        check_pool_tools(j, [{"name": "python", "type": "python"}, {"name": "find", "type": "http"}])


async def test_the_pools_tools_are_read_from_the_ready_pool(sandbox):
    from trainer_entry.run import read_pool_tools

    served = {tool["name"]: tool for tool in await read_pool_tools(sandbox)}
    assert set(served) == {"python", "calc_gsm8k_reward"}  # the conftest's pool
    python = served["python"]
    assert (python["name"], python["type"]) == ("python", "python")
    assert python["inputSchema"]["required"] == ["code"]
