"""The trainer reads every GPU node's NVIDIA driver before verl places anything on it (gpu_driver.py):
a node without a driver, or with one older than this image's CUDA needs, ends the attempt in seconds
with what to change. (On a real Ray cluster of declared GPUs: test_placement_ray.py.)"""

from __future__ import annotations

import pytest
from trainer_entry.gpu_driver import DriverError, check, driver_version, problems, required_driver

PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:16 UTC 2025\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  575.57.08  Release Build  (dvs-builder)\n"


def ray_node(node_id: str, gpus: float, alive: bool = True) -> dict:
    return {
        "NodeID": node_id,
        "NodeManagerAddress": f"198.18.0.{len(node_id)}",
        "Alive": alive,
        "Resources": {"CPU": 26.0, **({"GPU": gpus} if gpus else {})},
    }


def test_the_kernel_modules_version_is_read_from_both_module_flavours() -> None:
    assert driver_version(PROPRIETARY) == (580, 65, 6)
    assert driver_version(OPEN) == (575, 57, 8)
    assert driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.12  Beta\n") == (590, 12)
    assert driver_version("garbage") is None


def test_each_cuda_release_needs_its_driver() -> None:
    assert required_driver("13.0") == 580 and required_driver("12.8") == 525
    with pytest.raises(DriverError, match=r"CUDA 11\.8, whose driver need is not known here"):
        required_driver("11.8")


def test_only_the_alive_gpu_nodes_are_asked_and_all_must_pass() -> None:
    nodes = [ray_node("head", 0), ray_node("worker-a", 8), ray_node("worker-b", 8)]
    nodes.append(ray_node("gone", 8, alive=False))
    asked: list[dict] = []

    def read(targets):
        asked.append(dict(targets))
        return {name: PROPRIETARY if "worker-a" in name else OPEN for name in targets.values()}

    with pytest.raises(DriverError) as refused:
        check(nodes, "13.0", read=read)
    assert list(asked[0]) == ["worker-a", "worker-b"]
    assert str(refused.value) == (
        "node 198.18.0.8 (Ray node worker-b) runs NVIDIA driver 575.57.8; this image's torch is built for "
        "CUDA 13.0, which needs driver >= 580: upgrade the node's driver, or run the job on nodes that have "
        "one (cluster.workers.nodeSelector)"
    )
    assert check(nodes, "12.8", read=read) == "NVIDIA driver checked on 2 GPU node(s): CUDA 12.8 needs >= 525"


def test_no_driver_no_gpu_node_and_no_cuda_are_each_named() -> None:
    assert problems({"n1": None}, "13.0") == [
        "node n1 shows no NVIDIA driver (/proc/driver/nvidia/version is absent in the Ray pod): the node "
        "needs the NVIDIA driver and its container runtime (the GPU operator, or the NVIDIA container "
        "toolkit with the device plugin)"
    ]
    assert problems({"n1": "NVRM: odd"}, "13.0") == [
        "node n1: no driver version in /proc/driver/nvidia/version: 'NVRM: odd'"
    ]
    with pytest.raises(DriverError, match="no Ray node declares GPUs"):
        check([ray_node("head", 0)], "13.0", read=lambda targets: {})
    with pytest.raises(DriverError, match="this image's torch has no CUDA"):
        check([ray_node("w", 8)], None, read=lambda targets: {})
