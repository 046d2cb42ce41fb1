"""separate-async's weight sync on CPUs: our gloo checkpoint engine, as verl's CheckpointEngineManager
drives it (prepare, build_topology, init_process_group, send/receive, finalize), across threads."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from trainer_entry.verl_entry_points import CPU_CHECKPOINT_ENGINE
from verl.checkpoint_engine.base import CheckpointEngineRegistry

from trainer_entry import verl_plugin  # noqa: F401  (what `import verl` loads: the registration)


@pytest.fixture
def engine_cls(monkeypatch):
    import trainer_entry.cpu_checkpoint_engine  # noqa: F401  (verl_plugin imports it on the cpu platform)

    cls = CheckpointEngineRegistry.get(CPU_CHECKPOINT_ENGINE)
    monkeypatch.setattr("ray.util.get_node_ip_address", lambda: "127.0.0.1")
    return cls


def weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("model.embed_tokens.weight", torch.randn(50, 8, generator=g)),
        ("model.norm.weight", torch.randn(8, generator=g).to(torch.bfloat16)),
        ("lm_head.weight", torch.randn(50, 8, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=g)),
    ]


def sync_once(engine_cls, actors, rollouts, sent):
    """One sync as verl's manager runs it; what each rollout worker received, and whether the actor rank
    outside the group walked its generator."""
    metadata = [e.prepare() for e in actors + rollouts]
    actor_kwargs, rollout_kwargs = engine_cls.build_topology(len(actors), len(rollouts), metadata)
    walked = threading.Event()

    def walk():
        yield from sent
        walked.set()

    def run_actor(i: int):
        actors[i].init_process_group(**{k: v[i] for k, v in actor_kwargs.items()})
        return asyncio.run(actors[i].send_weights(walk() if i else iter(sent)))

    def run_rollout(i: int):
        rollouts[i].init_process_group(**{k: v[i] for k, v in rollout_kwargs.items()})
        return list(rollouts[i].receive_weights())

    with ThreadPoolExecutor(len(actors) + len(rollouts)) as pool:
        [pool.submit(run_actor, i) for i in range(len(actors))]
        futures = [pool.submit(run_rollout, i) for i in range(len(rollouts))]
        received = [f.result(timeout=120) for f in futures]
    for e in actors + rollouts:
        e.finalize()
    return received, walked.is_set()


def test_the_actors_rank_0_sends_full_weights_to_every_rollout_worker_in_buckets(engine_cls):
    """Two actor ranks (rank 1 only walks its generator, as FSDP's gather needs) and two rollout
    workers; buckets smaller than the weights, so several are sent; two syncs in a row (a new group
    each); every rollout worker gets each tensor exactly, dtype and shape included."""
    bucket = 2000  # bytes: the embedding alone is 1600, so 3 buckets
    actors = [engine_cls(bucket_size=bucket, is_master=True), engine_cls(bucket_size=bucket)]
    rollouts = [engine_cls(bucket_size=bucket), engine_cls(bucket_size=bucket)]
    for sync in range(2):
        sent = weights(sync)
        received, walked = sync_once(engine_cls, actors, rollouts, sent)
        assert walked, "the actor rank outside the group did not walk its weight generator"
        for got_all in received:
            assert [name for name, _ in got_all] == [name for name, _ in sent]
            for (_, got), (_, want) in zip(got_all, sent, strict=True):
                assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_rollout_worker_outside_a_sync_is_refused(engine_cls):
    with pytest.raises(RuntimeError, match="receive_weights outside a rollout worker's group"):
        list(engine_cls(bucket_size=1).receive_weights())
