"""`trainer_entry run --dry-run`: the manifest as applied, the start-up checks without a cluster, the
composed verl config, `--compare` with a verl recipe; extraArgs that would be ignored are refused."""

import json
from pathlib import Path

import pytest
import yaml
from trainer_entry.__main__ import main
from trainer_entry.dry_run import command_overrides, read_manifest
from trainer_entry.run import TrainingError, check_columns, check_custom_reward
from trainer_entry.spec import SpecError, parse_job
from trainer_entry.translate import tool_config, translate

from trainer_entry import verl_config

ROOT = Path(__file__).resolve().parents[3]
POOL = "http://pool:8080"
SPEC = {
    "model": {"path": "Qwen/Qwen2.5-3B-Instruct"},
    "data": {"trainFiles": ["/data/t.parquet"]},
    "algorithm": {"totalEpochs": 1},
    "rollout": {"protocol": "hermes"},
    "tools": [{"name": "python", "type": "python"}],
    "reward": {"preset": "exact-match"},
}


def job(**spec):
    return parse_job({"metadata": {"name": "j", "namespace": "rl"}, "spec": {**SPEC, **spec}})


def gsm8k_data(path: Path, protocol: str = "hermes") -> Path:
    from trainer_entry.data import gsm8k_row, write_parquet

    write_parquet([gsm8k_row({"question": "1+1?", "answer": "#### 2"}, 0, "train", "python", protocol)], path)
    return path


# A reward function written for verl: it reads what verl adds to extra_info in training.
VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert extra_info["num_turns"] >= 2, extra_info["num_turns"]
    assert extra_info["raw_prompt"][0]["role"] == "system"
    assert extra_info["rollout_reward_scores"] == {}
    return float(solution_str.strip() == str(ground_truth)) - 0.1 * (extra_info["num_turns"] > 4)
"""


def test_the_dry_run_takes_the_yaml_manifest_runs_the_checks_and_prints_the_composed_config(
    tmp_path, capsys, monkeypatch
):
    data = gsm8k_data(tmp_path / "train.parquet")
    reward = tmp_path / "reward.py"
    reward.write_text(VERL_REWARD)
    manifest = {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": "j", "namespace": "rl"},
        "spec": {
            **SPEC,
            "data": {"trainFiles": [str(data)], "maxPromptLength": 300},
            "reward": {"preset": "custom", "custom": {"configMap": "r", "function": "compute_score"}},
        },
    }
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(manifest))
    monkeypatch.setenv("TOOLRL_TOOL_POOL_URL", "http://j-tools.rl.svc:8080")
    assert main(["run", "--spec", str(spec), "--dry-run", "--reward-file", str(reward)]) == 0
    out, err = capsys.readouterr()
    config, tools, loops = yaml.safe_load_all(out)
    rollout = config["actor_rollout_ref"]["rollout"]
    assert rollout["agent"]["default_agent_loop"] == "toolrl_hermes"
    assert rollout["prompt_length"] == 300, "resolved: verl's interpolation of data.max_prompt_length"
    assert rollout["multi_turn"]["max_assistant_turns"] == 4 and rollout["multi_turn"]["max_user_turns"] == 3
    assert config["reward"]["custom_reward_function"]["reward_kwargs"]["preset"] == "custom"
    assert tools["tools"][0]["config"]["pool_url"] == "http://j-tools.rl.svc:8080"
    assert {loop["name"] for loop in loops} >= {"toolrl_hermes"}
    assert f"check: data {data}: readable, columns and protocol: ok" in err
    assert "reward compute_score() of" in err and "scored the first training example" in err
    assert "skipped: model Qwen/Qwen2.5-3B-Instruct: a hub id" in err


def test_the_manifest_may_be_json_a_bare_spec_or_a_stream(tmp_path):
    bare = tmp_path / "spec.yaml"
    bare.write_text(yaml.safe_dump(SPEC))
    doc = read_manifest(str(bare))
    assert doc["metadata"] == {"name": "dry-run", "namespace": "default"} and doc["spec"] == SPEC
    stream = tmp_path / "all.yaml"
    whole = {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": "x"},
        "spec": SPEC,
    }
    stream.write_text(yaml.safe_dump_all([{"apiVersion": "v1", "kind": "ConfigMap"}, whole]))
    assert read_manifest(str(stream))["metadata"]["name"] == "x"
    (tmp_path / "j.json").write_text(json.dumps(whole))
    assert read_manifest(str(tmp_path / "j.json"))["spec"] == SPEC
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(SpecError, match="kind 'ConfigMap', not ToolRLJob"):
        read_manifest(str(tmp_path / "cm.yaml"))
    (tmp_path / "bad.yaml").write_text("spec: [unclosed\n")
    with pytest.raises(SpecError, match="neither JSON nor YAML"):
        read_manifest(str(tmp_path / "bad.yaml"))


def test_a_reward_written_for_verl_passes_the_start_up_check(tmp_path):
    """verl 0.9.1 (NaiveRewardManager.run_single) adds num_turns, rollout_reward_scores and the agent
    loop's extra_fields (raw_prompt, ...) to extra_info; the check used to pass the row's alone."""
    data = gsm8k_data(tmp_path / "train.parquet")
    (tmp_path / "toolrl_custom_reward.py").write_text(VERL_REWARD)
    for protocol in ("hermes", "python-tags"):
        j = job(
            data={"trainFiles": [str(gsm8k_data(tmp_path / f"{protocol}.parquet", protocol))]},
            rollout={"protocol": protocol},
            reward={"preset": "custom", "custom": {"configMap": "r", "function": "compute_score"}},
        )
        check_custom_reward(j, tmp_path)
    (tmp_path / "toolrl_custom_reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return extra_info['no_such_key']\n"
    )
    j = job(
        data={"trainFiles": [str(data)]},
        reward={"preset": "custom", "custom": {"configMap": "r", "function": "compute_score"}},
    )
    with pytest.raises(
        TrainingError, match=r"KeyError: 'no_such_key' .* extra_info with keys \[.*'num_turns'"
    ):
        check_custom_reward(j, tmp_path)


def test_data_without_the_columns_verl_reads_is_refused(tmp_path):
    import pandas as pd

    path = tmp_path / "t.parquet"
    pd.DataFrame([{"question": "q", "data_source": "d", "reward_model": {"ground_truth": "1"}}]).to_parquet(
        path
    )
    with pytest.raises(SpecError, match=r"t.parquet: no column prompt \(verl reads the prompt from 'prompt'"):
        check_columns(str(path))
    check_columns(str(gsm8k_data(tmp_path / "ok.parquet")))


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (
            ["trainer.val_befor_train=false"],
            r"^spec.trainer.extraArgs\[0\] 'trainer.val_befor_train=false': verl's config has no key "
            r"trainer.val_befor_train: did you mean trainer.val_before_train=\.\.\.\?",
        ),
        (
            ["+trainer.total_epoch=3"],
            r"no key trainer.total_epoch: did you mean trainer.total_epochs \(without",
        ),
        (
            ["+trainer.my_knob=3"],
            r"nothing in verl 0.9.1 reads a key 'my_knob', so trainer.my_knob would be ignored",
        ),
        (["+trainer.total_epochs=3"], r"trainer.total_epochs is already in verl's config: drop the '\+'"),
        (
            ["data.custom_cls.name=MyDataset"],
            r"refused: data.custom_cls.name is set by the job; the job's dataset",
        ),
        (
            ["actor_rollout_ref.rollout.multi_turn.tool_config_path=my_tools.yaml"],
            r"refused: .*tool_config_path is set by the job; the job's tools are spec.tools",
        ),
        (["reward.custom_reward_function.path=x.py"], r"refused: .* spec.reward chooses the reward"),
        (
            ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"],
            r"^algorithm.filter_groups.enable=true \(DAPO's dynamic sampling\) would do nothing: "
            r".*skips it when trainer.v1.sampler.custom_sampler is set",
        ),
        (
            ["+reward.reward_kwargs.overlong_buffer_cfg={enable:true,len:16,penalty_factor:1.0,log:false}"],
            r"^reward.reward_kwargs.overlong_buffer_cfg.enable=true \(DAPO's overlong penalty\) would do "
            r"nothing: .* only in its dapo reward manager, and this job's is naive: set "
            r"spec.reward.overlongPenalty",
        ),
        (
            ["actor_rollout_ref.model.use_remove_padding=true"],
            r"actor_rollout_ref.model.use_remove_padding=true with attn_implementation sdpa cannot work",
        ),
    ],
)
def test_extra_args_that_would_be_ignored_or_replace_the_jobs_own_are_refused_in_one_line(extra, error):
    j = job(trainer={"extraArgs": extra})
    with pytest.raises(SpecError, match=error) as caught:
        verl_config.compose_job(j, translate(j, POOL))
    assert len(str(caught.value).splitlines()) == 1


def test_extra_args_verl_reads_are_composed_and_those_over_a_field_warned():
    fine = [
        "+trainer.remove_previous_ckpt_in_save=true",  # undeclared, but verl reads it by name
        "+actor_rollout_ref.model.override_config.rope_theta=10000",
        "actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.rollout.n=4",
    ]
    j = job(
        data={"trainFiles": ["/data/t.parquet"], "valFiles": ["/data/v.parquet"]}, trainer={"extraArgs": fine}
    )
    config, warnings = verl_config.compose_job(j, translate(j, POOL))
    assert config.trainer.remove_previous_ckpt_in_save is True and config.actor_rollout_ref.rollout.n == 4
    assert warnings[0] == (
        "spec.trainer.extraArgs 'actor_rollout_ref.rollout.n=4' replaces what "
        "spec.algorithm.rolloutsPerPrompt sets (8): set the field instead"
    )
    assert "spec.data.valFiles are validated before training only" in warnings[1] and len(warnings) == 2


def test_val_freq_validates_every_n_steps_and_unset_says_validation_runs_before_training_only():
    files = {"trainFiles": ["/data/t.parquet"], "valFiles": ["/data/v.parquet"]}
    for val_freq, test_freq, warned in ((5, 5, False), (-1, -1, False), (None, -1, True)):
        data = files if val_freq is None else {**files, "valFreq": val_freq}
        j = job(data=data)
        config, warnings = verl_config.compose_job(j, translate(j, POOL))
        assert config.trainer.test_freq == test_freq and config.trainer.val_before_train is True
        assert any("validated before training only" in w for w in warnings) is warned, warnings
    j = job(data=files, trainer={"extraArgs": ["trainer.test_freq=3"]})
    _, warnings = verl_config.compose_job(j, translate(j, POOL))
    assert "replaces what spec.data.valFreq" in warnings[0], warnings


def test_a_verl_command_line_is_read_as_the_shell_hands_it_to_verl(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    script = (
        'PROJECT_DIR="/src/verl"\nset -x\npython3 -m verl.trainer.main_ppo \\\n'
        "    --config-path=\"$PROJECT_DIR/config\" \\\n    data.truncation='error' \\\n"
        "    trainer.logger=['console','wandb'] \\\n    data.train_files=$HOME/data/train.parquet \\\n"
        '    actor_rollout_ref.rollout.multi_turn.tool_config_path="$PROJECT_DIR/t.yaml" \\\n'
        "    +trainer.x=1 trainer.total_epochs=15 $@\n"
    )
    overrides, notes = command_overrides(script)
    assert overrides == [
        "data.truncation=error",
        "trainer.logger=[console,wandb]",
        "data.train_files=/home/u/data/train.parquet",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=/src/verl/t.yaml",
        "+trainer.x=1",
        "trainer.total_epochs=15",
    ]
    assert len(notes) == 1 and notes[0].startswith("--config-path=/src/verl/config: not read")


def test_the_gsm8k_multiturn_recipe_ported_differs_from_verls_only_where_it_says(capsys):
    """examples/recipes/gsm8k-multiturn.yaml against the recipe's own settings (gsm8k-multiturn.verl.txt):
    every hyper-parameter the recipe sets is the job's too; what differs is the engine, the tool, the
    attention and batching the job forces, and names."""
    set_by_recipe, same_keys, differ_keys, same, differ = _compared("gsm8k-multiturn", capsys)
    expected_differ = {  # what the job cannot or does not take over, each listed with its reason
        "actor_rollout_ref.rollout.name",  # vllm, not sglang
        "actor_rollout_ref.rollout.multi_stage_wake_up",  # sglang's
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",  # the job's tools
        "actor_rollout_ref.model.use_remove_padding",  # SDPA
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",  # token-count micro-batches
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "trainer.logger",
        "trainer.project_name",
        "trainer.experiment_name",
    }
    assert set_by_recipe - same_keys == expected_differ
    assert expected_differ <= differ_keys
    for key in (
        "actor_rollout_ref.rollout.n: 16",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns: 5",
        "trainer.test_freq: 20",
        "trainer.total_epochs: 15",
        "actor_rollout_ref.actor.optim.lr: 1e-06",
    ):
        assert any(line.strip().startswith(key) for line in same), key
    line = next(x for x in differ if x.strip().startswith("actor_rollout_ref.model.use_remove_padding:"))
    assert "false (forced by the job (SDPA attention" in line and "| true (set)" in line


def _compared(recipe: str, capsys) -> tuple[set[str], set[str], set[str], list[str], list[str]]:
    """The dry run of examples/recipes/<recipe>.yaml against <recipe>.verl.txt: the keys the recipe
    sets, those the job's config has the same, those it has otherwise, and the same and differing lines."""
    recipes = ROOT / "examples" / "recipes"
    args = ["run", "--dry-run", "--spec", str(recipes / f"{recipe}.yaml")]
    assert main([*args, "--compare", str(recipes / f"{recipe}.verl.txt")]) == 0
    out, err = capsys.readouterr()
    assert "warning:" not in err, err
    compare = out.split("\n---\n")[-1]
    differ = compare.split("\ndiffer:\n")[1].split("\nsame:\n")[0].splitlines()
    same = compare.split("\nsame:\n")[1].splitlines()
    set_by_recipe = {
        line.split("=")[0]
        for line in (recipes / f"{recipe}.verl.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    keys = [{line.split(":")[0].strip() for line in lines} for lines in (same, differ)]
    return set_by_recipe, keys[0], keys[1], same, differ


def test_the_retool_recipe_ported_differs_from_verls_only_where_it_says(capsys):
    """examples/recipes/retool.yaml against the ReTool recipe's own settings (retool.verl.txt): its tool is
    the pool's python tool answering as SandboxFusion does, its reward the math preset; what differs is
    what the job forces or bounds, and names."""
    set_by_recipe, same, differ, _, lines = _compared("retool", capsys)
    expected_differ = {  # what the job cannot or does not take over, each listed with its reason
        "actor_rollout_ref.model.use_remove_padding",  # SDPA
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",  # needs remove-padding (flash-attn)
        "actor_rollout_ref.rollout.gpu_memory_utilization",  # the CRD's bound for a colocated vLLM
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",  # maxToolTurns + 1
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",  # the job's tools
        "trainer.logger",
        "trainer.project_name",
        "trainer.experiment_name",
    }
    assert set_by_recipe - same == expected_differ
    assert expected_differ <= differ
    for key in (
        "actor_rollout_ref.actor.clip_ratio_high",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns",
        "data.max_response_length",
        "actor_rollout_ref.rollout.val_kwargs.n",
    ):
        assert key in same, key
    line = next(x for x in lines if x.strip().startswith("actor_rollout_ref.rollout.gpu_memory_utilization:"))
    assert "0.85 (spec.rollout.gpuMemoryUtilization) | 0.9 (set)" in line, line


OVERLONG = {"enabled": True, "bufferLength": 512, "penaltyFactor": 1.0}


def test_dapos_knobs_set_through_extra_args_are_warned_about_or_refused():
    """clip-higher, the loss aggregation and the overlong penalty are spec fields (issue 38): extraArgs over
    them are warned about like any field's; the penalty without verl's dapo manager is refused."""
    extra = [
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
        "reward.reward_manager.name=dapo",
        "+reward.reward_kwargs.overlong_buffer_cfg={enable:true,len:16,penalty_factor:1.0,log:false}",
        "+reward.reward_kwargs.max_resp_len=2048",
    ]
    j = job(trainer={"extraArgs": extra})
    config, warnings = verl_config.compose_job(j, translate(j, POOL))
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.28  # composed all the same
    field = "set the field instead"
    assert warnings == [
        f"spec.trainer.extraArgs {extra[0]!r} replaces what spec.algorithm.clipRatio.high sets (0.2): "
        f"{field}",
        f"spec.trainer.extraArgs {extra[1]!r} replaces what spec.algorithm.lossAggregation sets "
        f"('token-mean'): {field}",
        f"spec.trainer.extraArgs {extra[3]!r} sets what spec.reward.overlongPenalty covers: {field}",
        f"spec.trainer.extraArgs {extra[4]!r} sets what spec.reward.overlongPenalty covers: {field}",
    ]
    j = job(
        reward={"preset": "math", "overlongPenalty": OVERLONG},
        trainer={"extraArgs": ["reward.reward_kwargs.overlong_buffer_cfg.len=64"]},
    )
    _, warnings = verl_config.compose_job(j, translate(j, POOL))
    assert warnings == [
        "spec.trainer.extraArgs 'reward.reward_kwargs.overlong_buffer_cfg.len=64' replaces what "
        "spec.reward.overlongPenalty sets (512): set the field instead"
    ]
    j = job(
        reward={"preset": "math", "overlongPenalty": OVERLONG},
        trainer={"extraArgs": ["reward.reward_manager.name=naive"]},
    )
    with pytest.raises(
        SpecError,
        match=r"^spec.reward.overlongPenalty needs verl's dapo reward manager, the "
        r"only one that applies it, and spec.trainer.extraArgs replaces it \(reward.reward_manager: "
        r"register naive\): drop that entry",
    ):
        verl_config.compose_job(j, translate(j, POOL))


def test_the_comparison_names_dapos_knobs_spec_fields(capsys, tmp_path):
    """--compare says where clip-higher, the loss aggregation and the overlong penalty come from: their spec
    fields."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                **SPEC,
                "algorithm": {
                    "totalEpochs": 1,
                    "clipRatio": {"high": 0.28},
                    "lossAggregation": "seq-mean-token-sum",
                },
                "reward": {"preset": "math", "overlongPenalty": OVERLONG},
            }
        )
    )
    recipe = (
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.clip_ratio_high=0.28 "
        "actor_rollout_ref.actor.loss_agg_mode=token-mean reward.reward_manager.name=dapo "
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=True "
        "+reward.reward_kwargs.overlong_buffer_cfg.len=512"
    )
    assert main(["run", "--dry-run", "--spec", str(manifest), "--compare", recipe]) == 0
    compare = capsys.readouterr().out.split("\n---\n")[-1]
    lines = {line.split(":")[0].strip(): line for line in compare.splitlines() if line.startswith("  ")}
    assert lines["actor_rollout_ref.actor.clip_ratio_high"].endswith("0.28 (spec.algorithm.clipRatio.high)")
    assert (
        '(spec.algorithm.lossAggregation) | "token-mean" (set)'
        in lines["actor_rollout_ref.actor.loss_agg_mode"]
    )
    assert lines["reward.reward_manager.name"].endswith(
        '"dapo" (spec.reward.overlongPenalty.enabled (verl\'s dapo reward manager))'
    )
    assert lines["reward.reward_kwargs.overlong_buffer_cfg.len"].endswith("512 (spec.reward.overlongPenalty)")


def test_with_the_overlong_penalty_a_reward_is_checked_as_verls_dapo_manager_calls_it(tmp_path):
    """verl's dapo reward manager (spec.reward.overlongPenalty) hands the function the row's extra_info alone:
    a function that reads num_turns passes the check with the default manager and fails it here, as it
    would fail in training."""
    data = gsm8k_data(tmp_path / "train.parquet")
    (tmp_path / "toolrl_custom_reward.py").write_text(VERL_REWARD)
    custom = {"configMap": "r", "function": "compute_score"}
    check_custom_reward(
        job(data={"trainFiles": [str(data)]}, reward={"preset": "custom", "custom": custom}), tmp_path
    )
    j = job(
        data={"trainFiles": [str(data)]},
        reward={"preset": "custom", "custom": custom, "overlongPenalty": OVERLONG},
    )
    with pytest.raises(
        TrainingError,
        match=r"KeyError: 'num_turns' .*verl's dapo reward manager, which "
        r"spec.reward.overlongPenalty uses, hands on the row's own extra_info alone",
    ):
        check_custom_reward(j, tmp_path)


@pytest.mark.parametrize("limit", [40, 2048])
def test_prompts_longer_than_the_jobs_prompt_length_are_a_warning_with_the_length_needed(
    tmp_path, capsys, tiny_model, limit
):
    """verl's agent loop keeps a longer prompt's last tokens and says so only in a worker's log: the
    system prompt that teaches the protocol (hermes: with the tools' schemas) is cut. The start-up check
    renders the first rows as the loop does, with the job's model, and says what length they need."""
    from transformers import AutoTokenizer

    data = gsm8k_data(tmp_path / "train.parquet")
    spec = {
        **SPEC,
        "model": {"path": str(tiny_model)},
        "data": {"trainFiles": [str(data)], "maxPromptLength": limit},
    }
    (tmp_path / "job.json").write_text(json.dumps({"metadata": {"name": "j"}, "spec": spec}))
    assert main(["run", "--spec", str(tmp_path / "job.json"), "--dry-run"]) == 0
    err = capsys.readouterr().err
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = list(read_rows(data)[0]["prompt"])
    schemas = tool_config(job(**spec), POOL)["tools"][0]["tool_schema"]
    text = tokenizer.apply_chat_template(prompt, tools=[schemas], add_generation_prompt=True, tokenize=False)
    needed = len(tokenizer.encode(text, add_special_tokens=False))
    assert (limit < needed) == (limit == 40), needed  # the small limit cuts, the large one does not
    if limit < needed:
        said = "warning: spec.data: 1 of the first 1 prompts are longer than the rollout's prompt length "
        said += f"(spec.data.maxPromptLength: {limit} tokens"
        assert said in err and f"the longest {needed})" in err and f"at least {needed}" in err, err
        assert "system prompt that teaches the tool-call protocol" in err, err
    else:
        assert (
            "check: prompts: the first rows of each training file fit the rollout's prompt length" in err
        ), err


def read_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
