"""verl's `cpu` platform: the whole training loop on machines without accelerators.

verl picks its device, process-group backend and Ray resource from a platform
(`verl.plugin.platform`), and ships none for CPUs. This one names the device `cpu`, the backend
`gloo`, the torch device module `torch.cpu` (plus the memory calls verl makes, answered from the
host), and a *logical* Ray "GPU" per training process: verl's resource pools always ask Ray for
"GPU" bundles, so a CPU Ray node advertises as many logical GPUs as it runs training processes
(`ray start --num-gpus N`, `ray.init(num_gpus=N)`).

Selected with `VERL_PLATFORM=cpu`, which the trainer sets (for itself and, through the Ray runtime
env, for every worker) when `cluster.workers.gpusPerWorker` is 0. `install()` also adapts the two
places where verl 0.9.1 assumes an accelerator (see `_patch_verl`).
"""

from __future__ import annotations

import logging
import os
import types
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

PLATFORM = "cpu"
PLATFORM_ENV = "VERL_PLATFORM"
# verl registers its FSDP engines for cuda/npu only; the engine is plain torch and runs on any
# device, so on the cpu platform verl's own override selects the cuda entry.
ENGINE_DEVICE_ENV = "VERL_ENGINE_DEVICE"


def selected() -> bool:
    """Whether this process runs on the cpu platform."""
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM


def _device_module() -> types.ModuleType:
    """`torch.cpu` with the CUDA-style calls verl makes on its device module."""
    import psutil
    import torch

    module = types.ModuleType("toolrl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    def zero(device: Any = None) -> int:
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    module.mem_get_info = mem_get_info
    module.get_device_name = lambda device=None: "cpu"
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, zero)
    for name in ("empty_cache", "ipc_collect", "set_per_process_memory_fraction", "reset_peak_memory_stats"):
        setattr(module, name, nothing)
    return module


def _platform_class() -> type:
    import torch
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl on CPUs: gloo, torch.cpu, one logical Ray GPU per training process."""

        _module: types.ModuleType | None = None

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            if PlatformCPU._module is None:
                PlatformCPU._module = _device_module()
            return PlatformCPU._module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # Never auto-detected: a GPU machine must not fall back to it silently.
            return selected()

        def current_device(self) -> str:
            # verl moves tensors with `.to(get_device_id())`; torch reads an int as a CUDA ordinal
            # ("Found no NVIDIA driver"), so the CPU's id is the device string, as torch.cpu says.
            return torch.cpu.current_device()

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            # Ray sets it for actors holding (logical) GPUs; nothing on a CPU reads it.
            return "CUDA_VISIBLE_DEVICES"

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def cudart(self) -> None:
            return None

    return PlatformCPU


def _patch_verl() -> None:
    """The two accelerator assumptions of verl 0.9.1 that no extension point reaches (the verl
    functions replaced here are `verl_internals` entries, which the start-up probe checks; the critic's
    flash_attention_2 is replaced on every platform without flash-attn: verl_plugin.use_sdpa_critic).

    1. Process groups are created with the backend `cpu:gloo,<device>:<backend>`; for device cpu
       that is `cpu:gloo,cpu:gloo`, which torch rejects (a device type given twice). Every verl
       worker imports `initialize_global_process_group_ray` from `verl.utils.distributed`; this
       runs while `import verl` loads plugins, before any worker module binds the name.
    2. The FSDP2 reference model is built with `CPUOffloadPolicy(pin_memory=True)`; pinning needs
       a CUDA driver. On a CPU there is nothing to pin, so the policy is made unpinned.
    """
    from trainer_entry import verl_internals as internals

    original = internals.resolve(internals.PROCESS_GROUP_INIT)
    if not getattr(original, "toolrl_cpu", False):

        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            if backend is None or backend.replace(" ", "") == "cpu:gloo,cpu:gloo":
                backend = "gloo"
            return original(timeout_second=timeout_second, backend=backend)

        initialize_global_process_group_ray.toolrl_cpu = True
        internals.replace(internals.PROCESS_GROUP_INIT, initialize_global_process_group_ray)

    policy = internals.resolve(internals.FSDP_OFFLOAD_POLICY)
    if policy is not None and not getattr(policy, "toolrl_cpu", False):

        class UnpinnedCPUOffloadPolicy(policy):
            toolrl_cpu = True

            def __init__(self, pin_memory: bool = False, **kwargs: Any) -> None:
                super().__init__(pin_memory=False, **kwargs)

        internals.replace(internals.FSDP_OFFLOAD_POLICY, UnpinnedCPUOffloadPolicy)


def install() -> None:
    """Register the platform; on the cpu platform also adapt verl (idempotent)."""
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(PLATFORM) is None:
        PlatformRegistry.register(platform=PLATFORM)(_platform_class())
    if selected():
        os.environ.setdefault(ENGINE_DEVICE_ENV, "cuda")
        _patch_verl()
