"""kopf glue: the operator's runtime, kept in kopf's memo; watches that feed the reconcile queue,
and the indexes the sync and the autoscaler read. No handler reconciles by itself: every event of a
job, of any of its children (one list, children.CHILD_KINDS) or of its pods only adds the job's key
to the queue (reconcile.py), so an event is never lost to a handler error (kopf logs and drops those
of `on.event`) and a burst of events of one job costs one sync.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import kopf

from . import leader
from .apply import Kube, load_api_client, owns
from .children import CHILD_KINDS
from .leader import LeaderElector
from .naming import (
    AUTOSCALER_FIELD_MANAGER,
    COMPONENT_TOOL_POOL,
    FIELD_MANAGER,
    GROUP,
    LABEL_COMPONENT,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_RAY_CLUSTER,
    LABEL_RAY_GROUP,
    LABEL_RAY_NODE_TYPE,
    MANAGED_BY,
    PLURAL,
    VERSION,
)
from .rayjob import worker_groups
from .reconcile import Reconciler
from .scale_loop import Autoscaler
from .settings import Settings
from .status import lost_trainer, node_condition, pod_node, pod_ready, pod_waiting_cause

log = logging.getLogger(__name__)
Key = tuple[str, str]
OWNED = {LABEL_MANAGED_BY: MANAGED_BY}
# each index keeps one view of an object per job key (job_view, rayjob_view, deployment_view)
ViewIndex = kopf.Index[Key, dict[str, Any]]


# Blocking calls at once: the threads of the runtime's pool, and as many connections of the API
# client (a call on a thread never waits for one). More than the sync workers (Reconciler.workers).
THREADS = 32
# How long a stopping operator waits for the syncs under way before it gives its Lease up
DRAIN_SECONDS = 20.0  # within the pod's 30 s of grace


class Runtime:
    """What the operator holds for its lifetime: the settings, the API client, the one thread pool,
    the reconciler and the autoscaler. The start-up handler makes it and keeps it in kopf's memo
    (`memo.runtime`), where the handlers read it.

    Threads: the event loop runs kopf's watches, the handlers, the work queue and the autoscaler's
    reads of the pools' load (aiohttp). Every blocking call (the kubernetes package is synchronous)
    runs on `threads`, one pool of THREADS: each sync (Reconciler.workers at a time), the children a
    sync applies in parallel, the autoscaler's writes. A sync waits for its applies, which wait for
    nothing, so with more threads than sync workers the pool always has one for them. (kopf's own
    executor runs kopf's synchronous handlers: the index functions below.)"""

    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        jobs: Mapping[Key, Iterable[dict[str, Any]]],
        rayjobs: Mapping[Key, Iterable[dict[str, Any]]],
        deployments: Mapping[Key, Iterable[dict[str, Any]]],
        elector: LeaderElector | None = None,
    ) -> None:
        self.settings, self.kube, self.elector = settings, kube, elector
        self.threads = ThreadPoolExecutor(THREADS, thread_name_prefix="toolrl")
        self.reconciler = Reconciler(settings, kube, self.threads, jobs, rayjobs, deployments)
        workers = self.reconciler.workers
        if workers >= THREADS:  # every thread a sync waiting on applies queued behind it: none would run
            raise ValueError(f"{workers} sync workers need more than THREADS={THREADS} threads")
        self.autoscaler = Autoscaler(
            settings, kube, self.threads, jobs, deployments, self.reconciler.ready_pods
        )
        self.tasks: list[asyncio.Task[None]] = []  # the leader election's
        # the election's calls on a thread of their own: a burst of syncs never delays a renewal
        self.election_thread = ThreadPoolExecutor(1, thread_name_prefix="toolrl-election")
        self.work: list[asyncio.Task[None]] = []  # the reconciler's and the autoscaler's

    def start(self) -> None:
        """Start the work (the reconciler's workers and resync, the autoscaler's loop): at once, or
        with leader election, once this process holds the Lease (leader.py)."""
        if self.elector is None:
            self._start_work()
        else:
            self.tasks = [asyncio.create_task(self._lead(self.elector), name="toolrl leader election")]

    def _start_work(self) -> None:
        self.work = [
            asyncio.create_task(self.reconciler.run(self.settings.resync_seconds), name="toolrl reconciler"),
            asyncio.create_task(self.autoscaler.run(), name="toolrl autoscaler"),
        ]

    async def _stop_work(self) -> None:
        for task in self.work:
            task.cancel()
        await asyncio.gather(*self.work, return_exceptions=True)
        self.work = []

    async def _lead(self, elector: LeaderElector) -> None:
        """Acquire the Lease, start the work, renew; when the Lease is lost (another holder seen, or no
        renewal within the deadline), stop the work and the operator: its pod starts again as a
        candidate, as client-go's OnStoppedLeading exits."""
        loop = asyncio.get_running_loop()
        log.info("leader election: %s waits for the Lease %s/%s", elector.identity, *elector.lease_key)
        while True:
            try:
                round_ = loop.run_in_executor(self.election_thread, elector.try_acquire_or_renew)
                held = await asyncio.wait_for(round_, leader.RENEW_DEADLINE_SECONDS)
            except Exception as err:  # an API error or a hung call: the next round tries again
                log.warning("leader election: the Lease was not read or written: %s", err)
                held = False
            if held and not self.work:
                self._start_work()
            elif self.work and not elector.held_for_sure():
                log.error(
                    "leader election: lost the Lease %s/%s (holder now %r); stopping the operator",
                    *elector.lease_key,
                    elector.holder,
                )
                await self._stop_work()
                os.kill(os.getpid(), signal.SIGTERM)  # kopf stops gracefully; the pod restarts it
                return
            await asyncio.sleep(leader.RETRY_SECONDS)

    async def stop(self) -> None:
        """Cancel the work and the election and wait for them to end; once the syncs under way
        have ended (their calls are bounded), give the Lease up, so that the next operator never
        acts beside them (if they outlast the bound, the Lease expires instead)."""
        loop = asyncio.get_running_loop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self._stop_work()
        drained = loop.run_in_executor(None, partial(self.threads.shutdown, wait=True, cancel_futures=True))
        try:
            await asyncio.wait_for(drained, DRAIN_SECONDS)
        except TimeoutError:
            log.warning("syncs still under way after %.0f s: the Lease is left to expire", DRAIN_SECONDS)
        else:
            if self.elector is not None:
                try:
                    release = loop.run_in_executor(self.election_thread, self.elector.release)
                    await asyncio.wait_for(release, leader.RENEW_DEADLINE_SECONDS)
                except Exception as err:  # the Lease then expires by itself
                    log.warning("leader election: the Lease was not released: %s", err)
        self.election_thread.shutdown(wait=False, cancel_futures=True)


def runtime(memo: kopf.Memo) -> Runtime:
    """The runtime the start-up handler kept in kopf's memo."""
    found: Runtime = memo.runtime
    return found


def plain(obj: Any) -> Any:
    """A deep plain-dict copy of a kopf body view, safe to keep and to mutate."""
    if isinstance(obj, Mapping):
        return {key: plain(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(value) for value in obj]
    return obj


def index(kwargs: Mapping[str, Any], name: str) -> ViewIndex:
    """The index of that name (the indexing function's) among a handler's keyword arguments: kopf
    passes its indexes to every handler, but its handler types do not name them."""
    found: ViewIndex = kwargs[name]
    return found


def job_key(namespace: str | None, job: str) -> Key:
    """The key of a job in the indexes and the queue. kopf types a handler's `namespace` as optional
    (for cluster-scoped resources); every object the operator watches is namespaced."""
    if namespace is None:
        raise ValueError(f"job {job}: an object without a namespace")
    return namespace, job


# ---- start-up and clean-up: kopf's settings, the runtime ------------------------------------


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Run handlers wide; cut silent watches (dask-kubernetes does the same, citing kopf
    watches that hang without an error)."""
    settings.execution.max_workers = 16
    settings.posting.level = logging.WARNING  # our own Events say what happened (events.py)
    settings.posting.reporting_component = MANAGED_BY
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    watch_only_owned(settings)


# What the API server sends the operator's watches of children and pods: only its own objects.
# (kopf's `labels=` filters of a handler are applied in the operator, after the whole resource
# has been listed and watched: on a real cluster, every pod and ConfigMap.)
OWNED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}"


def watched_resources() -> list[tuple[str, str] | tuple[str, str, str]]:
    """kopf resource selectors of the children's and pods' watches."""
    kinds: list[tuple[str, str] | tuple[str, str, str]] = [
        (c.group, c.version, c.plural) if c.group else (c.version, c.plural) for c in CHILD_KINDS if c.watched
    ]
    return [*kinds, ("v1", "pods")]


def watch_only_owned(settings: kopf.OperatorSettings) -> None:
    for resource in watched_resources():
        settings.watching.label_selectors[resource] = OWNED_SELECTOR


# A settings or credentials error is the environment's: the operator exits at once, before any watch.
@kopf.on.startup(errors=kopf.ErrorsMode.PERMANENT)
async def start(memo: kopf.Memo, **kwargs: Any) -> None:
    """Make the runtime, keep it in the memo and start it; the indexes fill as kopf's watches come in."""
    kube = Kube(load_api_client(THREADS), FIELD_MANAGER)
    settings = Settings.from_env()
    lease = settings.leader_election_lease
    elector = leader.LeaderElector(kube, lease, leader.identity()) if lease else None
    jobs, rayjobs, deployments = (index(kwargs, name) for name in ("jobs", "rayjobs", "deployments"))
    rt = Runtime(settings, kube, jobs, rayjobs, deployments, elector)
    rt.start()
    memo.runtime = rt


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await runtime(memo).stop()


# ---- indexes: what the sync and the autoscaler read ------------------------------------------


@kopf.index(GROUP, VERSION, PLURAL)
def jobs(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {job_key(namespace, name): job_view(body)}


def job_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """A job as the index keeps it: without managedFields and annotations, which nothing read
    from the index needs and which were most of the operator's memory in a burst of jobs."""
    job: dict[str, Any] = plain(body)
    job["metadata"] = {k: v for k, v in job["metadata"].items() if k not in ("managedFields", "annotations")}
    return job


@kopf.index("ray.io", "v1", "rayjobs", labels=OWNED)
def rayjobs(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {job_key(namespace, labels[LABEL_JOB]): rayjob_view(body)}


@kopf.index("apps", "v1", "deployments", labels={**OWNED, LABEL_COMPONENT: COMPONENT_TOOL_POOL})
def deployments(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Key, dict[str, Any]]:
    return {job_key(namespace, labels[LABEL_JOB]): deployment_view(body)}


def rayjob_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a RayJob the status needs; the cluster template is left out to save memory
    (of its worker groups, `workerGroups` keeps what the status shows: rayjob.worker_groups)."""
    return {
        "metadata": {"name": body["metadata"]["name"]},
        "spec": {"suspend": body.get("spec", {}).get("suspend", False)},
        "status": plain(body.get("status") or {}),
        "workerGroups": worker_groups(body),
    }


def deployment_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the pool Deployment the status, the sync and the autoscaler need; of its
    managedFields, whether the autoscaler's field manager owns spec.replicas (toolpool.py)."""
    return {
        "metadata": {"name": body["metadata"]["name"], "generation": body["metadata"].get("generation", 0)},
        "spec": {"replicas": body.get("spec", {}).get("replicas", 0)},
        "status": plain(body.get("status") or {}),
        "autoscaled": owns(body, AUTOSCALER_FIELD_MANAGER, "spec", "replicas"),
    }


# ---- watches: each event queues its job -----------------------------------------------------
# Async: an event costs no thread hop, only a set lookup.


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(type: str, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    runtime(memo).reconciler.job_seen(job_key(namespace, name), deleted=type == "DELETED")


async def child_event(
    type: str, body: kopf.Body, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    meta = body["metadata"]
    runtime(memo).reconciler.child_seen(
        job_key(namespace, labels[LABEL_JOB]),
        body["kind"],
        meta["name"],
        meta.get("resourceVersion", ""),
        deleted=type == "DELETED",
    )


for _child in CHILD_KINDS:
    if _child.watched:
        kopf.on.event(
            _child.group, _child.version, _child.plural, labels={**OWNED, LABEL_JOB: kopf.PRESENT},
            id=f"child/{_child.plural}",
        )(child_event)  # fmt: skip


@kopf.on.event("", "v1", "pods", labels={**OWNED, LABEL_JOB: kopf.PRESENT})
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """The job's Ray, submitter and tool-pool pods (KubeRay copies the templates' labels): why
    they wait, whether a submitter pod shows the trainer lost, a Ray pod's group (KubeRay's
    label) and readiness, and a ready pool pod's or Ray head's IP (the autoscaler's targets)."""
    runtime(memo).reconciler.pod_seen(
        job_key(namespace, labels[LABEL_JOB]),
        body["metadata"]["name"],
        labels.get(LABEL_COMPONENT, ""),
        pod_waiting_cause(body),
        deleted=type == "DELETED",
        lost=lost_trainer(body),
        group=labels.get(LABEL_RAY_GROUP, ""),
        ready=pod_ready(body),
        ip=(body.get("status") or {}).get("podIP") or "",
        head=labels.get(LABEL_RAY_NODE_TYPE) == "head",
        node=pod_node(body),
        cluster=labels.get(LABEL_RAY_CLUSTER, ""),
    )


@kopf.on.event("", "v1", "nodes")
async def node_event(type: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A node's readiness: a job whose pods are bound to a node that is not Ready names it in its
    status (a lost machine: its pods stay Running in the API until they are evicted)."""
    runtime(memo).reconciler.node_seen(name, None if type == "DELETED" else node_condition(body))
