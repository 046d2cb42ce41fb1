"""Benchmark of issue 7: one replayed rollout pattern, four ways of sizing the tool pool.

    python bench/autoscaler/run.py [--startup-seconds 5 20 40] [--scale-down-delay 60]
                                   [--steps 20] [--out bench/results/autoscaler.json]

(a) fixed at max, (b) fixed at min, (c) reactive (the operator's autoscaler, rolloutAware false),
(d) rollout-aware (the same, rolloutAware true). A simulation (see simulate.py) that drives the
operator's real decision function; pods, start-up delay, routing, phases and metric staleness
are modelled.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import simulate as sim
from toolrl_operator import scale_decision as a

MIN, MAX = 2, 64


def pool_policy(world: sim.World, rollout_aware: bool, delay: float) -> a.Policy:
    """The job a user would write for this pattern: one call per execution slot, 2..64 pods."""
    return a.Policy(
        min_replicas=MIN,
        max_replicas=MAX,
        target_concurrency=world.slots,
        scale_down_delay_seconds=delay,
        rollout_aware=rollout_aware,
        burst_cap=world.trajectories,
        prewarm_seconds=world.startup_seconds + 10,
    )


def run(world: sim.World, delay: float) -> list[dict]:
    cases = [
        ("(a) fixed at max", sim.fixed(MAX), MAX),
        ("(b) fixed at min", sim.fixed(MIN), MIN),
        ("(c) reactive", sim.operator_scaler(pool_policy(world, False, delay)), MIN),
        ("(d) rollout-aware", sim.operator_scaler(pool_policy(world, True, delay)), MIN),
    ]
    return [sim.simulate(name, world, scaler, initial).summary() for name, scaler, initial in cases]


def table(rows: list[dict]) -> str:
    lines = [
        "| policy | mean wait (s) | p99 wait (s) | p99 after step 1 (s) | replica-seconds | run (s) "
        "| scale events | peak pods |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['mean_wait_s']:.3f} | {r['p99_wait_s']:.2f} | "
            f"{r['p99_wait_after_step1_s']:.2f} | {r['replica_seconds']:.0f} | {r['run_seconds']:.0f} | "
            f"{r['scale_events']} | {r['max_replicas']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--startup-seconds",
        type=float,
        nargs="+",
        default=[5.0, 20.0, 40.0],
        help="pod start-up delay(s) to run the comparison for",
    )
    parser.add_argument(
        "--scale-down-delay",
        type=float,
        nargs="+",
        default=[60.0],
        help="toolPool.scaleDownDelaySeconds value(s) for (c) and (d)",
    )
    parser.add_argument("--steps", type=int, default=sim.World.steps)
    parser.add_argument("--out", type=Path, default=Path("bench/results/autoscaler.json"))
    args = parser.parse_args()
    report = []
    for delay in args.scale_down_delay:
        for startup in args.startup_seconds:
            world = replace(sim.World(), startup_seconds=startup, steps=args.steps)
            rows = run(world, delay)
            report.append({"world": asdict(world), "scale_down_delay_seconds": delay, "results": rows})
            print(
                f"\nPod start-up {startup:g} s, scaleDownDelaySeconds {delay:g}, {world.trajectories} "
                f"trajectories x {world.steps} steps, pods {MIN}..{MAX} x {world.slots} slots:\n"
            )
            print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
