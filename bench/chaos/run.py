"""Benchmark of issue 25: one CPU job on the real node meets each fault in turn, each measured.

    python bench/chaos/run.py [--steps 24] [--save-freq 2] [--out bench/results/chaos.json]

examples/toolrljob-cpu.yaml with checkpoints every `--save-freq` steps, `resume: auto` and
`runPolicy.backoffLimit: 2`. Each fault hits once the trainer has gone past a checkpoint saved since the
previous fault's recovery: the Ray head pod deleted (no grace), the Ray worker pod deleted, every
tool-pool pod deleted, the operator's pod deleted, the node's kubelet and containerd restarted. For each:
seconds until `kubectl get trj` showed it, seconds until training went past the step it stood at,
trainer restarts and attempts it cost, steps redone, trajectories excluded, what `kubectl get trj`
showed meanwhile and the job's Events. Then the job must end Succeeded at its total step with nothing
of a Ray cluster left. Bounded: each wait has a limit; the cluster goes down at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from harness.localcluster.cluster import real_node_cluster
from harness.operator_process import Sampler, get_json, wait_until
from harness.training_cluster import (
    CPU_EXAMPLE,
    OPERATOR_NAMESPACE,
    TrainingCluster,
    checkpointed,
    delete_pods,
    newest_checkpoint,
    stage_toy_data,
    training_cluster,
)
from trainer_entry.metrics import console_steps

NAMESPACE = "bench-chaos"
NAME = "chaos"
WAIT = 2400  # seconds, each wait's default bound: verl's start-up in new pods is 2-8 min here


def _pods(selector: str) -> Callable[[TrainingCluster], list[str]]:
    return lambda tc: delete_pods(tc, tc.namespace, f"toolrl.dev/job={NAME},{selector}")


def _operator(tc: TrainingCluster) -> list[str]:
    return delete_pods(tc, OPERATOR_NAMESPACE, "app.kubernetes.io/name=toolrl-operator")


def _node_runtime(tc: TrainingCluster) -> list[str]:
    tc.cluster.restart_node_runtime()
    return ["kubelet", "containerd"]


FAULTS: tuple[tuple[str, Callable[[TrainingCluster], list[str]]], ...] = (
    ("Ray head pod deleted", _pods("ray.io/node-type=head")),
    ("Ray worker pod deleted", _pods("ray.io/node-type=worker")),
    ("every tool-pool pod deleted", _pods("app.kubernetes.io/component=tool-pool")),
    ("operator pod deleted", _operator),
    ("node's kubelet and containerd restarted", _node_runtime),
)


@dataclass
class Seen:
    """What a user watching the job had: `kubectl get trj` and its status."""

    phase: str | None
    reason: str | None
    step: int | None
    restarts: int
    attempt: int
    excluded: int
    recovering: str | None  # the Recovering condition's reason

    def shown(self) -> str:
        return f"{self.phase}/{self.reason or '-'} step {self.step} restarts {self.restarts}"


def seen(tc: TrainingCluster) -> Seen:
    status = tc.job(NAME).get("status") or {}
    progress = status.get("progress") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    return Seen(
        status.get("phase"),
        status.get("reason"),
        progress.get("step"),
        int(status.get("restarts") or 0),
        int(status.get("attempt") or 1),
        int(progress.get("trajectoriesExcluded") or 0),
        (conditions.get("Recovering") or {}).get("reason"),
    )


@dataclass
class Fault:
    fault: str
    hit: list[str]
    step_at_fault: int
    checkpoint_at_fault: int
    seconds_until_shown: float | None  # the job's status changed in a way a user could see
    seconds_until_past: float  # training went past the step it stood at
    restarts: int  # trainer restarts it cost (status.restarts)
    attempts: int  # job attempts it cost (status.attempt, runPolicy.backoffLimit)
    resumed_at: int | None  # the first step a restarted trainer trained
    steps_redone: int
    trajectories_excluded: int
    shown: list[str] = field(default_factory=list)  # kubectl get trj meanwhile, each change once
    events: list[str] = field(default_factory=list)  # the job's Events meanwhile


def first_step_of_newest_trainer(tc: TrainingCluster) -> int | None:
    """The first step in the log of KubeRay's newest submitter pod (the trainer's log)."""
    pods = get_json(tc.cluster, "pods", "-n", tc.namespace, "-l", f"batch.kubernetes.io/job-name={NAME}")
    newest = max(pods["items"], key=lambda p: p["metadata"]["creationTimestamp"], default=None)
    if newest is None:
        return None
    log = tc.kubectl("logs", newest["metadata"]["name"], "-n", tc.namespace, check=False).stdout
    return next(iter(console_steps(log)), None)  # steps in the order the log first shows them


def event_keys(tc: TrainingCluster) -> dict[str, int]:
    """How often each `type reason` was posted: a reason posted again may be a new Event object (its own
    message) rather than a higher count of the old one, so both add up."""
    counts: Counter[str] = Counter()
    for e in tc.events(NAME):
        counts[f"{e['type']} {e['reason']}"] += int(e.get("count") or 1)
    return dict(counts)


def inject(
    tc: TrainingCluster,
    host_dir: Path,
    name: str,
    hit: Callable[[TrainingCluster], list[str]],
    since: int,
    wait: float = WAIT,
) -> Fault:
    """`hit` once the trainer has gone past a checkpoint newer than step `since` (the previous fault's)."""

    def past_a_new_checkpoint() -> int | None:
        state, saved = seen(tc), newest_checkpoint(host_dir)
        fresh = saved > since and (state.step or 0) > saved and state.recovering != "TrainerRestarted"
        return state.step if fresh and state.phase == "Running" else None

    wait_until(past_a_new_checkpoint, wait, f"{NAME} to train past a checkpoint before: {name}", interval=1)
    before, events_before = seen(tc), event_keys(tc)
    checkpoint = newest_checkpoint(host_dir)
    # where the trainer stood: status.progress lags it by a report, a saved checkpoint does not
    stood = max(before.step or 0, checkpoint)
    with Sampler(lambda: seen(tc), interval=1) as sampler:
        at = time.monotonic()
        hits = hit(tc)
        assert hits, f"{name}: nothing to hit"
        wait_until(
            lambda: (seen(tc).step or 0) > stood or seen(tc).phase in ("Succeeded", "Failed"),
            wait,
            f"{NAME} to train past step {stood} after: {name}",
            interval=1,
        )
        past = time.monotonic() - at
    after = seen(tc)
    samples = [(t - at, s) for t, s in sampler.samples if t >= at]
    shown_at = next(
        (t for t, s in samples if s.shown() != before.shown() or s.recovering != before.recovering), None
    )
    restarts = after.restarts - before.restarts
    resumed = first_step_of_newest_trainer(tc) if restarts or after.attempt > before.attempt else None
    events_after = event_keys(tc)
    return Fault(
        fault=name,
        hit=hits,
        step_at_fault=stood,
        checkpoint_at_fault=checkpoint,
        seconds_until_shown=None if shown_at is None else round(shown_at, 1),
        seconds_until_past=round(past, 1),
        restarts=restarts,
        attempts=after.attempt - before.attempt,
        resumed_at=resumed,
        steps_redone=stood - resumed + 1 if resumed else 0,
        trajectories_excluded=after.excluded - before.excluded,
        shown=[key for key, _ in itertools.groupby(s.shown() for _, s in samples)],
        events=sorted(k for k, n in events_after.items() if n > events_before.get(k, 0)),
    )


def run(steps: int, save_freq: int, root: Path, wait: float = WAIT) -> dict[str, Any]:
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    job["metadata"]["name"] = NAME
    job["spec"]["algorithm"]["totalTrainingSteps"] = steps
    job["spec"]["runPolicy"]["backoffLimit"] = 2
    with (
        real_node_cluster(root) as cluster,
        training_cluster(cluster, cluster.root / "work", NAMESPACE) as tc,
    ):
        stage_toy_data(tc)
        host_dir = checkpointed(tc, job, save_freq)
        started = time.monotonic()
        tc.cluster.apply(job, "-n", tc.namespace)
        faults: list[Fault] = []
        for name, hit in FAULTS:
            fault = inject(tc, host_dir, name, hit, faults[-1].step_at_fault if faults else 0, wait)
            print(json.dumps(asdict(fault)), flush=True)
            faults.append(fault)
        wait_until(lambda: seen(tc).phase in ("Succeeded", "Failed"), wait, f"{NAME} to end", interval=5)
        final = tc.job(NAME)["status"]
        ended = time.monotonic()

        def ray_left() -> list[str]:
            selector = f"toolrl.dev/job={NAME},ray.io/cluster"
            found = get_json(tc.cluster, "rayclusters,pods", "-n", tc.namespace, "-l", selector)["items"]
            return [f"{i['kind']}/{i['metadata']['name']}" for i in found]

        # KubeRay deletes the Ray cluster once the job ends (ttlSecondsAfterFinished 0); what is left
        # after the bound is reported
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not ray_left(), 300, "the Ray cluster to go", interval=2)
        left, cleaned = ray_left(), time.monotonic() - ended
        return {
            "steps": steps,
            "save_freq": save_freq,
            "phase": final.get("phase"),
            "step": (final.get("progress") or {}).get("step"),
            "restarts": final.get("restarts"),
            "attempt": final.get("attempt"),
            "run_seconds": round(time.monotonic() - started),
            "faults": [asdict(f) for f in faults],
            "events": [f"{e['type']} {e['reason']} x{e.get('count') or 1}" for e in tc.events(NAME)],
            "ray_objects_left": left,
            "seconds_until_ray_cluster_gone": None if left else round(cleaned, 1),
        }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| fault | at step (ckpt) | shown after (s) | past the step after (s) | restarts / attempts "
        "| resumed at | redone | excluded | `kubectl get trj` meanwhile |",
        "|---|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for f in result["faults"]:
        cells = [
            f["fault"],
            f"{f['step_at_fault']} ({f['checkpoint_at_fault']})",
            f["seconds_until_shown"],
            f["seconds_until_past"],
            f"{f['restarts']} / {f['attempts']}",
            f["resumed_at"] or "-",
            f["steps_redone"],
            f["trajectories_excluded"],
            "; ".join(f["shown"]),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    r = result
    lines.append(
        f"\nend: {r['phase']} at step {r['step']}/{r['steps']}, restarts {r['restarts']}, attempt "
        f"{r['attempt']}, {r['run_seconds']} s; the Ray cluster gone {r['seconds_until_ray_cluster_gone']} s "
        f"after the end; left: {r['ray_objects_left']}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="the job's totalTrainingSteps")
    parser.add_argument("--save-freq", type=int, default=2, help="the job's checkpoint.saveFreq")
    parser.add_argument("--wait", type=float, default=WAIT, help="bound of each wait, seconds")
    parser.add_argument("--out", type=Path, default=Path("bench/results/chaos.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="toolrl-chaos-") as root:
        result = run(args.steps, args.save_freq, Path(root), args.wait)
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result["phase"] != "Succeeded" or result["step"] != args.steps or result["ray_objects_left"]:
        raise SystemExit("chaos: the job did not end Succeeded at its total step with nothing left")


if __name__ == "__main__":
    main()
