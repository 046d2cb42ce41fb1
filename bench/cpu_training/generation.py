"""Generation alone, each CPU engine on the same requests: what a training step asks of it.

In a training run the step's generation time is what verl's replay buffer observes, polling every
2 s, so on the toy job both engines show the same 2.0 s: this measures the engines themselves. The
request stream is one step's: every prompt of a batch `rollouts` times at once, sampled at
temperature 1 with log-probs, up to the response length, stopping at the protocol's closing tag.
- `hf`: trainer_entry's `HFRolloutServer` (transformers, one sequence at a time), built from the
  job's own verl config as its Ray actor builds it.
- `vllm`: vLLM's CPU build (`AsyncLLM`) with the engine settings verl's vLLM server passes for the
  job (dtype, seed, the CPU overrides), the same prompts as token ids.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

ROUNDS = 4  # after one warm-up round


def _requests(model: Path, data: Path, prompts: int, rollouts: int) -> list[list[int]]:
    import pandas as pd
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = pd.read_parquet(data).head(prompts)
    texts = [
        tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=False)
        for _, row in rows.iterrows()
    ]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    return [list(i) for i in ids for _ in range(rollouts)]


def _verl_config(job: dict[str, Any]) -> Any:
    from trainer_entry.spec import parse_job
    from trainer_entry.translate import translate

    from trainer_entry import verl_config

    return verl_config.compose(translate(parse_job(job), "http://127.0.0.1:1").overrides)


async def _rounds(generate_batch) -> tuple[list[float], int]:
    await generate_batch()  # warm-up
    rates, tokens = [], 0
    for _ in range(ROUNDS):
        started = time.monotonic()
        tokens = await generate_batch()
        rates.append(tokens / (time.monotonic() - started))
    return rates, tokens


def hf(job: dict[str, Any], requests: list[list[int]], stop: list[str]) -> dict[str, Any]:
    from trainer_entry.hf_rollout import HFRolloutServer
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _verl_config(job)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    started = time.monotonic()
    server = HFRolloutServer(rollout, cfg.actor_rollout_ref.model, replica_rank=0)
    ready = time.monotonic() - started
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "stop": stop}

    async def batch() -> int:
        outs = await asyncio.gather(
            *(server.generate(ids, dict(params), request_id=str(i)) for i, ids in enumerate(requests))
        )
        return sum(len(o.token_ids) for o in outs)

    rates, tokens = asyncio.run(_rounds(batch))
    return _result(ready, rates, tokens, len(requests))


def vllm(job: dict[str, Any], requests: list[list[int]], stop: list[str]) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    cfg = _verl_config(job)
    rollout = cfg.actor_rollout_ref.rollout
    started = time.monotonic()
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(job["spec"]["model"]["path"]),
            dtype=rollout.dtype,
            seed=rollout.seed,
            enable_prefix_caching=rollout.enable_prefix_caching,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            max_num_seqs=rollout.max_num_seqs,
            enforce_eager=rollout.enforce_eager,
            **dict(rollout.engine_kwargs.vllm),
        )
    )
    ready = time.monotonic() - started
    sampling = SamplingParams(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        logprobs=0,
        stop=stop,
        include_stop_str_in_output=True,
        max_tokens=job["spec"]["data"]["maxResponseLength"],
    )

    async def one(ids: list[int], request_id: str) -> int:
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), sampling, request_id):
            final = out
        return len(final.outputs[0].token_ids)

    counter = iter(range(10**9))

    async def batch() -> int:
        return sum(await asyncio.gather(*(one(ids, f"r{next(counter)}") for ids in requests)))

    try:
        rates, tokens = asyncio.run(_rounds(batch))
    finally:
        engine.shutdown()
    return _result(ready, rates, tokens, len(requests))


def _result(ready: float, rates: list[float], tokens: int, sequences: int) -> dict[str, Any]:
    return {
        "engine_start_s": round(ready, 1),
        "sequences_per_batch": sequences,
        "tokens_per_batch": tokens,
        "tokens_per_s_median": round(statistics.median(rates), 1),
        "tokens_per_s_rounds": [round(r, 1) for r in rates],
    }


def measure(
    job: dict[str, Any], model: Path, data: Path, stop: list[str], engines: list[str]
) -> dict[str, dict[str, Any]]:
    """{engine: its generation measures}, each engine on the same step's requests."""
    algo = job["spec"]["algorithm"]
    requests = _requests(model, data, algo["trainBatchSize"], algo["rolloutsPerPrompt"])
    return {engine: globals()[engine](job, requests, stop) for engine in engines}
