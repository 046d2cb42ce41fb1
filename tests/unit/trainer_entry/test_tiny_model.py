"""The tiny model: heads vLLM's CPU attention takes, and a warm-up on the job's own prompts, protocol and
tools (issue 23): what it teaches is a call the job's agent loop executes."""

import json
from pathlib import Path

import pytest
from trainer_entry.__main__ import main
from trainer_entry.data import prepare
from trainer_entry.protocols import get_protocol
from transformers import AutoConfig, AutoTokenizer

from trainer_entry import tiny_model as tm

SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gsm8k" / "sample.jsonl"
# vLLM 0.24.0's CPU attention backend (v1/attention/backends/cpu_attn.py) takes these head sizes
VLLM_CPU_HEAD_SIZES = range(32, 513)


@pytest.mark.parametrize("hidden", [32, 64])
def test_heads_are_a_size_vllms_cpu_attention_takes(tmp_path, hidden):
    config = AutoConfig.from_pretrained(tm.build_tiny_model(tmp_path, hidden=hidden))
    head_size = config.hidden_size // config.num_attention_heads
    assert head_size in VLLM_CPU_HEAD_SIZES
    assert config.num_attention_heads % config.num_key_value_heads == 0


def job_data(tmp_path, protocol, tool="python"):
    prepare(
        "gsm8k",
        [SAMPLE],
        tmp_path,
        split=False,
        train_ratio=1.0,
        max_samples=64,
        seed=0,
        tool=tool,
        protocol=protocol,
    )
    return tm.job_prompts(tmp_path / "train.parquet")


@pytest.mark.parametrize("protocol", ["python-tags", "tool-tags", "react", "hermes"])
async def test_the_taught_call_is_one_the_jobs_loop_runs(tmp_path, tiny_model, protocol):
    """On the job's prompt (its system prompt, its question) and with the job's tool name."""
    tools = [{"name": "run_code", "type": "python"}]
    prompts = job_data(tmp_path, protocol, tool="run_code")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    episode = tm.episode_for(protocol, tools)
    parts = episode.parts(tokenizer, prompts[0], tools)
    assert prompts[0].messages[1]["content"] in parts[0][0] and not parts[0][1]
    call, observation, answer = parts[1][0], parts[2][0], parts[3][0]
    assert [learn for _, learn in parts] == [False, True, False, True]
    assert answer == f"#### {prompts[0].answer}{tokenizer.eos_token}"
    assert episode.calls(call)
    if protocol == "hermes":
        from verl.experimental.agent_loop.tool_parser import ToolParser

        parser = ToolParser.get_tool_parser("hermes", tokenizer)
        _, calls = await parser.extract_tool_calls(tokenizer.encode(call, add_special_tokens=False))
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("run_code", {"code": f"print({prompts[0].answer!r})"})
        ]
        assert "<tool_response>" in observation and '"name": "run_code"' in parts[0][0]  # schema shown
    else:
        parsed = get_protocol(protocol).parse(call, "run_code")
        assert (parsed.name, parsed.arguments) == ("run_code", {"code": f"print({prompts[0].answer!r})"})
        assert observation == get_protocol(protocol).observation(f"{prompts[0].answer}\n")


def test_a_job_without_a_python_tool_is_taught_to_call_its_own(tmp_path):
    tools = [{"name": "lookup", "type": "search", "corpus": "/data/c.jsonl"}]
    episode = tm.episode_for("react", tools)
    assert episode.tool["name"] == "lookup"
    with pytest.raises(
        ValueError, match="protocol python-tags runs code: the job needs a tool of type python"
    ):
        tm.episode_for("python-tags", tools)


def test_a_protocol_other_than_the_jobs_is_refused(tmp_path, capsys):
    job = tmp_path / "job.json"
    spec = {
        "model": {"path": "m"},
        "data": {"trainFiles": [str(tmp_path / "train.parquet")]},
        "algorithm": {"totalEpochs": 1},
        "rollout": {"protocol": "hermes"},
        "tools": [{"name": "python", "type": "python"}],
    }
    job.write_text(json.dumps({"metadata": {"name": "j"}, "spec": spec}))
    assert main(["tiny-model", str(tmp_path / "m"), "--spec", str(job), "--protocol", "react"]) == 2
    assert "--protocol react is not the job's spec.rollout.protocol hermes" in capsys.readouterr().err
    assert main(["tiny-model", str(tmp_path / "m"), "--spec", str(job)]) == 2
    assert "train.parquet: no training prompts to warm up on" in capsys.readouterr().err


def test_a_hermes_job_with_a_function_tool_is_taught_to_call_the_function(tmp_path):
    """A smoke run calls the user's function: hermes and react calls go to the job's function tool
    (before its python tool), with arguments from its schema; tag protocols keep running code."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "unit": {"type": "string", "enum": ["cm", "m"]}},
        "required": ["n", "unit"],
    }
    tools = [{"name": "python", "type": "python"}, {"name": "echo", "type": "function", "parameters": schema}]
    assert tm.episode_for("python-tags", tools).tool["name"] == "python"
    episode = tm.episode_for("hermes", tools)
    assert episode.tool["name"] == "echo"
    (prompt,) = tm.toy_prompts(1, "hermes", tool="echo")
    arguments, output = episode.call_arguments(prompt)
    assert arguments == {"n": int(prompt.answer), "unit": "cm"} and isinstance(arguments["n"], int)
    assert output == prompt.answer  # what a function that answers with its argument prints
    numbers = {"type": "object", "properties": {"x": {"type": "number"}, "k": {"type": "integer"}}}
    assert tm.function_arguments(numbers, "12") == {"x": 12, "k": 12}
    assert tm.function_arguments(numbers, "2.5") == {"x": 2.5, "k": 2}
    assert tm.function_arguments(
        {"type": "object", "properties": {"s": {"type": ["null", "string"]}}}, "7"
    ) == {"s": "7"}
    tokenizer = tm.build_tokenizer()
    call = episode.parts(tokenizer, prompt, tools)[1][0]
    assert episode.calls(call) and '"name": "echo"' in call, call


def test_the_warm_up_samples_as_the_jobs_training_composes_it(tmp_path):
    """The job's group size, lengths and sampling, read from the verl config its training composes:
    `extraArgs` included, and transformers' own top-k default (50) turned off as verl's -1 means."""
    spec = {
        "model": {"path": "m"},
        "data": {"trainFiles": ["t.parquet"], "maxPromptLength": 300, "maxResponseLength": 40},
        "algorithm": {"totalTrainingSteps": 2, "rolloutsPerPrompt": 6},
        "rollout": {"protocol": "hermes"},
        "tools": [{"name": "python", "type": "python"}],
        "reward": {"preset": "exact-match"},
        "cluster": {"workers": {"replicas": 1, "gpusPerWorker": 0}},
        "trainer": {"extraArgs": ["actor_rollout_ref.rollout.temperature=0.7"]},
    }
    from trainer_entry.spec import parse_job

    sampling = tm.Sampling.of_job(parse_job({"metadata": {"name": "j", "namespace": "d"}, "spec": spec}))
    assert (sampling.rollouts, sampling.max_new_tokens, sampling.max_prompt_tokens) == (6, 40, 300)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 1.0, -1)
    assert sampling.generate_kwargs() == {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "num_return_sequences": 6,
    }
    greedy = tm.Sampling(rollouts=6, max_new_tokens=8, max_prompt_tokens=8, temperature=0.0)
    assert greedy.generate_kwargs() == {"do_sample": False, "num_return_sequences": 1}


def test_a_prompt_longer_than_the_jobs_is_cut_as_training_cuts_it(tiny_model):
    """verl's agent loop keeps a long prompt's last tokens: the warm-up's measurement does the same and
    says how many prompts lose their start (the system prompt that teaches the protocol)."""
    from transformers import AutoModelForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tools = [tm.TOY_TOOL]
    episode = tm.episode_for("python-tags", tools)
    prompts = tm.toy_prompts(4, "python-tags")
    length = len(
        tokenizer.encode(episode.parts(tokenizer, prompts[0], tools)[0][0], add_special_tokens=False)
    )
    cut = tm.Sampling(rollouts=2, max_new_tokens=4, max_prompt_tokens=length - 1)
    seen = tm._sampled_behaviour(model, tokenizer, episode, prompts, tools, cut)
    assert seen.prompts_cut == 1.0 and seen.group_rate is not None
    whole = tm.Sampling(rollouts=2, max_new_tokens=4, max_prompt_tokens=length + 64)
    assert tm._sampled_behaviour(model, tokenizer, episode, prompts, tools, whole).prompts_cut == 0.0
    message = tm.cut_prompts_message(1.0, cut)
    assert f"spec.data.maxPromptLength ({length - 1} tokens)" in message and "system prompt" in message
