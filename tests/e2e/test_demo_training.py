"""What `make demo` shows, asserted: examples/toolrljob-cpu.yaml trains on the local cluster's two real
nodes (the second in a network namespace of its own; each offers half the machine), its Ray head and
worker on different nodes (the Ray cluster's own traffic crossing between them), with the operator's
NetworkPolicies enforced by packets on both (kube-router's firewall, as `make demo` runs it). The
operator runs as a pod from the chart; KubeRay's real RayJob lifecycle (Running, then Succeeded) drives
the job's phase; the trainer's progress reaches its target; the autoscaler sizes the pool from the
trainer's phase (Events); Prometheus scrapes the pods' IPs as the chart's monitors say and every
dashboard panel has data from the run; the run's PNG is drawn. A job whose reward function raises ends
Failed with the trainer's own words.

Then one separate-async job meets every fault of a long run in turn (a killed operator, a checkpoint that
cannot be written, a killed head process, lost pods with the nodes' runtimes restarted, the node under its
Ray workers and pool crashed) and loses no more than a checkpoint interval to each, while an engine-vllm
job beside it is deleted mid-training and leaves nothing behind. Jobs that can share the node run side by
side: verl's start-up in the pods is the module's largest cost.

One cluster with real nodes runs per machine, so the module shares one; the CPU trainer image is built on
first use (~17 min cold, ~4 min when only trainer_entry changed, cached by its inputs).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import itertools
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.localcluster.addresses import POD_NETWORK
from harness.localcluster.cluster import real_node_cluster
from harness.operator_process import Sampler, get_json, wait_until
from harness.training_cluster import (
    CPU_EXAMPLE,
    DEMO_REAL_NODES,
    OPERATOR_NAMESPACE,
    JobState,
    TrainingCluster,
    checkpointed,
    dashboard_queries,
    delete_pods,
    finite,
    finite_over,
    kill_container_process,
    newest_checkpoint,
    plot_run,
    stage_toy_data,
    training_cluster,
)
from toolrl_operator.children import CHILD_KINDS
from toolrl_operator.events import PHASE_PREFIX
from toolrl_operator.scale_decision import ROLLOUT_AWARE
from toolrl_operator.status import PROVISIONING
from trainer_entry.metrics import console_steps

pytestmark = pytest.mark.timeout(5400)

NAMESPACE = "e2e-train"
TRAINING_TIMEOUT = 1500  # verl's start-up in pods is 2-8 min here, with the machine's load
SAVE_FREQ = 2  # the faulted runs' checkpoint interval: the most steps a lost trainer may redo
# A reward bug that the check before training cannot see (the ground truth is a number) but every
# generated answer meets (a whole response: tool call, its output, the answer): it raises in training.
BROKEN_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(int(solution_str) == int(ground_truth))
"""


@dataclass
class Run:
    job: dict[str, Any]
    samples: list[tuple[float, JobState]]
    applied: float  # unix time
    ended: float
    nodes: dict[str, str] = field(default_factory=dict)  # pod -> its node, at the first trained step


# (a job or the cluster, unix time of the job's apply or the set-up's start, what happened)
Milestone = Callable[[str, float, str], None]


@pytest.fixture(scope="module")
def milestone(pytestconfig: pytest.Config) -> Milestone:
    """Writes a line into the run's own log, past pytest's capture (-q shows nothing of a passing
    test): where a long job's minutes go, for the next engineer cutting make test's time."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def write(name: str, since: float, what: str) -> None:
        with capture.global_and_fixture_disabled():
            at = time.strftime("%H:%M:%S")  # beside the machine's own samples (memory, load)
            print(f"\n[{name}] +{time.time() - since:.0f} s ({at}): {what}", flush=True)

    return write


@pytest.fixture(scope="module")
def tc(tmp_path_factory: pytest.TempPathFactory, milestone: Milestone) -> Iterator[TrainingCluster]:
    started = time.time()
    root = tmp_path_factory.mktemp("training")
    with real_node_cluster(root, network_policy=True, real_nodes=DEMO_REAL_NODES) as cluster:
        milestone("cluster", started, f"the control plane and {DEMO_REAL_NODES} real nodes are up")
        with training_cluster(cluster, cluster.root / "work", NAMESPACE) as found:
            milestone("cluster", started, "images imported, the chart's operator and Prometheus up")
            stage_toy_data(found)
            milestone("cluster", started, "the toy data and model staged by the trainer image")
            yield found


def pod_waits(tc: TrainingCluster, name: str, applied: float) -> str:
    """Each of job `name`'s pods: seconds from the apply to its creation, its scheduling and its
    readiness, and how often the scheduler could not place it (a job waiting on another's requests).
    A diagnosis only: a failed read is said, never raised."""
    try:
        pods = get_json(tc.cluster, "pods", "-n", tc.namespace, "-l", f"toolrl.dev/job={name}")["items"]
        unplaced = get_json(
            tc.cluster, "events", "-n", tc.namespace, "--field-selector", "reason=FailedScheduling"
        )["items"]
    except Exception as exc:
        return f"  (the pods could not be read: {exc!r})"

    def since(stamp: str | None) -> str:
        return "-" if not stamp else f"{dt.datetime.fromisoformat(stamp).timestamp() - applied:.0f}"

    lines = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"]):
        meta = pod["metadata"]
        at = {c["type"]: c.get("lastTransitionTime") for c in pod["status"].get("conditions", [])}
        refused = sum(e.get("count", 1) for e in unplaced if e["involvedObject"]["name"] == meta["name"])
        lines.append(
            f"  {meta['name']}: created {since(meta['creationTimestamp'])}, scheduled"
            f" {since(at.get('PodScheduled'))}, ready {since(at.get('Ready'))} s; unschedulable x{refused}"
        )
    return "\n".join(lines)


def pod_nodes(tc: TrainingCluster, name: str) -> dict[str, str]:
    """Job `name`'s pods (its Ray pods and its pool's) by name -> the node each runs on, the Ray head's
    and workers' named `head` and `worker` (KubeRay's node-type label) besides."""
    pods = get_json(tc.cluster, "pods", "-n", tc.namespace, "-l", f"toolrl.dev/job={name}")["items"]
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}
    for p in pods:
        kind = p["metadata"]["labels"].get("ray.io/node-type")
        if kind in ("head", "worker"):
            nodes[kind] = p["spec"].get("nodeName", "")
    return nodes


def _ended(tc: TrainingCluster, name: str) -> bool:
    return tc.job(name).get("status", {}).get("phase") in ("Succeeded", "Failed")


def _why_it_ended(tc: TrainingCluster, name: str) -> str:
    """An ended job's phase, reason and message first (CI's log shows a failure's first line only),
    then its whole status, its Events and the end of its trainer's log."""
    status = tc.job(name).get("status", {})
    events = "\n".join(f"  {e.get('reason')}: {e.get('message')}" for e in tc.events(name))
    log = "\n".join(tc.trainer_logs(name))[-4000:]
    return (
        f"{status.get('phase')} ({status.get('reason')}): {status.get('message')!r}\nstatus: {status}"
        f"\nevents:\n{events}\ntrainer log (its end):\n{log}"
    )


def _before_it_ends(tc: TrainingCluster, name: str, probe: Callable[[], Any]) -> Callable[[], Any]:
    """`probe` for wait_until, failing at once when job `name` ends before it is met (a fault that
    came too late, a run faster than the test) rather than waiting out the timeout."""

    def checked() -> Any:
        found = probe()
        if not found and _ended(tc, name):
            raise AssertionError(f"{name} ended first: {_why_it_ended(tc, name)}")
        return found

    return checked


def _finished_run(tc: TrainingCluster, name: str, samples: list, applied: float) -> Run:
    """The ended job as a Run: its samples and one more now (the sampler may stop before its next)."""
    return Run(tc.job(name), [*samples, (time.monotonic(), tc.state(name))], applied, time.time())


def _train(tc: TrainingCluster, job: dict[str, Any], milestone: Milestone) -> Run:
    name = job["metadata"]["name"]
    applied = time.time()
    tc.cluster.apply(job, "-n", tc.namespace)
    deadline = time.monotonic() + TRAINING_TIMEOUT  # one for the whole run
    with Sampler(lambda: tc.state(name), interval=2) as sampler:
        try:
            wait_until(
                _before_it_ends(tc, name, lambda: tc.state(name).step),
                TRAINING_TIMEOUT,
                f"{name} to train its first step",
                interval=2,
            )
            milestone(name, applied, "trained its first step\n" + pod_waits(tc, name, applied))
            nodes = pod_nodes(tc, name)
            wait_until(
                lambda: _ended(tc, name),
                max(1.0, deadline - time.monotonic()),
                f"{name} to end",
                interval=5,
            )
        except AssertionError:
            print(tc.kubectl("get", "pods,rayjobs", "-n", tc.namespace, "-o", "wide").stdout)
            print(tc.kubectl("describe", "rayjob", "-n", tc.namespace).stdout[-3000:])
            raise
    milestone(name, applied, f"ended {tc.job(name).get('status', {}).get('phase')}")
    return replace(_finished_run(tc, name, sampler.samples, applied), nodes=nodes)


BROKEN = "broken-reward"


@pytest.fixture(scope="module")
def broken_applied(tc: TrainingCluster) -> float:
    """The CPU example with BROKEN_REWARD as its custom reward, applied beside the demo's job (its two
    verl start-ups overlap: the broken job asks the node for less, so both fit); returns when (unix)."""
    tc.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": BROKEN},
            "data": {"reward.py": BROKEN_REWARD},
        },
        "-n",
        tc.namespace,
    )
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    job["metadata"]["name"] = BROKEN
    job["spec"]["reward"] = {"preset": "custom", "custom": {"configMap": BROKEN}}
    cluster = job["spec"]["cluster"]
    cluster["head"]["resources"]["requests"].update(cpu="100m", memory="2Gi")
    cluster["workers"]["resources"]["requests"].update(cpu="100m", memory="3Gi")
    applied = time.time()
    tc.cluster.apply(job, "-n", tc.namespace)
    return applied


@pytest.fixture(scope="module")
def run(tc: TrainingCluster, broken_applied: float, milestone: Milestone) -> Run:
    """examples/toolrljob-cpu.yaml, applied as the demo does, to its end (the broken job beside it)."""
    return _train(tc, yaml.safe_load(CPU_EXAMPLE.read_text()), milestone)


@pytest.fixture(scope="module")
def broken(tc: TrainingCluster, broken_applied: float) -> Run:
    """The broken-reward job, once it ended (it usually has by the time the demo's job ends)."""
    wait_until(lambda: _ended(tc, BROKEN), TRAINING_TIMEOUT, f"{BROKEN} to end", interval=5)
    job = tc.job(BROKEN)
    ends = [
        c
        for c in job["status"]["conditions"]
        if c["type"] in ("Failed", "Succeeded") and c["status"] == "True"
    ]
    assert ends, job["status"]
    return Run(job, [], broken_applied, dt.datetime.fromisoformat(ends[0]["lastTransitionTime"]).timestamp())


def _first(values: list, wanted: Any) -> int:
    return values.index(wanted) if wanted in values else -1


def test_rayjob_runs_then_succeeds_and_the_job_follows_with_full_progress(
    tc: TrainingCluster, run: Run
) -> None:
    status = run.job["status"]
    assert status["phase"] == "Succeeded", status
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == run.job["spec"]["algorithm"]["totalTrainingSteps"]
    seen = [s for _, s in run.samples]
    deployment = [s.deployment for s in seen]
    ray_status = [s.ray_job for s in seen]
    # KubeRay's own lifecycle, as sampled: the Ray job RUNNING, then SUCCEEDED; the deployment
    # Running, then Complete (KubeRay's name for its end)
    assert -1 < _first(ray_status, "RUNNING") < _first(ray_status, "SUCCEEDED"), seen
    assert -1 < _first(deployment, "Running") < _first(deployment, "Complete"), seen
    steps = sorted({s.step for s in seen if s.step is not None})
    assert len(steps) >= 2, f"progress moved in one jump, not step by step: {steps}"
    phases = [s.phase for s in seen]
    assert _first(phases, "Running") < _first(phases, "Succeeded"), seen


def test_the_trainers_log_outlives_the_ray_pods_in_the_submitter_job(tc: TrainingCluster, run: Run) -> None:
    """KubeRay's submitter, a Job of the operator's hardened template admitted by Pod Security
    `restricted`, followed the trainer's log to its end; it stays when the Ray pods are gone (TTL 0)."""
    name = run.job["metadata"]["name"]
    log = "\n".join(tc.trainer_logs(name))
    assert f"step:{run.job['spec']['algorithm']['totalTrainingSteps']} " in log, log[-3000:]
    labels = get_json(tc.cluster, "namespace", tc.namespace)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_trainers_tool_calls_reached_the_pool_pods(tc: TrainingCluster, run: Run) -> None:
    name = run.job["metadata"]["name"]
    sel = f'namespace="{tc.namespace}", toolrl_job="{name}"'
    ok = finite_over(
        tc.prometheus, f'sum(toolrl_tool_calls_total{{{sel}, outcome="ok"}})', run.applied, run.ended
    )
    assert ok and max(ok) > 0, "no successful tool call was counted by the pool's pods"
    # scraped from pod IPs of the pod network (either node's range), found through the API server
    targets = tc.prometheus.query(f'up{{{sel}, toolrl_component="tool-pool"}}')
    pods = ipaddress.ip_network(POD_NETWORK)
    assert targets, "no pool pod was scraped"
    assert all(ipaddress.ip_address(t["metric"]["instance"].rsplit(":", 1)[0]) in pods for t in targets), (
        targets
    )


def test_the_jobs_ray_head_and_worker_ran_on_different_nodes(tc: TrainingCluster, run: Run) -> None:
    """The example prefers its Ray pods on different machines: on the two real nodes the head (GCS, the
    driver) and the worker (verl's FSDP and rollout workers) ran apart, so the Ray cluster's own traffic
    (GCS, the object store, the workers' collectives) crossed between the nodes for the whole run."""
    real = {node.name for node in tc.cluster.nodes}
    assert len(real) == DEMO_REAL_NODES
    assert run.nodes.get("head") in real and run.nodes.get("worker") in real, run.nodes
    assert run.nodes["head"] != run.nodes["worker"], run.nodes


def test_the_autoscaler_followed_the_trainers_phase(tc: TrainingCluster, run: Run) -> None:
    events = tc.events(run.job["metadata"]["name"])
    scaled = [e for e in events if any(f"({r})" in e["message"] for r in ROLLOUT_AWARE)]
    assert scaled, "no rollout-aware scaling Event:\n" + "\n".join(
        f"{e['reason']}: {e['message']}" for e in events
    )


# Series that only exist once something failed (a labelled counter appears with its first
# increment): a healthy run leaves these queries without data. They must still parse.
FAILURES_ONLY = (
    'outcome!="ok"',
    "toolrl_tool_output_truncated_total",
    "toolrl_trajectories_excluded_total",
    "toolrl_operator_reconcile_errors_total",
)


def test_every_dashboard_panel_has_data_from_the_run(tc: TrainingCluster, run: Run) -> None:
    queries = dashboard_queries(tc.namespace, run.job["metadata"]["name"])
    assert any(t.startswith("Tool call latency") for t, _ in queries) and any(
        t.startswith("Reward") for t, _ in queries
    )
    end = run.ended + 30
    empty = [(t, q) for t, q in queries if not finite_over(tc.prometheus, q, run.applied, end)]
    healthy_empty = [(t, q) for t, q in empty if any(f in q for f in FAILURES_ONLY)]
    missing = [e for e in empty if e not in healthy_empty]
    assert not missing, "panels without data from the run:\n" + "\n".join(f"{t}: {q}" for t, q in missing)


def test_the_alert_rules_load_and_evaluate(tc: TrainingCluster, run: Run) -> None:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{tc.prometheus.url}/api/v1/rules", timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert rules, "the chart's PrometheusRule gave Prometheus no rules"
    bad = {name: r.get("lastError") for name, r in rules.items() if r["health"] != "ok"}
    assert not bad, bad


def test_the_run_is_drawn_as_a_png(tc: TrainingCluster, run: Run, tmp_path: Path) -> None:
    png = plot_run(
        tc.prometheus, tc.namespace, run.job["metadata"]["name"], run.applied, run.ended, tmp_path / "r.png"
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_reward_that_raises_in_training_fails_the_job_with_the_trainers_reason(
    tc: TrainingCluster, broken: Run
) -> None:
    status = broken.job["status"]
    assert status["phase"] == "Failed", status
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["status"] == "True"
    # the trainer's one line, through KubeRay's RayJob message: the function, its error, what to do
    for words in ("compute_score()", "raised ValueError: invalid literal for int()", "apply the job again"):
        assert words in failed["message"], failed
    assert "progress" not in status or not status["progress"].get("step"), (
        "no step trained on a raising reward"
    )
    events = [e for e in tc.events(BROKEN) if e["type"] == "Warning"]
    raised = [
        e for e in events if e["reason"] == "RewardFunctionFailed" and "invalid literal" in e["message"]
    ]
    assert raised, events
    # the trainer's record of the first raise: the function, where it comes from, the answer it met
    said = raised[0]["message"]
    assert "of spec.reward.custom (reward.py of ConfigMap 'broken-reward') raised ValueError" in said, said
    # the answer as Python's repr quotes it: in double quotes when it holds a single one (print('7'))
    assert re.search(r"on the generated answer (['\"]).+\1 \(\d+ characters\)", said), said
    assert said.endswith("fix the function and apply the job again"), said
    # verl alone evicts the prompt's group and generates another, for ever: the run ends at the first raise
    after = broken.ended - dt.datetime.fromisoformat(raised[0]["firstTimestamp"]).timestamp()
    assert after < 300, f"the job ended {after:.0f} s after the reward raised"
    assert get_json(tc.cluster, "trj", BROKEN, "-n", tc.namespace)["status"]["phase"] == "Failed"


# ----- one separate-async job, every fault: what a long run meets, and loses nothing by -------------

# each later fault waits for a checkpoint of its own (2, 4, 6, ... at SAVE_FREQ 2, seen within a second; an
# async step takes ~7 s here), and the last trainer needs steps to resume past the faults
SEPARATE_STEPS = 20  # past fault 4: a checkpoint, fault 5, the next attempt's start, a checkpoint, a drain
SEPARATE_GROUPS = 2  # the trainer's workers and the rollout workers
OPERATOR_POD = "app.kubernetes.io/name=toolrl-operator"
LOST_NODE = 1  # the real node fault 5 crashes (node 0 is the host's namespace, with the cluster's DNS)
# what an administrator says of a node that is down for good (Kubernetes' non-graceful node shutdown):
# its pods are deleted, so that KubeRay, which counts a Terminating pod, starts others elsewhere
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def prefer_node(node: str, avoid: bool = False) -> dict[str, Any]:
    """An affinity that prefers `node` (or, with `avoid`, any other)."""
    term = {"key": "kubernetes.io/hostname", "operator": "NotIn" if avoid else "In", "values": [node]}
    preferred = [{"weight": 100, "preference": {"matchExpressions": [term]}}]
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}


@dataclass
class NodeLoss:
    """Fault 5: the node under the job's Ray workers and its pool crashes mid-training."""

    node: str
    workers: list[str]  # the Ray worker pods that ran there
    held: list[str]  # of those, the ones still in the API when the node was declared down
    checkpoint: int  # the newest checkpoint at the crash
    at: float  # monotonic, as the samples: the crash
    named: dict[str, Any]  # ToolPoolReady once it named the node, as a user saw it
    named_after: float  # seconds from the crash
    freed_after: float  # seconds from the crash until the lost Ray pods were deleted (after the taint)
    resumed_from: int  # the newest checkpoint when the next attempt started
    next_attempt_after: float  # seconds from the crash to the next attempt
    ray_nodes_after: dict[str, str]  # the next attempt's Ray pods -> their node, once all were placed
    back_after: float  # seconds from the boot until the node was Ready again
    drained: dict[str, str]  # the pool's pods -> their node, after the drain that moved it back there
    excluded: dict[str, Any]  # progress.trajectoriesExcluded before and after the drain
    logs: list[str]  # the next attempt's trainers' logs (those that logged a step), oldest first


@dataclass
class SeparateRun:
    run: Run
    groups: list[dict[str, Any]]  # status.workerGroups once every group's pods were Ready
    good: int  # the newest checkpoint when the volume turned read-only
    retried: list[str]  # the Events that said an attempt failed and KubeRay retries
    killed_after: int  # the newest checkpoint when the head's process was killed
    step_at_faults: int  # the job's shown step when the pods, the operator and the node runtime went
    checkpoint_at_faults: int  # the newest checkpoint on the volume then
    faults_at: float  # monotonic, as the samples
    logs: list[str]  # attempt 2's submitter pods' logs that logged a step, oldest first (before fault 5)
    lost: NodeLoss

    def seconds_until(self, seen: Callable[[JobState], bool]) -> float | None:
        """Seconds from the pod, operator and node-runtime faults to the first sample that shows `seen`."""
        return next(
            (at - self.faults_at for at, s in self.run.samples if at > self.faults_at and seen(s)), None
        )


@pytest.fixture(scope="module")
def separate(tc: TrainingCluster, deleted: Future[DeletedRun], milestone: Milestone) -> SeparateRun:
    """The CPU example as `trainer.mode: separate-async` (a rollout worker group beside the trainer's),
    checkpoints every SAVE_FREQ steps, `runPolicy.backoffLimit: 2`, applied with kubectl; the faults of a
    long run, one after the other, each once the run has a checkpoint to lose work past:
    1. the operator's pod is killed as soon as the job is applied (mid-sync: creating its children);
    2. once both groups' pods are Ready and a checkpoint is saved, the checkpoint volume turns read-only:
       the attempt's next save fails; the volume is writable again while KubeRay retries, and the next
       attempt resumes from the good checkpoint;
    3. once that attempt has saved a checkpoint of its own, the Ray head's container process is
       SIGKILLed (the pod stays; kubelet restarts the container);
    4. once the trainer restarted after it has saved a checkpoint of its own, at one moment: the Ray
       head and worker pods of both groups are deleted (no grace), every tool-pool pod is deleted, the
       operator's pod is killed again, and each node's kubelet and containerd are restarted (their
       processes; the containers live on in their shims);
    5. once the trainer restarted after those has saved a checkpoint of its own, the node under the Ray
       workers and the pool (they prefer it, the head the other) crashes (`_lose_a_node`); the attempt
       ends, the next resumes on the other node from the newest checkpoint; the node boots, and a drain
       of the other node's pool pods while the job trains brings the pool back onto it.
    The engine-vllm job deleted mid-training (`deleted`) runs beside it from the start."""
    name = "separate"
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    job["metadata"]["name"] = name
    spec = job["spec"]
    spec["algorithm"]["totalTrainingSteps"] = SEPARATE_STEPS
    spec["trainer"] = {"mode": "separate-async", "async": {"maxPolicyVersions": 2}}
    # small requests, as the deleted job's: with the example's (500m a pod) the two jobs, their pools and
    # submitters asked more than the node's 2 CPUs, and one group waited unscheduled until the deleted
    # job was gone (ci11: both groups Ready 411 s after the apply)
    cluster = spec["cluster"]
    cluster["head"]["resources"]["requests"].update(cpu="100m", memory="2Gi")
    cluster["workers"]["resources"]["requests"].update(cpu="100m", memory="4Gi")
    cluster["rolloutWorkers"] = {
        "replicas": 1,
        "gpusPerWorker": 0,
        "resources": {"requests": {"cpu": "100m", "memory": "3Gi"}},
    }
    spec["runPolicy"]["backoffLimit"] = 2  # faults 2 and 5 each end an attempt
    # fault 5's node holds the Ray workers of both groups and the pool; the head (the driver, the GCS)
    # is on the other: a lost worker's node, as the issue of spot capacity has it
    lost_node = tc.cluster.nodes[LOST_NODE].name
    for group in (cluster["workers"], cluster["rolloutWorkers"], spec["toolPool"]):
        group["affinity"] = prefer_node(lost_node)
    cluster["head"]["affinity"] = prefer_node(lost_node, avoid=True)
    job_dir = checkpointed(tc, job, SAVE_FREQ)
    applied = time.time()
    tc.cluster.apply(job, "-n", tc.namespace)
    # fault 1: the operator's first kill, while it syncs the new job (creates its children, posts Created)
    assert delete_pods(tc, OPERATOR_NAMESPACE, OPERATOR_POD), "no operator pod to kill"
    with Sampler(lambda: tc.state(name), interval=2) as sampler:

        def all_groups_ready() -> list[dict[str, Any]] | None:
            groups = tc.job(name).get("status", {}).get("workerGroups") or []
            ready = len(groups) == SEPARATE_GROUPS and all(
                g["readyReplicas"] == g["replicas"] for g in groups
            )
            return groups if ready else None

        groups = wait_until(
            _before_it_ends(tc, name, all_groups_ready),
            TRAINING_TIMEOUT,
            f"{name}'s two worker groups to be Ready",
        )
        milestone(name, applied, "both worker groups Ready\n" + pod_waits(tc, name, applied))

        def past_a_checkpoint() -> int | None:
            # a complete checkpoint (verl writes its marker last); not the job's shown step, which lags
            # the trainer by a varying number of these short steps (ci8: shown past a checkpoint only
            # at checkpoint 8 of 12, too late for the faults after it)
            return newest_checkpoint(job_dir) or None

        wait_until(
            _before_it_ends(tc, name, past_a_checkpoint),
            TRAINING_TIMEOUT,
            f"{name} past a checkpoint",
            interval=1,
        )
        milestone(name, applied, f"past checkpoint {newest_checkpoint(job_dir)}: the volume turns read-only")
        # fault 2: the trainer (uid 1000, the directory's owner) can write nothing in it
        job_dir.chmod(0o555)
        try:
            wait_until(
                _before_it_ends(tc, name, lambda: (tc.state(name).attempt or 1) >= 2),
                TRAINING_TIMEOUT,
                f"{name}'s refused attempt to be retried",
            )
        finally:
            job_dir.chmod(0o755)
        good = newest_checkpoint(job_dir)  # the refused attempt's last (a save under way went through)
        milestone(name, applied, f"attempt 2 started (good checkpoint {good})")

        # the job's shown step lags the trainer by a few of these short async steps: the checkpoints
        # on the volume say where the trainer stands
        def checkpoint_past(step: int) -> Callable[[], int | None]:
            def saved() -> int | None:
                newest = newest_checkpoint(job_dir)
                return newest if newest > step and tc.state(name).phase == "Running" else None

            return saved

        killed_after = wait_until(
            _before_it_ends(tc, name, checkpoint_past(good)),
            TRAINING_TIMEOUT,
            f"{name}'s second attempt to save a checkpoint",
            interval=1,
        )
        milestone(name, applied, f"attempt 2 saved checkpoint {killed_after}: the head's process is killed")
        # fault 3
        kill_container_process(tc, tc.namespace, f"toolrl.dev/job={name},ray.io/node-type=head")
        wait_until(
            _before_it_ends(tc, name, checkpoint_past(killed_after)),
            TRAINING_TIMEOUT,
            f"{name}'s trainer restarted after the head's kill to save a checkpoint",
            interval=1,
        )
        milestone(
            name, applied, "the restarted trainer saved a checkpoint: pods, pool, operator, node runtime go"
        )
        # fault 4, at one moment
        step_at_faults, checkpoint_at_faults = tc.state(name).step or 0, newest_checkpoint(job_dir)
        assert checkpoint_at_faults <= SEPARATE_STEPS - 2 * SAVE_FREQ, (
            f"the run outpaced its faults: checkpoint {checkpoint_at_faults} of {SEPARATE_STEPS} steps when"
            " fault 4 was due, too late for a restarted trainer to save one before fault 5 and for the"
            " attempt after it to show what it resumed from; raise SEPARATE_STEPS"
        )
        faults_at = time.monotonic()
        trainers_before = len([log for log in tc.trainer_logs(name) if console_steps(log)])
        job_pods = f"toolrl.dev/job={name}"
        # the head's machine goes first, its processes at once (the driver with them): a deleted pod's
        # containers die only when kubelet gets to them, and kubelet restarts right after, so a head
        # that outlived its worker would see the worker lost and end the attempt, as a worker's loss
        # alone does (trainer_entry/node_watch.py): another fault, not the one measured here
        kill_container_process(tc, tc.namespace, f"{job_pods},ray.io/node-type=head")
        assert delete_pods(tc, tc.namespace, f"{job_pods},ray.io/node-type=head"), "no head pod to delete"
        assert delete_pods(tc, tc.namespace, f"{job_pods},ray.io/node-type=worker"), "no worker to delete"
        assert delete_pods(tc, tc.namespace, f"{job_pods},app.kubernetes.io/component=tool-pool")
        assert delete_pods(tc, OPERATOR_NAMESPACE, OPERATOR_POD)  # its second kill
        for index in range(DEMO_REAL_NODES):  # every node's: the job's pods are on both
            tc.cluster.restart_node_runtime(index=index)

        def restarted_trainer_saved() -> list[str] | None:
            logs = [log for log in tc.trainer_logs(name) if console_steps(log)]
            if len(logs) <= trainers_before or tc.state(name).phase != "Running":
                return None
            return logs if newest_checkpoint(job_dir) >= min(console_steps(logs[-1])) else None

        # attempt 2's logs end with the lost node (KubeRay replaces the submitter Job): kept now
        logs = wait_until(
            _before_it_ends(tc, name, restarted_trainer_saved),
            TRAINING_TIMEOUT,
            f"{name}'s trainer restarted after fault 4 to save a checkpoint",
            interval=2,
        )
        milestone(
            name, applied, f"checkpoint {newest_checkpoint(job_dir)} after fault 4: node {lost_node} crashes"
        )
        # fault 5
        lost = _lose_a_node(tc, name, job_dir, milestone, applied)
        wait_until(
            lambda: _ended(tc, name),
            TRAINING_TIMEOUT,
            f"{name} to end",
            interval=5,
        )
    run = _finished_run(tc, name, sampler.samples, applied)
    milestone(name, applied, f"ended {run.job['status'].get('phase')}")
    print(f"\n{name}: {run.job['status']}")

    def newest_submitter_ended() -> bool:  # it follows the trainer's log to the end
        pods = tc.submitter_pods(name)
        return bool(pods) and pods[-1]["status"].get("phase") in ("Succeeded", "Failed")

    wait_until(newest_submitter_ended, 300, "the last trainer's submitter pod to end")
    # a submitter pod that found no Ray to submit to logged no step
    lost.logs = [log for log in tc.trainer_logs(name) if console_steps(log)]
    # the status says Retrying only while KubeRay deletes the failed attempt's cluster (4 s seen): the
    # Event of that phase change keeps it (kubectl describe), status.lastAttemptFailure too
    retried = [
        e["message"]
        for e in tc.events(name)
        if e["reason"] == f"{PHASE_PREFIX}{PROVISIONING}" and "KubeRay retries" in e["message"]
    ]
    return SeparateRun(
        run, groups, good, retried, killed_after, step_at_faults, checkpoint_at_faults, faults_at, logs, lost
    )


def _ray_pods(tc: TrainingCluster, name: str) -> dict[str, dict[str, Any]]:
    found = get_json(tc.cluster, "pods", "-n", tc.namespace, "-l", f"toolrl.dev/job={name},ray.io/node-type")
    return {p["metadata"]["name"]: p for p in found["items"]}


def _lose_a_node(
    tc: TrainingCluster, name: str, job_dir: Path, milestone: Milestone, applied: float
) -> NodeLoss:
    """Node LOST_NODE, where job `name`'s Ray workers and pool run, crashes (every process of it killed at
    once, as a stopped VM). What must follow, each waited for and timed: the job's status names the
    node (NodeNotReady), while the pods it held stay in the API (KubeRay counts them); the
    administrator declares it down (the out-of-service taint, as ClusterReady's message says), and
    Kubernetes deletes them; the next attempt's Ray pods all go to the other node; the node boots, is
    Ready again and the taint is taken off; once the attempt has saved a checkpoint, the pool is drained
    off the other node (`_drain_the_pool`) and comes back on this one. The node is booted whatever fails."""
    node, other = tc.cluster.nodes[LOST_NODE].name, tc.cluster.nodes[0].name
    attempt = tc.state(name).attempt or 1
    placed = pod_nodes(tc, name)
    workers = [
        pod
        for pod, p in _ray_pods(tc, name).items()
        if p["spec"].get("nodeName") == node and p["metadata"]["labels"]["ray.io/node-type"] == "worker"
    ]
    assert workers, f"no Ray worker of {name} on {node} to lose: {placed}"
    assert any("-tools-" in pod and at == node for pod, at in placed.items()), (
        f"no pool pod on {node}: {placed}"
    )
    checkpoint = newest_checkpoint(job_dir)
    assert checkpoint < SEPARATE_STEPS, f"checkpoint {checkpoint}: the run ended before fault 5"
    crashed, booted = time.monotonic(), False
    tc.cluster.crash_node(LOST_NODE)
    try:

        def named() -> dict[str, Any] | None:  # the pool pod there: ToolPoolReady says it
            conditions = tc.job(name).get("status", {}).get("conditions", [])
            said = [c for c in conditions if c["type"] == "ToolPoolReady" and f"node {node} " in c["message"]]
            return said[0] if said and said[0]["reason"] == "NodeNotReady" else None

        condition = wait_until(named, 300, f"{name}'s status to name the lost node {node}", interval=2)
        named_after = time.monotonic() - crashed
        milestone(name, applied, f"{condition['type']} names {node} after {named_after:.0f} s: declared down")
        held = sorted(set(workers) & set(_ray_pods(tc, name)))  # nothing removes them but the node or this
        tc.kubectl("taint", "nodes", node, OUT_OF_SERVICE)
        wait_until(
            lambda: not set(workers) & set(_ray_pods(tc, name)),
            180,
            f"the lost Ray pods {workers} deleted once {node} is out of service",
        )
        freed_after = time.monotonic() - crashed
        wait_until(
            _before_it_ends(tc, name, lambda: (tc.state(name).attempt or 1) > attempt),
            TRAINING_TIMEOUT,
            f"{name}'s next attempt after the lost node",
            interval=1,
        )
        next_attempt_after, resumed_from = time.monotonic() - crashed, newest_checkpoint(job_dir)
        milestone(
            name, applied, f"attempt {attempt + 1} after {next_attempt_after:.0f} s, from {resumed_from}"
        )

        def placed_again() -> dict[str, str] | None:
            cluster = ((tc.rayjob(name) or {}).get("status") or {}).get("rayClusterName")
            pods = [
                p
                for p in _ray_pods(tc, name).values()
                if p["metadata"]["labels"].get("ray.io/cluster") == cluster
                and not p["metadata"].get("deletionTimestamp")
            ]
            nodes = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}
            return nodes if len(nodes) == 1 + SEPARATE_GROUPS and all(nodes.values()) else None

        allocatable = get_json(tc.cluster, "node", other)["status"]["allocatable"]
        ray_nodes_after = wait_until(
            _before_it_ends(tc, name, placed_again),
            TRAINING_TIMEOUT,
            f"attempt {attempt + 1}'s Ray pods placed ({other} holds the whole job: it offers {allocatable})",
            interval=2,
        )
        milestone(
            name, applied, f"attempt {attempt + 1}'s Ray pods on {sorted(set(ray_nodes_after.values()))}"
        )
        back = time.monotonic()
        tc.cluster.boot_node(LOST_NODE)
        booted = True

        def ready() -> bool:
            conditions = get_json(tc.cluster, "node", node)["status"]["conditions"]
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_until(ready, 300, f"{node} Ready again after its boot")
        back_after = time.monotonic() - back
    finally:
        if not booted:
            tc.cluster.boot_node(LOST_NODE)
        tc.kubectl("taint", "nodes", node, OUT_OF_SERVICE.split("=")[0] + "-", check=False)
    milestone(name, applied, f"{node} Ready {back_after:.0f} s after its boot")
    wait_until(
        _before_it_ends(tc, name, lambda: newest_checkpoint(job_dir) > resumed_from),
        TRAINING_TIMEOUT,
        f"{name}'s attempt {attempt + 1} to save a checkpoint of its own",
        interval=1,
    )
    excluded_before = (tc.job(name)["status"].get("progress") or {}).get("trajectoriesExcluded")
    drained = _drain_the_pool(tc, name, other, node)
    excluded = {
        "before": excluded_before,
        "after": (tc.job(name)["status"].get("progress") or {}).get("trajectoriesExcluded"),
    }
    milestone(name, applied, f"the pool drained from {other} while training: now {drained}")
    return NodeLoss(
        node,
        workers,
        held,
        checkpoint,
        crashed,
        condition,
        named_after,
        freed_after,
        resumed_from,
        next_attempt_after,
        ray_nodes_after,
        back_after,
        drained,
        excluded,
        [],
    )


def _drain_the_pool(tc: TrainingCluster, name: str, node: str, to: str) -> dict[str, str]:
    """A spot-style drain of `node` with the pool's notice (cordon, evict: `kubectl drain`, of the pool's
    pods: a node of its own, as pools often have) while job `name` trains: the pool's calls in flight end
    as the pool's failures (the trainer masks them out), its pods come back on `to` (the node left is
    cordoned) and are Ready; `node` is uncordoned after. The pool's pods -> their node."""
    selector = f"toolrl.dev/job={name},app.kubernetes.io/component=tool-pool"
    try:
        # the pool's /tmp is an emptyDir: a drain that may evict it deletes its data
        drain = ["drain", node, "--pod-selector", selector, "--delete-emptydir-data", "--timeout", "180s"]
        done = tc.cluster.kubectl(*drain, timeout=240, check=False)
        assert done.returncode == 0, done.stderr

        def back() -> dict[str, str] | None:
            pods = get_json(tc.cluster, "pods", "-n", tc.namespace, "-l", selector)["items"]
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            ready = all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                for p in live
            )
            nodes = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in live}
            return nodes if nodes and set(nodes.values()) == {to} and ready else None

        return wait_until(
            _before_it_ends(tc, name, back), 240, f"{name}'s pool back on {to}, Ready", interval=1
        )
    finally:
        tc.kubectl("uncordon", node, check=False)


def test_a_separate_async_job_runs_both_worker_groups_and_succeeds(
    tc: TrainingCluster, separate: SeparateRun
) -> None:
    status = separate.run.job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["progress"]["step"] == SEPARATE_STEPS, status["progress"]
    names = [g["name"] for g in separate.groups]
    assert len(set(names)) == SEPARATE_GROUPS and all(g["readyReplicas"] == 1 for g in separate.groups), names
    lag = [
        values["training/off_policy/trajectory_staleness_worst/max"]
        for log in [*separate.logs, *separate.lost.logs]
        for values in console_steps(log).values()
        if "training/off_policy/trajectory_staleness_worst/max" in values
    ]
    assert lag and max(lag) <= 1, f"off-policy lag past maxPolicyVersions 2: {lag}"
    # the rollout-aware autoscaler reads the async trainer's phases too (README: what it reads there)
    events = tc.events("separate")
    scaled = [e["message"] for e in events if any(f"({r})" in e["message"] for r in ROLLOUT_AWARE)]
    print("\nseparate: the autoscaler's rollout-aware decisions:\n" + "\n".join(scaled))
    assert scaled, [f"{e['reason']}: {e['message']}" for e in events]


def test_a_checkpoint_that_cannot_be_written_fails_the_attempt_and_the_retry_resumes_from_the_good_one(
    separate: SeparateRun,
) -> None:
    # attempt 1 by the refused checkpoint, attempt 2 by the lost node (fault 5)
    assert len(separate.retried) == 2, f"two attempts failed and were retried: {separate.retried}"
    message = next((m for m in separate.retried if "attempt 1 failed" in m), "")
    assert "KubeRay retries" in message, separate.retried
    # the trainer's own words, whole (KubeRay quotes the end of its log): the step, the directory, the
    # cause, what to do — not a worker's traceback in place of the cause
    said = f"could not be written to /checkpoints/{NAMESPACE}/separate: Permission denied; free space on"
    assert said in message and "spec.checkpoint.volume" in message, message
    # the retried attempt's first step follows the good checkpoint (a step saved past it was refused);
    # the trainers restarted after the later faults start later still
    first = min(step for log in separate.logs for step in console_steps(log))
    assert first == separate.good + 1, (first, separate.good)


def _trainers(separate: SeparateRun) -> list[dict[int, dict[str, float]]]:
    """The steps logged by attempt 2's trainers, oldest first: its first, the one restarted after the
    head's kill, ..., the one lost at the pod, operator and node-runtime faults, the one after them."""
    trainers = [console_steps(log) for log in separate.logs]
    assert len(trainers) >= 3, f"attempt 2's trainers, by their first step: {[min(t) for t in trainers]}"
    return trainers


def test_a_killed_head_process_costs_at_most_a_checkpoint_interval(separate: SeparateRun) -> None:
    status = separate.run.job["status"]
    assert status["restarts"] >= 2, status
    after_kill = _trainers(separate)[1]
    first = min(after_kill)  # the step after the checkpoint it resumed from: one saved before the kill
    assert first > separate.killed_after, (first, separate.killed_after)


def test_lost_ray_pods_pool_operator_and_node_runtime_cost_at_most_a_checkpoint_interval(
    separate: SeparateRun,
) -> None:
    status = separate.run.job["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == SEPARATE_STEPS, status
    before, after = _trainers(separate)[-2:]
    # the restarted trainer's first step follows the newest checkpoint at the faults: never earlier
    first = min(after)
    assert first - 1 >= separate.checkpoint_at_faults, (first, separate.checkpoint_at_faults)
    redone = max(before) - first + 1  # steps the lost trainer had logged that were trained again
    assert redone <= SAVE_FREQ, f"{redone} steps redone, more than the checkpoint interval {SAVE_FREQ}"
    # until fault 5 (the next attempt shows its own progress)
    steps = [s.step for at, s in separate.run.samples if s.step is not None and at < separate.lost.at]
    # shown progress never falls below where the run stood (the old trainer may have saved one more
    # checkpoint between the faults and its end: then the new one resumes past the faulted step)
    floor = min(separate.step_at_faults, first - 1)
    assert min(steps[steps.index(separate.step_at_faults) :]) >= floor, f"progress reset: {steps}"
    shown = [step for step, _ in itertools.groupby(steps)]
    seen = separate.seconds_until(lambda s: s.reason == "TrainerRestarted")
    resumed = separate.seconds_until(lambda s: (s.step or 0) > separate.step_at_faults)
    print(
        f"\nfaults at shown step {separate.step_at_faults}, trainer step {max(before)} (checkpoint "
        f"{separate.checkpoint_at_faults}): the restart shown after {seen} s, resumed at step {first} "
        f"({redone} redone), past the shown step after {resumed} s; trajectories excluded "
        f"{status['progress'].get('trajectoriesExcluded')}; steps sampled {shown}"
    )


def test_a_lost_node_is_named_and_the_next_attempt_resumes_on_the_other_from_the_newest_checkpoint(
    tc: TrainingCluster, separate: SeparateRun
) -> None:
    lost, status = separate.lost, separate.run.job["status"]
    print(
        f"\nnode {lost.node} lost under {lost.workers} at checkpoint {lost.checkpoint}: named after"
        f" {lost.named_after:.0f} s ({lost.named['type']}: {lost.named['message']}); attempt"
        f" {status['attempt']} after {lost.next_attempt_after:.0f} s from checkpoint {lost.resumed_from}, its"
        f" Ray pods on {lost.ray_nodes_after}; its lost pods deleted {lost.freed_after:.0f} s after the crash"
        f" (declared down at {lost.named_after:.0f} s); Ready {lost.back_after:.0f} s after its boot;"
        f" the pool drained back onto it: {lost.drained}, trajectories excluded {lost.excluded}"
    )
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == SEPARATE_STEPS, status
    # the pool's condition named the node and its pod there (a Warning too); the lost Ray pods stayed in
    # the API (KubeRay counts them) until the node was declared down, then went
    pool_pods = lost.named["message"].split("with pods ", 1)[-1].split(":")[0].split(", ")
    assert pool_pods and all("-tools-" in pod for pod in pool_pods), lost.named
    warnings = [e["message"] for e in tc.events("separate") if e["reason"] == "NodeNotReady"]
    assert any(f"node {lost.node} " in m for m in warnings), warnings
    assert lost.held == lost.workers, (lost.held, lost.workers)
    # the attempt on the lost node ended saying so; the status keeps it after the job's end (KubeRay forgot)
    assert status["attempt"] == 3, status
    failure = status.get("lastAttemptFailure") or {}
    # the trainer's own words for a lost node: its node watch's, or Ray's actor error naming a dead node
    said = ("the Ray cluster lost", "a Ray node was lost")
    assert failure.get("attempt") == 2 and any(s in failure.get("message", "") for s in said), failure
    assert failure.get("reason") and failure.get("time"), failure
    # the next attempt ran on the node that was left, from the newest checkpoint: nothing older
    assert set(lost.ray_nodes_after.values()) == {tc.cluster.nodes[0].name}, lost.ray_nodes_after
    first = min(step for log in lost.logs for step in console_steps(log))
    assert first == lost.resumed_from + 1, (first, lost.resumed_from)
    # the node came back, and the job used it again: its pool, drained off the other node while training
    # (the job then went on to Succeeded, above), came back there
    assert lost.drained and set(lost.drained.values()) == {lost.node}, lost.drained


def test_the_user_sees_the_restarts_and_the_operators_restarts_repeat_nothing(
    tc: TrainingCluster, separate: SeparateRun
) -> None:
    status = separate.run.job["status"]
    assert status["restarts"] >= 2 and status["lastRestart"]["pod"].startswith("separate"), status
    recovering = {c["type"]: c for c in status["conditions"]}["Recovering"]
    assert (recovering["status"], recovering["reason"]) == ("False", "TrainingResumed"), recovering
    reasons = [e["reason"] for e in tc.events("separate")]
    assert reasons.count("TrainerRestarted") == status["restarts"], reasons
    assert "TrainingResumed" in reasons, reasons
    # the operator was killed twice mid-run: its restarts repeat no Event and duplicate no child
    for once in ("Created", "PhaseSucceeded"):
        assert reasons.count(once) == 1, f"{once}: {reasons}"
    assert reasons.count("PhaseRunning") == status["attempt"], f"PhaseRunning once per attempt: {reasons}"
    for kind in ("deployments", "services", "configmaps", "rayjobs"):
        found = get_json(tc.cluster, kind, "-n", tc.namespace, "-l", "toolrl.dev/job=separate")["items"]
        assert len(found) == 1, (kind, [i["metadata"]["name"] for i in found])


def test_nothing_of_the_faulted_run_is_left_behind(tc: TrainingCluster, separate: SeparateRun) -> None:
    """KubeRay deletes the Ray cluster when the job ends (TTL 0): no RayCluster and no Ray pod of
    any head is left; the submitter Job keeps its pods (the trainer's log)."""

    def leftovers() -> list[str]:
        ours = "toolrl.dev/job=separate"
        clusters = get_json(tc.cluster, "rayclusters", "-n", tc.namespace, "-l", ours)
        pods = get_json(tc.cluster, "pods", "-n", tc.namespace, "-l", f"{ours},ray.io/node-type")
        return [i["metadata"]["name"] for i in clusters["items"] + pods["items"]]

    wait_until(lambda: not leftovers(), 300, "the faulted run's Ray cluster and pods to go")


# ----- a job deleted mid-training ------------------------------------------------------------------

# KubeRay's children of a RayJob beside the operator's own (CHILD_KINDS), and what their controllers make
KUBERAY_AND_WORKLOAD_KINDS = ("rayclusters", "jobs", "replicasets", "pods")
DELETION_BOUND = 300  # seconds: the garbage collector and KubeRay's finalizers, with the machine's load


def _everything_of(tc: TrainingCluster, name: str) -> list[str]:
    """Every object in the namespace that belongs to job `name`: by its label, or by a name the
    operator and KubeRay derive from the job's."""
    kinds = [c.plural for c in CHILD_KINDS if c.watched] + list(KUBERAY_AND_WORKLOAD_KINDS)
    found = get_json(tc.cluster, ",".join(kinds), "-n", tc.namespace)["items"]
    return [
        f"{i['kind']}/{i['metadata']['name']}"
        for i in found
        if (i["metadata"].get("labels") or {}).get("toolrl.dev/job") == name
        or i["metadata"]["name"] == name
        or i["metadata"]["name"].startswith(f"{name}-")
    ]


def _tool_calls_counted(tc: TrainingCluster, name: str) -> float:
    sel = f'namespace="{tc.namespace}", toolrl_job="{name}", outcome="ok"'
    return sum(finite(tc.prometheus, f"sum(toolrl_tool_calls_total{{{sel}}})"))


@dataclass
class DeletedRun:
    first_step: float  # seconds from the apply to step 1 trained
    calls: float  # tool calls of the job the pool counted
    owned: list[str]  # what belonged to the job when it was deleted
    gone: float  # seconds from the delete until nothing of it was left


def _delete_mid_training(tc: TrainingCluster) -> DeletedRun:
    """The CPU example through `rollout.engine: vllm` (verl's vLLM server on vLLM's CPU build, in the
    CPU trainer image) trains its first step on the real node, tool calls and all; then it is deleted.
    Its requests are small, so it fits on the node beside the separate-async job."""
    name = "deleted"
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    job["metadata"]["name"] = name
    job["spec"]["rollout"]["engine"] = "vllm"
    cluster = job["spec"]["cluster"]
    cluster["head"]["resources"]["requests"].update(cpu="100m", memory="2Gi")
    cluster["workers"]["resources"]["requests"].update(cpu="100m", memory="3Gi")
    applied = time.monotonic()
    tc.cluster.apply(job, "-n", tc.namespace)
    wait_until(
        _before_it_ends(tc, name, lambda: tc.state(name).step),
        TRAINING_TIMEOUT,
        f"{name} to train its first step",
        interval=2,
    )
    first_step = time.monotonic() - applied
    # verl's vLLM server ran in the worker pod (Ray prefixes its actors' lines with their class) and
    # no HF server did; the submitter's log may trail the status by a few lines
    log = wait_until(
        lambda: (found := "\n".join(tc.trainer_logs(name))) and "CPUvLLMHttpServer" in found and found,
        120,
        f"{name}'s trainer log to show verl's vLLM server (trainer_entry.vllm_on_cpu)",
        interval=2,
    )
    assert "HFRolloutServer" not in log, log[-3000:]
    calls = wait_until(
        lambda: _tool_calls_counted(tc, name), 120, f"the pool to count {name}'s tool calls", interval=5
    )
    owned = _everything_of(tc, name)
    assert any(o.startswith("RayCluster/") for o in owned) and any(o.startswith("Pod/") for o in owned), owned
    delete_at = time.monotonic()
    tc.kubectl("delete", "toolrljob", name, "-n", tc.namespace, "--wait=false")
    wait_until(
        lambda: not _everything_of(tc, name), DELETION_BOUND, f"everything of {name} to go", interval=1
    )
    return DeletedRun(first_step, calls, owned, time.monotonic() - delete_at)


@pytest.fixture(scope="module")
def deleted(tc: TrainingCluster) -> Iterator[Future[DeletedRun]]:
    """`_delete_mid_training` in a thread of its own, started before the separate-async job is applied
    (`separate` asks for it): the two verl start-ups overlap instead of following each other."""
    with ThreadPoolExecutor(1, thread_name_prefix="deleted-job") as pool:
        yield pool.submit(_delete_mid_training, tc)


def test_a_job_deleted_mid_training_leaves_nothing_behind(deleted: Future[DeletedRun]) -> None:
    run = deleted.result(timeout=TRAINING_TIMEOUT + DELETION_BOUND + 300)  # its checks raise here
    print(
        f"\ndeleted: engine vllm trained step 1 {run.first_step:.0f} s after the apply, {run.calls:.0f} tool"
        f" calls; {len(run.owned)} objects gone {run.gone:.1f} s after the delete: "
        + ", ".join(sorted(run.owned))
    )
