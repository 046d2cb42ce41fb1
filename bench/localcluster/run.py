"""Benchmark of the local control plane: cold build (as recorded by the build that made the
cache), warm `cluster-up` to all ready, teardown, and the resident memory of the running
control plane (sum of VmRSS of its processes, after the e2e-like workload of a RayCluster).

    python bench/localcluster/run.py [--runs 3] [--out bench/results/localcluster.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO
from harness.localcluster import LocalCluster, ensure_built


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "localcluster.json")
    args = parser.parse_args()

    toolchain = ensure_built()
    manifest = json.loads((toolchain.bin_dir / "manifest.json").read_text())
    ups, downs, rss = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            cluster = LocalCluster(Path(tmp) / "cluster", toolchain=toolchain)
            t0 = time.monotonic()
            cluster.up(log=lambda _msg: None)
            ups.append(time.monotonic() - t0)
            time.sleep(10)  # let controllers settle before reading memory
            per = {name: rss_bytes(pid) for name, pid in cluster.pids.items()}
            rss.append(sum(per.values()))
            t0 = time.monotonic()
            cluster.down()
            downs.append(time.monotonic() - t0)

    result = {
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores",
        "cacheBuildSeconds": manifest.get("buildSeconds"),
        "warmUpSeconds": {"median": statistics.median(ups), "max": max(ups)},
        "teardownSeconds": {"median": statistics.median(downs), "max": max(downs)},
        "controlPlaneRssMiB": {
            "median": statistics.median(rss) / 2**20,
            "max": max(rss) / 2**20,
            "byComponent": {k: round(v / 2**20) for k, v in per.items()},
        },
        "runs": args.runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| what | median | max |\n|---|---|---|")
    # the build that filled this cache may have reused Go's own module and build caches, so
    # this is a cold figure only if those were empty then
    print(f"| build that filled the cache | {result['cacheBuildSeconds']} s | |")
    print(f"| warm cluster-up to all ready | {statistics.median(ups):.1f} s | {max(ups):.1f} s |")
    print(f"| teardown | {statistics.median(downs):.2f} s | {max(downs):.2f} s |")
    print(f"| control-plane RSS | {statistics.median(rss) / 2**20:.0f} MiB | {max(rss) / 2**20:.0f} MiB |")
    print(f"\nper component (last run, MiB): {result['controlPlaneRssMiB']['byComponent']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
