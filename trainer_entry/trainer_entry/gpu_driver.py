"""The NVIDIA driver of every GPU node, read before verl places anything on it.

The trainer image's torch and vLLM are CUDA builds; a node whose kernel driver is older than the CUDA
release needs fails only once verl's workers touch CUDA, minutes into the attempt and deep in a Ray
actor's traceback ("CUDA driver version is insufficient"). The head (no GPU) reads the CUDA release of
its own torch (the workers run the same image) and asks each Ray node that declares GPUs, with a task
pinned to it, for the driver its kernel runs (`/proc/driver/nvidia/version`, which a container sees
when the node's NVIDIA runtime exposes the GPUs). A node without a driver, or with an older one, ends
the attempt in seconds with what to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
# The oldest Linux driver each CUDA major release runs on (NVIDIA's CUDA toolkit release notes, "CUDA
# minor version compatibility": 12.x needs >= 525, 13.x >= 580).
MIN_DRIVER_FOR_CUDA = {12: 525, 13: 580}
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..." or, the open modules,
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build ..."
_VERSION = re.compile(r"Kernel Module.*?\s(\d+)\.(\d+)(?:\.(\d+))?\s")
PROBE_SECONDS = 120.0  # a task on an idle node starts in seconds; a loaded one may take a worker start


class DriverError(RuntimeError):
    """A GPU node's driver cannot run this image's CUDA; the message names the node and what to do."""


def driver_version(text: str) -> tuple[int, ...] | None:
    """The kernel module's version in the contents of /proc/driver/nvidia/version, None if absent."""
    found = _VERSION.search(text)
    return tuple(int(part) for part in found.groups() if part is not None) if found else None


def required_driver(cuda: str) -> int:
    """The oldest driver (major version) that runs CUDA release `cuda` (torch.version.cuda, "13.0")."""
    major = int(cuda.split(".")[0])
    if major not in MIN_DRIVER_FOR_CUDA:
        known = ", ".join(f"CUDA {k}: >= {v}" for k, v in sorted(MIN_DRIVER_FOR_CUDA.items()))
        raise DriverError(f"torch is built for CUDA {cuda}, whose driver need is not known here ({known})")
    return MIN_DRIVER_FOR_CUDA[major]


def problems(read: Mapping[str, str | None], cuda: str) -> list[str]:
    """Per node (by name), what is wrong with the driver file read there (None: no such file)."""
    needed = required_driver(cuda)
    out = []
    for address, text in sorted(read.items()):
        version = driver_version(text) if text is not None else None
        if text is None:
            out.append(
                f"node {address} shows no NVIDIA driver ({DRIVER_VERSION_FILE} is absent in the Ray "
                "pod): the node needs the NVIDIA driver and its container runtime (the GPU operator, or "
                "the NVIDIA container toolkit with the device plugin)"
            )
        elif version is None:
            out.append(f"node {address}: no driver version in {DRIVER_VERSION_FILE}: {text[:120]!r}")
        elif version[0] < needed:
            shown = ".".join(map(str, version))
            out.append(
                f"node {address} runs NVIDIA driver {shown}; this image's torch is built for CUDA {cuda}, "
                f"which needs driver >= {needed}: upgrade the node's driver, or run the job on nodes that "
                f"have one (cluster.workers.nodeSelector)"
            )
    return out


def gpu_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Node id -> how messages name it (its address and id) of the alive Ray nodes that declare GPUs
    (`ray.nodes()`)."""
    return {
        n["NodeID"]: f"{n.get('NodeManagerAddress', '?')} (Ray node {n['NodeID'][:12]})"
        for n in nodes
        if n.get("Alive") and (n.get("Resources") or {}).get("GPU", 0) > 0
    }


def read_drivers(
    nodes: Mapping[str, str], version_file: str = DRIVER_VERSION_FILE, timeout: float = PROBE_SECONDS
) -> dict[str, str | None]:
    """For each of `nodes` (node id -> name), its name -> the contents of `version_file` as a task pinned
    to that node read it (None: no such file). The tasks hold no resource: they run beside whatever the
    node already runs."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    read = ray.remote(num_cpus=0)(_read_file)
    pending = {
        name: read.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        ).remote(version_file)
        for node_id, name in nodes.items()
    }
    try:
        return dict(zip(pending, ray.get(list(pending.values()), timeout=timeout), strict=True))
    except ray.exceptions.GetTimeoutError as exc:
        raise DriverError(
            f"the driver check's tasks on the GPU nodes ({', '.join(sorted(pending))}) did not run within "
            f"{timeout:.0f} s: a node is unreachable or cannot start a Ray worker"
        ) from exc


def _read_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def check(
    nodes: Iterable[Mapping[str, Any]],
    cuda: str | None,
    read: Callable[[Mapping[str, str]], Mapping[str, str | None]] = read_drivers,
) -> str:
    """Raise DriverError unless every GPU node of `nodes` (`ray.nodes()`) runs a driver for `cuda`
    (this image's torch.version.cuda; None: a torch without CUDA). Returns a line for the log."""
    targets = gpu_nodes(nodes)
    if not targets:
        raise DriverError("no Ray node declares GPUs: the GPU workers have not joined (or have no GPU)")
    if cuda is None:
        raise DriverError(
            "this image's torch has no CUDA, and the job asks for GPUs (cluster.workers.gpusPerWorker): "
            "run it with the GPU trainer image (cluster.image)"
        )
    found = problems(read(targets), cuda)
    if found:
        raise DriverError("; ".join(found))
    needed = required_driver(cuda)
    return f"NVIDIA driver checked on {len(targets)} GPU node(s): CUDA {cuda} needs >= {needed}"
