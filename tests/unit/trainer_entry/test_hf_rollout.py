"""`rollout.engine: hf` under verl's colocated asynchronous trainer: partial rollouts.

verl's `colocate_async` trainer aborts the rollouts when a step has its batch (`abort_replicas`), updates
the weights and resumes generation after the step (`resume_generation_replicas`); its
`FullyAsyncLLMServerClient` sends an aborted request again with the tokens it got so far. The server
must stop a request mid-generation, hold new ones while paused, and serve them once resumed.
"""

import asyncio

import pytest
from trainer_entry.hf_rollout import HFRolloutServer
from trainer_entry.spec import parse_job
from trainer_entry.translate import translate
from verl.utils.config import omega_conf_to_dataclass

from trainer_entry import verl_config

RESPONSE = 256
# a bound for what must not happen (a parked request answering): a real generation of the tiny model
# answers in well under it even on a loaded machine (~20 ms a token)
PARKED_SECONDS = 1.0


def composed(tiny_model):
    job = parse_job(
        {
            "metadata": {"name": "j", "namespace": "rl"},
            "spec": {
                "model": {"path": str(tiny_model)},
                "data": {
                    "trainFiles": ["/d/train.parquet"],
                    "maxPromptLength": 64,
                    "maxResponseLength": RESPONSE,
                },
                "algorithm": {"rolloutsPerPrompt": 2, "trainBatchSize": 2, "totalTrainingSteps": 1},
                "rollout": {"engine": "hf", "protocol": "python-tags"},
                "tools": [{"name": "python", "type": "python"}],
                "cluster": {"workers": {"replicas": 1, "gpusPerWorker": 0}},
                "trainer": {"mode": "colocate-async"},
            },
        }
    )
    return verl_config.compose(translate(job, "http://127.0.0.1:1").overrides)


@pytest.fixture
def server(tiny_model):  # one per test: its asyncio lock and event belong to the test's loop
    cfg = composed(tiny_model)
    return HFRolloutServer(
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout), cfg.actor_rollout_ref.model, 0
    )


LONG = {"temperature": 1.0, "ignore_eos": True, "logprobs": True}


async def wait_sampling(server: HFRolloutServer) -> None:
    for _ in range(600):
        if server.lock.locked():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the request never started sampling")


async def test_an_abort_stops_the_request_at_its_next_token_and_holds_new_ones_until_resumed(server):
    prompt = [1, 2, 3, 4]
    first = asyncio.create_task(server.generate(prompt, dict(LONG, max_tokens=RESPONSE), request_id="a"))
    await wait_sampling(server)
    answer = await server.abort_all_requests()
    out = await asyncio.wait_for(first, 60)
    assert out.stop_reason == "aborted" and len(out.token_ids) < RESPONSE, (
        out.stop_reason,
        len(out.token_ids),
    )
    assert len(out.log_probs) == len(out.token_ids)
    assert answer["aborted_count"] == 1 and not server.lock.locked()

    # verl's client sends it again with what it has: parked while paused
    rest = RESPONSE - len(out.token_ids)
    again = asyncio.create_task(
        server.generate(prompt + out.token_ids, dict(LONG, max_tokens=rest), request_id="a")
    )
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(again), PARKED_SECONDS)
    server.set_global_steps(1)  # verl's weight update happens here
    await server.resume_generation()
    resumed = await asyncio.wait_for(again, 120)
    assert resumed.stop_reason == "completed" and len(out.token_ids) + len(resumed.token_ids) == RESPONSE
    assert resumed.extra_fields["global_steps"] == 1, "the rest was sampled by the new weights"


async def test_a_rejecting_abort_answers_late_requests_at_once(server):
    """verl's hybrid replicas leave its rotation with reject_request: late requests go elsewhere."""
    await server.abort_all_requests(reject_request=True)
    try:
        out = await asyncio.wait_for(server.generate([1, 2], dict(LONG, max_tokens=8), request_id="b"), 30)
        assert (out.stop_reason, out.token_ids) == ("aborted", [])
    finally:
        await server.resume_generation()
    out = await asyncio.wait_for(server.generate([1, 2], dict(LONG, max_tokens=8), request_id="c"), 60)
    assert (out.stop_reason, len(out.token_ids)) == ("completed", 8)


class FakeServerHandle:
    """The server actor's handle as the adapter calls it: `update_weights.remote(tensors, steps)`."""

    def __init__(self) -> None:
        self.updates: list = []
        self.update_weights = self

    def remote(self, tensors, global_steps):
        self.updates.append((tensors, global_steps))
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


async def test_a_standalone_rollout_worker_loads_a_checkpoint_engines_weights_into_its_replica(
    tiny_model, monkeypatch
):
    """separate-async: verl's checkpoint-engine worker of a standalone rollout builds the adapter with its
    replica's rank (its own worker group's RANK is 0) and hands it the engine's receiver, which may be an
    asynchronous generator."""
    import torch
    from trainer_entry.hf_rollout import HFServerAdapter, server_name

    monkeypatch.setenv("RANK", "0")
    cfg = composed(tiny_model).actor_rollout_ref
    adapter = HFServerAdapter(cfg.rollout, cfg.model, None, replica_rank=2)
    assert adapter.replica_rank == 2 and adapter.is_leader
    named = []
    monkeypatch.setattr("ray.get_actor", lambda name: named.append(name) or FakeServerHandle())
    handle = adapter._server()
    assert named == [server_name(2)]

    async def received():
        yield "lm_head.weight", torch.ones(2, 2)

    await adapter.update_weights(received(), global_steps=5)
    ((tensors, steps),) = handle.updates
    assert steps == 5 and torch.equal(tensors["lm_head.weight"], torch.ones(2, 2))
