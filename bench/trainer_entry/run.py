"""trainer_entry benchmark (CPU, loopback only, bounded).

1. Tool-client overhead: our PoolClient (semaphore, retries, parsing, metrics) against a direct aiohttp
   POST, both at concurrency 256 against the same trivial local server; client CPU time and wall time per
   call.
2. Rollout wall time: 512 scripted trajectories x 3 tool turns against a real tool_sandbox server.
   "async": verl's AgentLoopWorker running our python-tags agent loop, every trajectory on its own.
   "batch-sync": the scheme of older tool rollouts, every turn waits for all generations and then for all
   tool calls of that turn. Same generation delays, same tool code, same client.

    .venv/bin/python bench/trainer_entry/run.py [--calls 10000] [--trajectories 512] [--out result.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from harness.localcluster import free_port
from harness.sandbox_process import SandboxProcess
from trainer_entry.hub import Sink, use_sink
from trainer_entry.metrics import TrainerMetrics
from trainer_entry.pool_client import PoolClient
from trainer_entry.tiny_model import build_tiny_model

CONCURRENCY = 256
STUB = """
from aiohttp import web
BODY = {"status": "ok", "output": "2\\n", "stdout": "2\\n", "stderr": "", "exitCode": 0,
        "durationSeconds": 0.0, "truncated": False}
async def execute(request):
    await request.read()
    return web.json_response(BODY)
app = web.Application()
app.router.add_post("/v1/execute", execute)
web.run_app(app, host="127.0.0.1", port=int(__import__("sys").argv[1]), print=None, access_log=None)
"""


async def _workers(calls: int, one) -> tuple[float, float]:
    per_worker = calls // CONCURRENCY

    async def worker():
        for _ in range(per_worker):
            await one()

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - wall, time.process_time() - cpu


async def client_overhead(url: str, calls: int, rounds: int) -> dict:
    body = {"tool": "python", "input": {"code": "print(1+1)"}}
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "ours": []}
    use_sink(Sink(local=TrainerMetrics()))
    for _ in range(rounds):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:

            async def direct():
                async with session.post(url + "/v1/execute", json=body) as resp:
                    await resp.json()

            await _workers(CONCURRENCY, direct)  # warm the connections
            results["direct"].append(await _workers(calls, direct))
        from trainer_entry.hub import sink

        client = PoolClient(url, max_concurrency=CONCURRENCY, record=sink().tool_call)

        async def ours(client=client):
            result = await client.execute("python", body["input"])
            assert result.ok, result

        await _workers(CONCURRENCY, ours)
        results["ours"].append(await _workers(calls, ours))
        await client.close()
    n = (calls // CONCURRENCY) * CONCURRENCY
    out = {}
    for name, runs in results.items():
        out[name] = {
            "wall_us_per_call": statistics.median(w for w, _ in runs) / n * 1e6,
            "cpu_us_per_call": statistics.median(c for _, c in runs) / n * 1e6,
        }
    out["overhead_cpu_us_per_call"] = out["ours"]["cpu_us_per_call"] - out["direct"]["cpu_us_per_call"]
    out["overhead_wall_us_per_call"] = out["ours"]["wall_us_per_call"] - out["direct"]["wall_us_per_call"]
    out["calls_per_round"], out["rounds"], out["concurrency"] = n, rounds, CONCURRENCY
    return out


TOOL_TURNS = 3


def plan(trajectories: int, seed: int = 7) -> tuple[list[list[float]], list[list[float]]]:
    """Per trajectory: generation delays (4 turns, heavy-tailed) and tool sleep times (3 calls)."""
    rng = random.Random(seed)
    gen = [
        [min(3.0, 0.1 + rng.lognormvariate(-1.2, 0.8)) for _ in range(TOOL_TURNS + 1)]
        for _ in range(trajectories)
    ]
    tool = [[rng.uniform(0.01, 0.3) for _ in range(TOOL_TURNS)] for _ in range(trajectories)]
    return gen, tool


def turn_text(traj: int, turn: int, tool: list[list[float]]) -> str:
    if turn < TOOL_TURNS:
        return (
            f"<PYTHON>\nimport time\ntime.sleep({tool[traj][turn]:.3f})\nprint({traj * 10 + turn})\n</PYTHON>"
        )
    return "#### 42"


class DelayedServer:
    """Scripted LLM: trajectory i's turn t takes gen[i][t] seconds."""

    def __init__(self, tokenizer, gen, tool):
        self.tokenizer, self.gen, self.tool = tokenizer, gen, tool
        self.turns: dict[str, int] = {}
        self.traj: dict[str, int] = {}

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        if request_id not in self.traj:
            text = self.tokenizer.decode(prompt_ids)
            self.traj[request_id] = int(text.rsplit("traj=", 1)[1].split("<", 1)[0])
        traj = self.traj[request_id]
        turn = self.turns[request_id] = self.turns.get(request_id, -1) + 1
        await asyncio.sleep(self.gen[traj][turn])
        ids = self.tokenizer.encode(turn_text(traj, turn, self.tool), add_special_tokens=False)
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def verl_worker(model: Path, pool_url: str, workdir: Path):
    from trainer_entry.run import write_tool_config, write_workdir
    from trainer_entry.spec import parse_job
    from trainer_entry.translate import tool_config, translate
    from verl.experimental.agent_loop import AgentLoopWorker

    from trainer_entry import verl_config

    job = parse_job(
        {
            "metadata": {"name": "bench"},
            "spec": {
                "model": {"path": str(model)},
                "data": {
                    "trainFiles": ["/data/t.parquet"],
                    "maxPromptLength": 256,
                    "maxResponseLength": 1024,
                },
                "algorithm": {"totalEpochs": 1},
                "rollout": {
                    "protocol": "python-tags",
                    "maxToolTurns": TOOL_TURNS,
                    "toolCall": {
                        "timeoutSeconds": 30,
                        "maxRetries": 5,
                        "retryDelaySeconds": 0.2,
                        "maxConcurrency": CONCURRENCY,
                    },
                },
                "tools": [{"name": "python", "type": "python", "timeoutSeconds": 10}],
                "reward": {"preset": "exact-match"},
            },
        }
    )
    translation = translate(job, pool_url)
    write_workdir(job, translation, workdir)
    write_tool_config(workdir, tool_config(job, pool_url))
    import os

    os.chdir(workdir)
    config = verl_config.compose([*translation.overrides, "actor_rollout_ref.rollout.agent.num_workers=1"])
    return config, AgentLoopWorker


async def rollout_async(config, worker_cls, tokenizer, gen, tool) -> float:
    import numpy as np
    from verl.protocol import DataProto

    n = len(gen)
    worker = worker_cls(config, llm_client=DelayedServer(tokenizer, gen, tool))
    prompts = [[{"role": "user", "content": f"traj={i}"}] for i in range(n)]
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([*prompts, None], dtype=object)[:n],
            "agent_name": np.array(["toolrl_python_tags"] * n, dtype=object),
            "tools_kwargs": np.array([{}] * n, dtype=object),
            "index": np.arange(n),
        }
    )
    start = time.perf_counter()
    out = await worker.generate_sequences(batch)
    elapsed = time.perf_counter() - start
    observed = int((out.batch["response_mask"] == 0).any(dim=1).sum())
    assert observed == n, f"only {observed}/{n} trajectories got tool output"
    return elapsed


async def rollout_batch_sync(pool_url: str, tokenizer, gen, tool) -> float:
    from trainer_entry.protocols import get_protocol

    protocol = get_protocol("python-tags")
    client = PoolClient(pool_url, max_concurrency=CONCURRENCY, max_retries=5, retry_delay_seconds=0.2)
    n = len(gen)

    async def generate(i, turn):
        await asyncio.sleep(gen[i][turn])
        ids = tokenizer.encode(turn_text(i, turn, tool), add_special_tokens=False)
        return tokenizer.decode(ids)

    async def call(text):
        parsed = protocol.parse(text, "python")
        result = await client.execute("python", parsed.arguments, timeout_seconds=10)
        return tokenizer.encode(protocol.observation(result.observation()), add_special_tokens=False)

    start = time.perf_counter()
    for turn in range(TOOL_TURNS + 1):
        texts = await asyncio.gather(*(generate(i, turn) for i in range(n)))
        if turn < TOOL_TURNS:
            await asyncio.gather(*(call(t) for t in texts))
    elapsed = time.perf_counter() - start
    await client.close()
    return elapsed


SANDBOX_TOOLS = [{"name": "python", "type": "python", "timeoutSeconds": 10, "memoryLimitMiB": 256}]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=10240)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trajectories", type=int, default=512)
    results = Path(__file__).resolve().parents[1] / "results"
    parser.add_argument("--out", type=Path, default=results / "trainer_entry.json")
    args = parser.parse_args()
    result: dict = {}
    root = Path(tempfile.mkdtemp(prefix="bench-trainer-entry-"))

    port = free_port()
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(port)])
    try:
        time.sleep(2)
        result["client_overhead"] = asyncio.run(
            client_overhead(f"http://127.0.0.1:{port}", args.calls, args.rounds)
        )
    finally:
        stub.terminate()
        stub.wait()
    print(json.dumps(result, indent=2), flush=True)

    from transformers import AutoTokenizer

    model = build_tiny_model(root)
    tokenizer = AutoTokenizer.from_pretrained(model)
    gen, tool = plan(args.trajectories)
    flags = ("--capacity", "64", "--queue-size", "4096")
    with SandboxProcess.start(root / "sandbox", *flags, tools=SANDBOX_TOOLS) as sandbox:
        url = sandbox.url
        config, worker_cls = verl_worker(model, url, root / "work")
        sync_s = asyncio.run(rollout_batch_sync(url, tokenizer, gen, tool))
        async_s = asyncio.run(rollout_async(config, worker_cls, tokenizer, gen, tool))
    ideal_async = max(sum(g) + sum(t) for g, t in zip(gen, tool, strict=True))
    ideal_sync = sum(max(g[k] for g in gen) for k in range(TOOL_TURNS + 1)) + sum(
        max(t[k] for t in tool) for k in range(TOOL_TURNS)
    )
    result["rollout"] = {
        "trajectories": args.trajectories,
        "tool_turns": TOOL_TURNS,
        "tool_calls": args.trajectories * TOOL_TURNS,
        "async_seconds": async_s,
        "batch_sync_seconds": sync_s,
        "speedup": sync_s / async_s,
        "lower_bound_async_seconds": ideal_async,
        "lower_bound_batch_sync_seconds": ideal_sync,
        "sandbox_capacity": 64,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
