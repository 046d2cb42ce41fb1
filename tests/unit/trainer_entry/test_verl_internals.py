"""The verl, Ray and vLLM internals trainer_entry relies on (verl_internals.INTERNALS): each is in place
in the installed versions, only verl_internals names them, and a moved one stops the run at start-up
with a list that names it."""

import ast
import json
import re
from pathlib import Path

import pytest
from trainer_entry.__main__ import main
from trainer_entry.verl_internals import INTERNALS, Internal, InternalsMoved, probe, problem

import trainer_entry
from trainer_entry import verl_internals

SPEC = {
    "model": {"path": "Qwen/Qwen2.5-3B-Instruct"},
    "data": {"trainFiles": ["/data/t.parquet"]},
    "algorithm": {"totalEpochs": 1},
    "rollout": {"protocol": "react"},
    "tools": [{"name": "python", "type": "python"}],
    "reward": {"preset": "exact-match"},
}


@pytest.mark.parametrize("internal", INTERNALS, ids=[internal.path for internal in INTERNALS])
def test_the_internal_is_where_we_rely_on_it(internal):
    assert problem(internal) is None


def test_each_internal_is_listed_once_and_says_what_we_use_it_for():
    paths = [internal.path for internal in INTERNALS]
    assert len(paths) == len(set(paths))
    for internal in INTERNALS:
        assert re.fullmatch(r"[\w.]+:[\w.]+", internal.path), internal.path
        assert internal.use and internal.when in (
            verl_internals.ALWAYS,
            verl_internals.CPU,
            verl_internals.VLLM_CPU,
            verl_internals.SEPARATE,
        )


def _private_names() -> set[str]:
    """The names of every internal: the symbol itself and the attributes its source must set."""
    names = {internal.qualname.split(".")[-1] for internal in INTERNALS}
    for internal in INTERNALS:
        for text in internal.source_has:
            names.update(re.findall(r"self\.(\w+)", text))
            names.update(re.findall(r"def (__\w+__)", text))
    return names - {"__init__", "fit", "ReplayBuffer"}  # public names that only locate an attribute


def test_only_verl_internals_names_an_internal():
    names = _private_names()
    package = Path(trainer_entry.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "verl_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            used = []
            if isinstance(node, ast.Attribute):
                used.append(node.attr)
            elif isinstance(node, ast.ImportFrom):
                used += [alias.name for alias in node.names]
            elif isinstance(node, ast.ClassDef):  # an override of a private method
                used += [
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
            found += [f"{path.name}:{node.lineno} {name}" for name in used if name in names]
    assert found == []


def _owner(cls: type, name: str) -> type:
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def test_probe_names_a_method_that_moved(monkeypatch):
    from verl.trainer.ppo.v1 import PPOTrainerSync

    monkeypatch.delattr(_owner(PPOTrainerSync, "_compute_advantage"), "_compute_advantage")
    moved = probe()
    assert len(moved) == 1
    assert moved[0].startswith(
        "verl.trainer.ppo.v1:PPOTrainerSync._compute_advantage: verl.trainer.ppo.v1 has no "
        "PPOTrainerSync._compute_advantage (no attribute '_compute_advantage') (we use it: counts"
    )
    with pytest.raises(InternalsMoved) as raised:
        verl_internals.check()
    message = str(raised.value)
    assert message.startswith("1 internal(s) of verl/Ray/vLLM that trainer_entry relies on moved")
    assert "verl 0.9.1" in message and "PPOTrainerSync._compute_advantage" in message
    assert "Moving to a new verl version" in message


def test_probe_names_a_changed_signature(monkeypatch):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    def terminal_eviction_reasons(self, step, partition_id):
        return set(), set(), set(), {}

    monkeypatch.setattr(ReplayBufferAsync, "_terminal_eviction_reasons", terminal_eviction_reasons)
    assert probe() == [
        "verl.trainer.ppo.v1.replay_buffer:ReplayBufferAsync._terminal_eviction_reasons: parameters are "
        "(step, partition_id), we rely on (global_steps, partition_id, ...) (we use it: sees failed prompt "
        "groups on each poll of the sampling loop, before verl regenerates them, and the groups dynamic "
        "sampling drops: it returns (stale, dapo-filtered, failed, {score: groups}))"
    ]


def test_probe_names_text_and_modules_that_moved():
    lost_line = Internal(
        "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ._run_prompt", "x", source_has=("no such line",)
    )
    assert problem(lost_line) == "its source no longer has 'no such line'"
    gone = Internal("verl.no_such_module:Thing", "x")
    assert problem(gone).startswith("module verl.no_such_module does not import (ModuleNotFoundError")


def test_a_replaced_function_is_probed_as_verls_own(monkeypatch):
    """cpu_platform replaces verl functions by ours; the probe still checks verl's."""
    import verl.utils.model as model_utils

    monkeypatch.setattr(verl_internals, "_ORIGINALS", {})
    original = model_utils.load_valuehead_model
    monkeypatch.setattr(model_utils, "load_valuehead_model", original)  # restored after the test

    def changed(path, dtype):
        return None

    verl_internals.replace(verl_internals.VALUEHEAD_LOADER, lambda *args: None)
    assert problem(verl_internals.BY_PATH[verl_internals.VALUEHEAD_LOADER]) is None
    verl_internals._ORIGINALS[verl_internals.VALUEHEAD_LOADER] = changed
    assert "we rely on (local_path, torch_dtype, model_config, trust_remote_code" in problem(
        verl_internals.BY_PATH[verl_internals.VALUEHEAD_LOADER]
    )


def test_a_run_on_a_verl_that_moved_an_internal_stops_before_ray_starts(tmp_path, capsys, monkeypatch):
    from verl.utils.tracking import Tracking

    from trainer_entry import run

    def start_ray(*args, **kwargs):
        raise AssertionError("Ray started although an internal moved")

    monkeypatch.setattr(run, "start_ray", start_ray)
    monkeypatch.setattr(Tracking, "__init__", lambda self: None)  # no longer sets `self.logger`
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"metadata": {"name": "j", "namespace": "rl"}, "spec": SPEC}))
    monkeypatch.setenv("TOOLRL_TOOL_POOL_URL", "http://j-tools.rl.svc:8080")
    assert main(["run", "--spec", str(spec), "--workdir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert "error: 1 internal(s) of verl/Ray/vLLM that trainer_entry relies on moved" in err
    assert "verl.utils.tracking:Tracking.__init__: its source no longer has 'self.logger = {}'" in err


def test_a_run_probes_what_its_job_uses(monkeypatch):
    from trainer_entry.spec import parse_job

    from trainer_entry import run

    asked = []
    monkeypatch.setattr(verl_internals, "probe", lambda contexts: asked.append(list(contexts)) or [])

    def job(**spec):
        return parse_job({"metadata": {"name": "j", "namespace": "rl"}, "spec": {**SPEC, **spec}})

    run.check_verl_internals(job())
    cpu = {"workers": {"replicas": 1, "gpusPerWorker": 0}}
    run.check_verl_internals(job(cluster=cpu, rollout={"protocol": "react", "engine": "hf"}))
    run.check_verl_internals(job(cluster=cpu, rollout={"protocol": "react", "engine": "vllm"}))
    separate = {"mode": "separate-async", "async": {"maxPolicyVersions": 2}}
    hf = {"protocol": "react", "engine": "hf"}
    run.check_verl_internals(
        job(trainer=separate, rollout=hf, cluster={**cpu, "rolloutWorkers": {"gpusPerWorker": 0}})
    )
    assert asked == [
        ["always"],
        ["always", "cpu"],
        ["always", "cpu", "vllm-cpu"],
        ["always", "cpu", "separate-async"],
    ]


def test_verls_separate_async_trainer_logs_with_a_flush_keyword_without_raising(caplog):
    """verl 0.9.1's `logger.info(..., flush=True)` in PPOTrainerSeparateAsync._setup (hybrid_engine
    false) raised TypeError in every separate-async run; with runner.py imported it logs."""
    import logging

    from verl.trainer.ppo.v1 import trainer_separate_async

    from trainer_entry import runner  # noqa: F401  (applies it where the trainer runs)

    with caplog.at_level(logging.INFO, logger=trainer_separate_async.__name__):
        trainer_separate_async.logger.info("rollout served by 1 standalone replicas only", flush=True)
    assert "rollout served by 1 standalone replicas only" in caplog.text
    original = verl_internals._ORIGINALS[verl_internals.SEPARATE_ASYNC_LOGGER]
    with pytest.raises(TypeError, match="flush"):
        original.info("verl's own logger refuses it", flush=True)
