"""Weight sync between separate trainer and rollout processes on CPUs: verl's checkpoint engine `gloo`.

verl's `separate_async` trainer keeps the rollout replicas on their own (logical) GPUs and moves the
actor's weights to them after every step through a checkpoint engine (`rollout.checkpoint_engine.backend`);
verl 0.9.1 ships only GPU ones (`nccl` needs cupy and CUDA, `hccl` Ascend, `nixl`/`mooncake` RDMA) and
refuses `naive`, which works only inside one process. This one is registered with verl's own registry
(`CheckpointEngineRegistry.register`, the extension point behind `checkpoint_engine.custom_backend_module`)
and does what the NCCL engine does with gloo over TCP:

- `prepare`: the actor's rank 0 (the sender) picks a free port on its node; `build_topology` makes a
  group of that rank and every rollout worker (the other actor ranks only walk the weight generator,
  which gathers the FSDP shards collectively).
- `init_process_group`: a TCPStore served by the sender and a gloo process group of its own, apart from
  the training group, built again for every sync (`finalize` drops it).
- `send_weights`: full tensors packed into buckets of `update_weights_bucket_megabytes`, each
  announced in the store (names, dtypes, shapes, offsets) and broadcast as bytes; `receive_weights`
  yields them as verl's (name, tensor) pairs, which the rollout's server adapter loads.
"""

from __future__ import annotations

import datetime as dt
import logging
import pickle
import socket
from collections.abc import Generator, Iterable
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from trainer_entry.verl_entry_points import CPU_CHECKPOINT_ENGINE

log = logging.getLogger(__name__)

BACKEND = CPU_CHECKPOINT_ENGINE
RECEIVED_LOG = "gloo checkpoint engine: rollout worker %d received %d tensors (%d bytes) of step %s"
SYNC_TIMEOUT = dt.timedelta(minutes=10)
SENDER = 0


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _full(tensor: torch.Tensor) -> torch.Tensor:
    if hasattr(tensor, "full_tensor"):  # an FSDP2 DTensor shard
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu").contiguous()


def pack(
    tensors: list[tuple[str, torch.Tensor]],
) -> tuple[list[tuple[str, torch.dtype, tuple, int, int]], torch.Tensor]:
    """One byte buffer and its table (name, dtype, shape, offset, bytes) for a bucket of tensors."""
    table, chunks, offset = [], [], 0
    for name, tensor in tensors:
        raw = tensor.reshape(-1).view(torch.uint8)
        table.append((name, tensor.dtype, tuple(tensor.shape), offset, raw.numel()))
        chunks.append(raw)
        offset += raw.numel()
    buffer = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
    return table, buffer


def unpack(
    table: list[tuple[str, torch.dtype, tuple, int, int]], buffer: torch.Tensor
) -> Generator[tuple[str, torch.Tensor]]:
    for name, dtype, shape, offset, nbytes in table:
        yield name, buffer[offset : offset + nbytes].view(dtype).reshape(shape).clone()


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """verl's checkpoint engine over gloo: the actor's rank 0 broadcasts full weights to the rollout."""

    def __init__(self, bucket_size: int, is_master: bool = False, **_: Any) -> None:
        self.bucket_size = max(1, int(bucket_size))
        self.is_master = is_master
        self.rank: int | None = None
        self.group: Any = None
        self.store: Any = None
        self.syncs = 0

    def prepare(self) -> dict[str, Any] | None:
        if not self.is_master:
            return None
        import ray

        host = ray.util.get_node_ip_address().strip("[]")
        return {"host": host, "port": _free_port(host)}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[Any]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        master = metadata[SENDER]
        if not master:
            raise RuntimeError("checkpoint engine gloo: the actor's rank 0 announced no address")
        world = 1 + rollout_world_size
        actor = {
            "rank": [SENDER] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world] * actor_wg_world_size,
            "master": [master] * actor_wg_world_size,
        }
        rollout = {
            "rank": list(range(1, world)),
            "world_size": [world] * rollout_world_size,
            "master": [master] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: dict[str, Any]) -> None:
        self.rank = rank
        if rank < 0:
            return
        self.store = dist.TCPStore(
            master["host"], master["port"], world_size, is_master=rank == SENDER, timeout=SYNC_TIMEOUT
        )
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("toolrl-weights", self.store), rank, world_size)

    def finalize(self) -> None:
        self.group = self.store = None
        self.syncs += 1

    def _broadcast(self, buffer: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = SENDER
        self.group.broadcast([buffer], options).wait()

    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> dict:
        if self.rank is None:
            raise RuntimeError("checkpoint engine gloo: send_weights before init_process_group")
        if self.rank < 0:  # not in the group, but producing each weight is collective over the actor
            for _name, tensor in weights:
                _full(tensor)
            return {}
        bucket: list[tuple[str, torch.Tensor]] = []
        size = buckets = 0

        def flush(last: bool) -> None:
            nonlocal bucket, size, buckets
            table, buffer = pack(bucket)
            self.store.set(f"bucket/{buckets}", pickle.dumps((table, buffer.numel(), last)))
            if buffer.numel():
                self._broadcast(buffer)
            bucket, size, buckets = [], 0, buckets + 1

        for name, tensor in weights:
            tensor = _full(tensor)
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > self.bucket_size:
                flush(last=False)
            bucket.append((name, tensor))
            size += nbytes
        flush(last=True)
        return {}

    def receive_weights(self, global_steps: int | None = None) -> Generator[tuple[str, torch.Tensor]]:
        if self.rank is None or self.rank <= SENDER:
            raise RuntimeError("checkpoint engine gloo: receive_weights outside a rollout worker's group")
        index, last, tensors, size = 0, False, 0, 0
        while not last:
            table, length, last = pickle.loads(self.store.get(f"bucket/{index}"))
            buffer = torch.empty(length, dtype=torch.uint8)
            if length:
                self._broadcast(buffer)
            yield from unpack(table, buffer)
            index, tensors, size = index + 1, tensors + len(table), size + length
        # at warning level, as the hf engine's weight log: a run's output shows each sync arrived
        log.warning(RECEIVED_LOG, self.rank, tensors, size, global_steps)
