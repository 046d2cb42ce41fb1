"""Multi-turn rollouts on the CPU with verl's real AgentLoopWorker, our tools against a real tool_sandbox
server process, a scripted LLM server and a tiny local model. One test per protocol."""

import json

import numpy as np
import pytest
from trainer_entry.hub import Sink, use_sink
from trainer_entry.metrics import TrainerMetrics
from trainer_entry.rewards import compute_score
from trainer_entry.run import write_tool_config, write_workdir
from trainer_entry.spec import parse_job
from trainer_entry.translate import agent_loop_name, tool_config, translate
from verl.protocol import DataProto
from verl.workers.rollout.replica import TokenOutput

from trainer_entry import verl_config

CALL = '<tool_call>\n{{"name": "python", "arguments": {{"code": "{code}"}}}}\n</tool_call>'
SCRIPTS = {
    "python-tags": {
        "multi": [
            "Compute.\n<PYTHON>\nprint(6 * 7)\n</PYTHON>",
            "<PYTHON>\nprint(1 / 0)\n</PYTHON>",
            "The answer is 42.\n#### 42",
        ],
        "timeout": ["<PYTHON>\nimport time\ntime.sleep(5)\n</PYTHON>", "#### 0"],
        "limit": ["<PYTHON>\nprint(1)\n</PYTHON>"] * 5,
    },
    "tool-tags": {
        "multi": ["<tool>print(6 * 7)</tool>", "<tool>print(1 / 0)</tool>", "#### 42"],
        "timeout": ["<tool>while True: pass</tool>", "#### 0"],
        "limit": ["<tool>print(1)</tool>"] * 5,
    },
    "react": {
        "multi": [
            'Thought: run it\nAction: python\nAction Input: {"code": "print(6 * 7)"}\n',
            'Action: python\nAction Input: {"code": "print(1 / 0)"}\n',
            'Action: Finish\nAction Input: {"return_type": "give_answer", "final_answer": "42"}',
        ],
        "timeout": [
            'Action: python\nAction Input: {"code": "import time; time.sleep(5)"}\n',
            'Action: calculator\nAction Input: {"x": 1}\n',
            "Final Answer: 0",
        ],
        "limit": ['Action: python\nAction Input: {"code": "print(1)"}\n'] * 5,
    },
    "hermes": {
        "multi": [CALL.format(code="print(6 * 7)"), CALL.format(code="print(1 / 0)"), "#### 42"],
        "timeout": [CALL.format(code="import time; time.sleep(5)"), "#### 0"],
        "limit": [CALL.format(code="print(1)")] * 5,
    },
}
MAX_TOOL_TURNS = 2


class ScriptedServer:
    """Stands in for vLLM: answers each trajectory from its script, honouring stop strings."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script
        self.turns: dict[str, int] = {}
        self.sampling_params = []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.sampling_params.append(sampling_params)
        prompt = self.tokenizer.decode(prompt_ids)
        case = next(c for c in self.script if f"case={c}" in prompt)
        turn = self.turns[request_id] = self.turns.get(request_id, -1) + 1
        text = self.script[case][turn]
        for stop in sampling_params.get("stop") or []:
            if stop in text:
                end = text.index(stop)
                text = (
                    text[: end + len(stop)]
                    if sampling_params.get("include_stop_str_in_output")
                    else text[:end]
                )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if "tool_call" not in text and (
            turn == len(self.script[case]) - 1 or not sampling_params.get("stop")
        ):
            ids = [*ids, self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def job_for(protocol, model, tools=None):
    return parse_job(
        {
            "metadata": {"name": "cpu-rollout", "namespace": "test"},
            "spec": {
                "model": {"path": str(model)},
                "data": {
                    "trainFiles": ["/data/train.parquet"],
                    "maxPromptLength": 1024,
                    "maxResponseLength": 1024,
                },
                "algorithm": {"rolloutsPerPrompt": 2, "trainBatchSize": 3, "totalEpochs": 1},
                "rollout": {
                    "protocol": protocol,
                    "maxToolTurns": MAX_TOOL_TURNS,
                    "maxToolResponseLength": 300,
                    "toolCall": {"timeoutSeconds": 10, "maxRetries": 1, "retryDelaySeconds": 0.1},
                },
                "tools": tools or [{"name": "python", "type": "python", "timeoutSeconds": 1}],
                "reward": {"preset": "exact-match"},
                "cluster": {"workers": {"replicas": 1, "gpusPerWorker": 1}},
            },
        }
    )


def segments(ids, mask, tokenizer):
    """Runs of equal mask value, decoded: [(mask, text), ...]."""
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            out.append((int(mask[start]), tokenizer.decode(ids[start:i], skip_special_tokens=True)))
            start = i
    return out


async def rollout(protocol, tiny_model, sandbox, tmp_path, monkeypatch):
    from verl.experimental.agent_loop import AgentLoopWorker

    job = job_for(protocol, tiny_model)
    translation = translate(job, sandbox)
    write_workdir(job, translation, tmp_path)
    write_tool_config(tmp_path, tool_config(job, sandbox))
    monkeypatch.chdir(tmp_path)  # the Ray working_dir of a real run
    config = verl_config.compose([*translation.overrides, "actor_rollout_ref.rollout.agent.num_workers=1"])
    verl_config.check(config)
    metrics = TrainerMetrics(trajectories_per_step=3)
    use_sink(Sink(local=metrics))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    server = ScriptedServer(tokenizer, SCRIPTS[protocol])
    worker = AgentLoopWorker(config, llm_client=server)
    cases = list(SCRIPTS[protocol])
    prompts = [
        [{"role": "system", "content": "Use the python tool."}, {"role": "user", "content": f"case={c}"}]
        for c in cases
    ]
    loop = agent_loop_name(protocol)
    n = len(cases)
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([*prompts, None], dtype=object)[
                :n
            ],  # None keeps numpy from making a 3-D array
            "agent_name": np.array([loop] * n, dtype=object),
            "data_source": np.array(["gsm8k"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": "42"}] * n, dtype=object),
            "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
            "tools_kwargs": np.array([{}] * n, dtype=object),
            "index": np.arange(n),
        }
    )
    output = await worker.generate_sequences(batch)
    response_len = output.batch["responses"].shape[1]
    result = {}
    for i, case in enumerate(cases):
        valid = output.batch["attention_mask"][i, -response_len:].bool()
        ids = output.batch["responses"][i][valid].tolist()
        mask = output.batch["response_mask"][i][valid].tolist()
        result[case] = segments(ids, mask, tokenizer)
    return result, server, metrics


def observations(segs):
    return [text for m, text in segs if m == 0]


def generated(segs):
    return "".join(text for m, text in segs if m == 1)


@pytest.mark.parametrize("protocol", ["python-tags", "tool-tags", "react", "hermes"])
async def test_multi_turn_rollout(protocol, tiny_model, sandbox, tmp_path, monkeypatch):
    result, server, metrics = await rollout(protocol, tiny_model, sandbox, tmp_path, monkeypatch)

    # multi: two real executions, the second one fails; the failure is an observation, masked out
    obs = observations(result["multi"])
    assert len(obs) == 2
    assert "42" in obs[0]
    assert "ZeroDivisionError" in obs[1]
    assert "6 * 7" in generated(result["multi"]) and "42" in generated(result["multi"]).splitlines()[-1]
    assert all("Traceback" not in text for m, text in result["multi"] if m == 1)

    # timeout: the sandbox kills the call, the model reads that it timed out, the rollout goes on
    obs = observations(result["timeout"])
    assert "timed out" in obs[0]
    if protocol == "react":
        assert "unknown tool 'calculator'" in obs[1]

    # limit: the model keeps calling, the loop stops after maxToolTurns executions
    assert len(observations(result["limit"])) == MAX_TOOL_TURNS

    outcomes = {
        (s.labels["tool"], s.labels["outcome"]): s.value
        for s in metrics.tool_duration.collect()[0].samples
        if s.name.endswith("_count")
    }
    assert outcomes[("python", "timeout")] >= 1 and outcomes[("python", "error")] >= 1
    if protocol != "hermes":
        assert all(p["stop"] for p in server.sampling_params)
        if protocol == "python-tags":
            expected = {"multi": [1, 0, 1, 0, 1], "timeout": [1, 0, 1], "limit": [1, 0, 1, 0, 1]}
            assert {c: [m for m, _ in s] for c, s in result.items()} == expected
            assert result["multi"][1][1] == "\n<PYTHON-OUTPUT>\n42\n\n</PYTHON-OUTPUT>\n"


async def test_rollout_scored_by_our_rewards(tiny_model, sandbox, tmp_path, monkeypatch):
    result, _, _ = await rollout("python-tags", tiny_model, sandbox, tmp_path, monkeypatch)
    text = "".join(t for _, t in result["multi"])
    assert (await compute_score("gsm8k", text, "42", {}, preset="exact-match"))["score"] == 1.0
    code = await compute_score(
        "gsm8k",
        "```python\nprint(6 * 7)\n```",
        "42",
        {},
        preset="code-execution",
        pool_url=sandbox,
        tool="python",
    )
    assert code == {"score": 1.0, "has_code": 1.0, "ran": 1.0, "passed": 1.0}
    tests = {"tests": "assert add(2, 3) == 6"}
    failed = await compute_score(
        "x",
        "```python\ndef add(a, b):\n    return a + b\n```",
        tests,
        {},
        preset="code-execution",
        pool_url=sandbox,
        tool="python",
    )
    assert failed == {"score": 0.0, "has_code": 1.0, "ran": 0.0, "passed": 0.0}
    assert json.dumps(failed)


# ---- issue 16: an infrastructure failure keeps the trajectory out; the model's own error does not --


async def one_trajectory(
    case,
    script,
    pool_url,
    tiny_model,
    tmp_path,
    monkeypatch,
    protocol="python-tags",
    server_cls=None,
    tools=None,
    tools_kwargs=None,
):
    """Our agent loop's run of one trajectory, built as verl's worker builds it."""
    import hydra
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import AgentLoopWorker
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    job = job_for(protocol, tiny_model, tools)
    translation = translate(job, pool_url)
    write_workdir(job, translation, tmp_path)
    write_tool_config(tmp_path, tool_config(job, pool_url))
    monkeypatch.chdir(tmp_path)
    config = verl_config.compose([*translation.overrides, "actor_rollout_ref.rollout.agent.num_workers=1"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    server = (server_cls or ScriptedServer)(tokenizer, {case: script})
    worker = AgentLoopWorker(config, llm_client=server)
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry[agent_loop_name(protocol)],
        trainer_config=DictConfigWrap(config=worker.config),
        server_manager=server,
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(worker.config.data),
        tools=ToolListWrap(worker.tools),
    )
    prompt = [{"role": "user", "content": f"case={case}"}]
    return await loop.run(
        {"temperature": 1.0, "logprobs": True}, raw_prompt=prompt, tools_kwargs=tools_kwargs or {}
    )


@pytest.mark.parametrize(
    ("protocol", "call"),
    [("python-tags", "<PYTHON>\nprint(6 * 7)\n</PYTHON>"), ("hermes", CALL.format(code="print(6 * 7)"))],
)
async def test_infrastructure_failure_excludes_the_trajectory(
    protocol, call, tiny_model, tmp_path, monkeypatch
):
    """hermes is verl's own tool_agent loop with our exclusion (agent_loop.HermesAgentLoop): before it, the
    failed call was an `Error:` observation and the trajectory was scored like any other."""
    from harness.localcluster import free_port

    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    dead_pool = f"http://127.0.0.1:{free_port()}"  # connection refused on every attempt
    script = [call, "#### 42"]
    out = await one_trajectory("down", script, dead_pool, tiny_model, tmp_path, monkeypatch, protocol)
    assert out == []  # verl's TQ worker neither scores nor stores an empty output
    samples = metrics.trajectories_excluded.collect()[0].samples
    excluded = {s.labels["reason"]: s.value for s in samples if s.name.endswith("_total")}
    assert excluded == {"unreachable": 1.0}


@pytest.mark.parametrize(
    ("protocol", "call"),
    [("python-tags", "<PYTHON>\nprint(1 / 0)\n</PYTHON>"), ("hermes", CALL.format(code="print(1 / 0)"))],
)
async def test_the_models_own_error_is_kept_and_scored(
    protocol, call, tiny_model, sandbox, tmp_path, monkeypatch
):
    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    script = [call, "#### 0"]
    out = await one_trajectory("raises", script, sandbox, tiny_model, tmp_path, monkeypatch, protocol)
    assert out.extra_fields["tool_outcomes"] == ["error"] and out.extra_fields["tool_faults"] == ["code"]
    assert not list(metrics.trajectories_excluded.collect()[0].samples)
    text = tiny_model_text(out, tiny_model)
    assert "ZeroDivisionError" in text
    scored = await compute_score("gsm8k", text, "42", {}, preset="exact-match")
    assert scored["score"] == 0.0  # the reward's verdict on a wrong answer, not an exclusion


def tiny_model_text(out, model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model).decode(out.response_ids, skip_special_tokens=True)


async def test_the_code_execution_reward_is_not_computed_when_the_pool_fails():
    """Its own pool call: an infrastructure failure is no score at all (verl then evicts and regenerates
    the trajectory's group), never 0; the model's own failures are still scored 0."""
    from harness.localcluster import free_port
    from trainer_entry.rewards import PoolUnavailable

    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    dead_pool = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PoolUnavailable, match=r"not computed: .*\(unreachable: .*not scored 0"):
        await compute_score(
            "x",
            "```python\nprint(42)\n```",
            "42",
            {},
            preset="code-execution",
            pool_url=dead_pool,
            tool="python",
        )
    samples = metrics.trajectories_excluded.collect()[0].samples
    assert {s.labels["reason"]: s.value for s in samples if s.name.endswith("_total")} == {"unreachable": 1.0}


@pytest.mark.parametrize("code", ["raise ValueError('no')", "import sys; sys.exit(3)", "print(41)"])
async def test_the_code_execution_reward_scores_the_models_own_failures(code, sandbox):
    metrics = TrainerMetrics()
    use_sink(Sink(local=metrics))
    solution = f"```python\n{code}\n```"
    scored = await compute_score(
        "x", solution, "42", {}, preset="code-execution", pool_url=sandbox, tool="python"
    )
    assert scored["score"] == 0.0 and scored["has_code"] == 1.0
    assert not list(metrics.trajectories_excluded.collect()[0].samples)


# ---- issue 23 (7): the job's protocol chooses the agent loop, whatever the data's rows name ------


async def test_the_jobs_protocol_runs_even_when_the_rows_name_another_loop(
    tiny_model, sandbox, tmp_path, monkeypatch
):
    """Rows that name an agent loop (`agent_name`, as other preparation scripts write it) are rolled out
    with the job's protocol: verl would run the row's loop (python-tags here), which does not parse the
    hermes call the policy makes, and no tool would run."""
    from trainer_entry.data import write_parquet
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class

    data = tmp_path / "data" / "train.parquet"
    row = {
        "data_source": "gsm8k",
        "prompt": [{"role": "user", "content": "case=multi"}],
        "reward_model": {"style": "rule", "ground_truth": "42"},
        "extra_info": {"index": 0},
        "agent_name": agent_loop_name("python-tags"),
    }
    write_parquet([row], data)
    job = job_for("hermes", tiny_model)
    job.spec["data"]["trainFiles"] = [str(data)]
    translation = translate(job, sandbox)
    workdir = tmp_path / "workdir"
    write_workdir(job, translation, workdir)
    write_tool_config(workdir, tool_config(job, sandbox))
    monkeypatch.chdir(workdir)
    config = verl_config.compose([*translation.overrides, "actor_rollout_ref.rollout.agent.num_workers=1"])
    use_sink(Sink(local=TrainerMetrics(trajectories_per_step=1)))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    dataset = get_dataset_class(config.data)([str(data)], tokenizer, config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[0]]))
    worker = AgentLoopWorker(
        config, llm_client=ScriptedServer(tokenizer, {"multi": SCRIPTS["hermes"]["multi"]})
    )
    output = await worker.generate_sequences(batch)
    response_len = output.batch["responses"].shape[1]
    valid = output.batch["attention_mask"][0, -response_len:].bool()
    segs = segments(
        output.batch["responses"][0][valid].tolist(),
        output.batch["response_mask"][0][valid].tolist(),
        tokenizer,
    )
    obs = observations(segs)
    assert len(obs) == 2, f"the hermes calls did not run (was the row's loop used?): {segs}"
    assert "42" in obs[0] and "ZeroDivisionError" in obs[1]


# ---- issue 23 (8): a stop string's tokens are neither trained nor repeated in the context -----------


class VllmLikeServer(ScriptedServer):
    """Generates as vLLM does with stop strings: token by token until the text holds one, returning
    every sampled token (vLLM trims the stop string from the text only, and verl passes the ids on)."""

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        case = next(c for c in self.script if f"case={c}" in self.tokenizer.decode(prompt_ids))
        turn = self.turns[request_id] = self.turns.get(request_id, -1) + 1
        sampled = []
        for token in self.tokenizer.encode(self.script[case][turn], add_special_tokens=False):
            sampled.append(token)
            if any(stop in self.tokenizer.decode(sampled) for stop in sampling_params.get("stop") or []):
                break
        else:
            sampled.append(self.tokenizer.eos_token_id)
        return TokenOutput(token_ids=sampled, log_probs=[-0.5] * len(sampled))


async def test_react_trains_no_stop_string_and_shows_each_observation_once(
    sandbox, tiny_model, tmp_path, monkeypatch
):
    from transformers import AutoTokenizer

    use_sink(Sink(local=TrainerMetrics()))
    script = [
        'Thought: run it\nAction: python\nAction Input: {"code": "print(6 * 7)"}\nObservation: 41\nThought',
        'Action: Finish\nAction Input: {"return_type": "give_answer", "final_answer": "42"}',
    ]
    out = await one_trajectory(
        "react", script, sandbox, tiny_model, tmp_path, monkeypatch, "react", VllmLikeServer
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids, mask, logprobs = out.response_ids, out.response_mask, out.response_logprobs
    context = tokenizer.decode(ids, skip_special_tokens=True)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=True)
    assert context.count("Observation:") == 1, context
    assert '{"code": "print(6 * 7)"}\nObservation: 42\n' in context and "41" not in context
    assert "Observation" not in trained, trained
    assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == [-0.5] * sum(mask)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)


# ---- per-sample tool values: verl's GSM8K tool, whose reward needs the row's ground truth ----------

GSM8K_CALLS = {
    "hermes": '<tool_call>\n{{"name": "calc_gsm8k_reward", "arguments": {arguments}}}\n</tool_call>',
    "react": "Action: calc_gsm8k_reward\nAction Input: {arguments}\n",
}


@pytest.mark.parametrize("protocol", ["hermes", "react"])
async def test_a_function_tool_scores_against_the_rows_ground_truth_which_the_model_cannot_give(
    protocol, tiny_model, sandbox, gsm8k_tool, tmp_path, monkeypatch
):
    """The row's `tools_kwargs` (verl's data format) reach the function's keyword-only parameter through
    both loops (verl's tool_agent for hermes, ours for react); the model's own `ground_truth` is refused."""
    use_sink(Sink(local=TrainerMetrics()))
    tools = [gsm8k_tool]
    finish = "#### 72" if protocol == "hermes" else "Final Answer: 72"
    for truth, forged, said in [
        ("72", False, "reward=1.0"),
        ("71", False, "reward=0.0"),
        ("72", True, "ground_truth is not an argument of this tool"),
    ]:
        arguments = {"answer": "72", **({"ground_truth": "72"} if forged else {})}
        script = [GSM8K_CALLS[protocol].format(arguments=json.dumps(arguments)), finish]
        row = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": truth}}}
        out = await one_trajectory(
            f"{truth}{forged}",
            script,
            sandbox,
            tiny_model,
            tmp_path,
            monkeypatch,
            protocol,
            tools=tools,
            tools_kwargs=row,
        )
        assert out.extra_fields["tool_faults"] == (["code"] if forged else [None]), out.extra_fields
        text = tiny_model_text(out, tiny_model)
        assert said in text, text
        if forged:
            assert "reward=1.0" not in text, text
