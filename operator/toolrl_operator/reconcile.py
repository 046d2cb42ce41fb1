"""Level-based reconciliation, as controller-runtime (and so KubeRay) does it.

Every watch event of a job, of any of its children or of its pods adds the job's key to one work
queue (handlers.py). Workers take keys from it; for a key, `sync` does one idempotent pass: parse
the job's spec into its typed form (job.py; a spec that does not parse is reported once per
generation, naming the field, and nothing is applied), build every child from the job as it is now,
server-side apply the ones that may differ from the cluster, compute the status from the children,
and write it if it changed. Syncs of one key never overlap (the queue hands a key to one worker at
a time). A child that is not applied says so in the job's status either way: `Reconciled` False with
the API's reason (QuotaExceeded, Forbidden, Invalid, InternalError...) and its message naming the
child, and the phase's reason and message (a transient one from its first retry on: a blip the retry
clears is not written). A transient failure (a conflict, throttling, a server error, a connection
reset, a quota, a full Service range) requeues the key with exponential backoff (one Warning Event
per streak); a permanent one (a manifest the API server rejects, KEDA not set up) posts
one Event and waits for a spec change (or the periodic resync, which also catches anything a watch
missed). The condition clears with the first sync that applies every child.

What is cached, and why it is safe: for each child, the hash of the manifest last applied and
the resourceVersion the API server answered with. Between resyncs a child is skipped while both
still hold (its watch shows the same resourceVersion): any edit, deletion or status change of the
child changes its resourceVersion and gets it applied again. The periodic resync applies every
child regardless (server-side apply of an unchanged object is a no-op write): it repairs what no
watch reports, a deletion in a watch gap or any change of an unwatched kind (the ScaledObject).
A child whose uid changed across an apply was re-created, and the job's Events say so.

The pool's size is left out of the operator's apply of its Deployment once the autoscaler's field
manager owns it: the autoscaler writes it through the Deployment's scale subresource, and so does
the sync, as that manager, only where it must change whatever the autoscaler decides (0 while the
job is suspended or finished, back within edited bounds) or to hand a new pool's size over to that
manager (toolpool.py says who writes it when). Applying never fights the autoscaler.

Threads: a sync runs on the runtime's thread pool (handlers.Runtime), and applies a job's independent
children in parallel on the same pool. The watches (on the event loop) and the syncs share a job's
`JobState`; what both touch (`live`, `pods`) is read and written under its lock, which is never
held across an API call.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from . import events
from .apply import RETRIABLE, ApiError, Kube
from .children import BY_KIND, Live, build_children, status_read_by_builders
from .job import Job, SpecError, parse_job
from .keda import KedaConfigError, explain_api_error
from .metrics import PHASES, RECONCILE_DURATION, RECONCILE_ERRORS
from .naming import (
    API_VERSION,
    COMPONENT_TOOL_POOL,
    COMPONENT_TRAINER,
    KIND,
    tool_pool_name,
)
from .settings import Settings
from .status import (
    FAILED,
    RECONCILED,
    RECOVERING,
    RESUMED,
    TRAINER_RESTARTED,
    LostNode,
    LostTrainer,
    Problems,
    compute_status,
    now,
    ray_cluster,
    status_changes,
)
from .toolpool import Pool, resize, scale_pool
from .workqueue import WorkQueue

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, job name)
ChildId = tuple[str, str]  # (kind, name) within the job's namespace
DELETED = ""  # a child's resourceVersion once its watch saw it deleted
INVALID_SPEC = "InvalidSpec"  # the reason of a spec that does not parse (job.SpecError)
# A transient refusal reaches the status once it outlasts this many attempts (the first retry comes
# 1 s later): a conflict or a throttled call that the retry clears costs no two status writes.
TRANSIENT_UNREPORTED = 1


class PermanentError(Exception):
    """The children cannot be applied as the spec stands; retrying will not help."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


class ChildError(Exception):
    """One child was not applied: which one, and why (the API's refusal, or no answer)."""

    def __init__(self, kind: str, name: str, cause: Exception) -> None:
        super().__init__(f"{kind} {name} not applied: {cause}")
        self.kind, self.name, self.cause = kind, name, cause

    @property
    def reason(self) -> str:
        return refusal_reason(self.cause)


# metav1.Condition's reason: CamelCase, what `kubectl get -o wide` and alerts match on
CONDITION_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
QUOTA_EXCEEDED = "QuotaExceeded"


def refusal_reason(err: Exception) -> str:
    """A condition reason for why an API call failed: the API server's own (Forbidden, Invalid,
    InternalError...), QuotaExceeded for a ResourceQuota's refusal, the HTTP status's name where
    the answer had no Kubernetes reason (a proxy's), the exception's type where no answer came."""
    if isinstance(err, KedaConfigError):
        return "KedaConfig"
    if not isinstance(err, ApiError):
        return type(err).__name__
    if err.status == 403 and "exceeded quota" in err.message:
        return QUOTA_EXCEEDED
    if CONDITION_REASON.fullmatch(err.reason):
        return err.reason
    try:
        return "".join(HTTPStatus(err.status).phrase.title().split())
    except ValueError:
        return f"HTTPStatus{err.status}"


def classify(err: Exception) -> PermanentError | None:
    """A PermanentError for errors no retry fixes, None for transient ones. A quota refusal is
    a 403 that goes away when the quota is raised or other objects go: transient."""
    cause = err.cause if isinstance(err, ChildError) else err
    if isinstance(cause, KedaConfigError):
        return PermanentError("KedaConfig", str(err))
    if isinstance(cause, ApiError):
        if cause.status == 500 and "failed to convert new object" in cause.message:
            # how server-side apply reports a field the object's type cannot hold (seen: a
            # malformed quantity): the manifest, not the server, is wrong
            return PermanentError("Invalid", str(err))
        if cause.status in RETRIABLE or (cause.status == 403 and "quota" in cause.message.lower()):
            return None
        if cause.status == 404 and "could not find the requested resource" not in cause.message:
            return None  # an object, not the API, is missing (an apply racing a deletion): retry
        if 400 <= cause.status < 500:
            return PermanentError(refusal_reason(cause), str(err))
    return None


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:20]


def inputs_key(job: Job, settings: Settings, live: Live) -> bytes:
    """A digest of everything the builders (and the pool's resize) read: the job's metadata (less
    its resourceVersion, which every write of its status changes) and spec, the fields of its status
    they read (not the conditions and messages every status write changes), the settings, what they
    know of the live children (the RayJob's suspend, the pool's size and its owner)."""
    meta = {k: v for k, v in job.metadata.items() if k != "resourceVersion"}
    inputs = [meta, job.body.get("spec"), status_read_by_builders(job.status), repr(settings), repr(live)]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).digest()


def _current(applied: Applied | None, digest: str, live_version: str | None) -> bool:
    """Whether the child needs no apply: applied as built, and its watch shows that apply's state."""
    return applied is not None and applied.digest == digest and applied.resource_version == live_version


def first(store: Iterable[Any] | None) -> Any:
    return next(iter(store), None) if store is not None else None


@dataclass(frozen=True)
class PodSeen:
    """What the status needs of one of the job's pods."""

    component: str
    cause: tuple[str, str] | None  # why it waits (pod_waiting_cause)
    lost: LostTrainer | None  # the trainer it shows lost (lost_trainer)
    group: str = ""  # a Ray pod's group (KubeRay's ray.io/group label: a worker group, headgroup)
    ready: bool = False  # pod_ready
    ip: str = ""  # its IP while it is ready (the autoscaler scrapes it: ready_pods)
    head: bool = False  # a Ray head (KubeRay's ray.io/node-type label), where the trainer serves metrics
    node: str = ""  # the node it holds a place on (pod_node)
    cluster: str = ""  # a Ray pod's RayCluster (KubeRay's ray.io/cluster label)


@dataclass(frozen=True)
class Applied:
    """A child as the API server answered its last apply."""

    digest: str  # manifest_hash of what was applied
    resource_version: str
    uid: str


@dataclass
class JobState:
    """What the operator remembers of one job between syncs (dropped when the job goes)."""

    # written by the watches and the syncs: under `lock`
    live: dict[ChildId, str] = field(default_factory=dict)  # resourceVersion by watch (DELETED: gone)
    pods: dict[str, PodSeen] = field(default_factory=dict)
    # the syncs' own (one sync of a job at a time)
    applied: dict[ChildId, Applied] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)  # the operator's fields as last written
    permanent: tuple[int, str, str, float] | None = None  # generation, reason, message, when
    reapply: bool = True  # the next sync applies every child, cached or not (resync sets it)
    refused: int = 0  # syncs in a row that a transient error stopped
    # what the builders made of the inputs last time: inputs_key(...) and each child's digest
    built: tuple[bytes, tuple[tuple[ChildId, str], ...]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class Reconciler:
    """The queue, its workers and the one sync. `threads` runs the syncs and their applies (more
    threads than `workers`: handlers.Runtime). `jobs`, `rayjobs` and `deployments` are the
    operator's kopf indexes (key -> views), read, never written."""

    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        threads: Executor,
        jobs: Mapping[Key, Iterable[dict[str, Any]]],
        rayjobs: Mapping[Key, Iterable[dict[str, Any]]],
        deployments: Mapping[Key, Iterable[dict[str, Any]]],
        workers: int = 8,
    ) -> None:
        self.settings, self.kube, self.threads = settings, kube, threads
        self.jobs, self.rayjobs, self.deployments = jobs, rayjobs, deployments
        self.workers = workers
        self.queue: WorkQueue[Key] = WorkQueue()
        self.state: dict[Key, JobState] = {}
        # nodes that are not Ready -> their Ready condition as the status names it (node_seen); the
        # dict is replaced, never changed in place, as the sync threads read it
        self.unready_nodes: dict[str, str] = {}

    # ---- what the watches report (called on the event loop) --------------------------------

    def job_seen(self, key: Key, deleted: bool) -> None:
        if deleted:
            self.state.pop(key, None)
            self.queue.forget(key)
            PHASES.record(key[0], key[1], None)
        else:
            self.queue.add(key)

    def node_seen(self, name: str, condition: str | None) -> None:
        """A node's readiness (status.node_condition: None while Ready, or once deleted): when it
        changes, the jobs with pods bound to it are synced (their status names a lost node)."""
        if self.unready_nodes.get(name) == condition:
            return
        unready = {k: v for k, v in self.unready_nodes.items() if k != name}
        if condition is not None:
            unready[name] = condition
        self.unready_nodes = unready
        for key, state in list(self.state.items()):
            with state.lock:
                bound = any(pod.node == name for pod in state.pods.values())
            if bound:
                self.queue.add(key)

    def child_seen(self, key: Key, kind: str, name: str, resource_version: str, deleted: bool) -> None:
        if first(self.jobs.get(key)) is None:
            return  # the job is gone (its children are garbage-collected) or not listed yet
        state = self.state.setdefault(key, JobState())
        with state.lock:
            state.live[(kind, name)] = DELETED if deleted else resource_version
        self.queue.add(key)

    def pod_seen(
        self,
        key: Key,
        name: str,
        component: str,
        cause: tuple[str, str] | None,
        deleted: bool,
        lost: LostTrainer | None = None,
        group: str = "",
        ready: bool = False,
        ip: str = "",
        head: bool = False,
        node: str = "",
        cluster: str = "",
    ) -> None:
        """A pod of the job: only a change of why it waits, of whether it shows a lost trainer, of
        whether it is a Ready pod of its Ray group, or of its node matters to the status (the IP of
        a ready pod is kept for the autoscaler)."""
        state = self.state.get(key)
        if state is None:
            if deleted:
                return
            state = self.state.setdefault(key, JobState())  # pruned by resync if the job is gone
        seen = None
        if not deleted:
            seen = PodSeen(component, cause, lost, group, ready, ip if ready else "", head, node, cluster)
        with state.lock:
            before = state.pods.pop(name, None)
            if seen is not None:
                state.pods[name] = seen
        if _shown(before) != _shown(seen):
            self.queue.add(key)

    def ready_pods(self, key: Key) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(name, IP) of the job's ready tool-pool pods and of its ready Ray heads, by name, as the
        pod watch last saw them (what the autoscaler scrapes without Prometheus)."""
        state = self.state.get(key)
        if state is None:
            return [], []
        with state.lock:
            pods = sorted((name, pod) for name, pod in state.pods.items() if pod.ip)
        pool = [(name, pod.ip) for name, pod in pods if pod.component == COMPONENT_TOOL_POOL]
        return pool, [(name, pod.ip) for name, pod in pods if pod.head]

    def resync(self) -> None:
        """Queue every known job for a sync that applies all its children: repairs anything no
        watch reported, retries permanent errors."""
        keys = set(self.jobs)
        for key in self.state.keys() - keys:
            del self.state[key]
        for key in keys:
            state = self.state.setdefault(key, JobState())
            with state.lock:
                state.reapply = True
            self.queue.add(key)

    # ---- workers -------------------------------------------------------------------------------

    async def run(self, resync_seconds: float) -> None:
        """The workers and the periodic resync, until cancelled."""
        tasks = [asyncio.create_task(self._worker(), name=f"toolrl sync {i}") for i in range(self.workers)]
        try:
            while True:
                await asyncio.sleep(resync_seconds)
                self.resync()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            key = await self.queue.get()
            try:
                await loop.run_in_executor(self.threads, self.sync, key)
                self.queue.succeeded(key)
            except Exception as err:  # transient: back off and try again
                delay = self.queue.retry(key)
                RECONCILE_ERRORS.labels(getattr(err, "reason", "") or type(err).__name__).inc()
                log.warning("sync of %s/%s failed, retrying in %.0f s: %s", *key, delay, err)
                if self.queue.failures(key) == 1:  # once per streak, not per retry (a blocking call)
                    message = f"retrying: {err}"
                    await loop.run_in_executor(
                        self.threads, self._post, key, events.WARNING, events.RECONCILE_ERROR, message
                    )
            finally:
                self.queue.done(key)

    # ---- the sync --------------------------------------------------------------------------

    def sync(self, key: Key) -> None:
        """One idempotent pass over one job (blocking; runs on the runtime's thread pool)."""
        job = first(self.jobs.get(key))
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        started = time.monotonic()
        state = self.state.setdefault(key, JobState())
        generation = int(job["metadata"].get("generation") or 1)
        rayjob = first(self.rayjobs.get(key))
        try:
            parsed = parse_job({**job, "status": overlay(job.get("status") or {}, state.status)})
        except SpecError as err:
            self._report_invalid_spec(key, job, state, generation, str(err))
            return
        error: tuple[str, str] | None = None
        transient: ChildError | None = None  # reported in the status, then raised for the backoff
        announcements: list[tuple[str, str, str]] = []
        created = False  # this sync applied a new job's children
        waiting_on_spec = (
            state.permanent is not None
            and state.permanent[0] == generation
            and time.monotonic() - state.permanent[3] < self.settings.resync_seconds
        )
        if waiting_on_spec:
            assert state.permanent is not None
            error = state.permanent[1:3]
        else:
            try:
                announcements = self._apply_children(parsed, rayjob, state)
                state.permanent, state.refused = None, 0
                observed = int(parsed.status.get("observedGeneration") or 0)
                created = not observed
                if observed and generation > observed:
                    message = f"applied generation {generation} of the spec"
                    announcements.insert(0, (events.NORMAL, events.SPEC_APPLIED, message))
            except Exception as err:
                permanent = classify(err)
                if permanent is None and not isinstance(err, ChildError):
                    raise
                if permanent is None:
                    assert isinstance(err, ChildError)
                    state.refused += 1
                    if state.refused <= TRANSIENT_UNREPORTED:
                        raise  # a blip (a conflict, a race, a throttled call) its first retry clears
                    transient, error = err, (err.reason, f"{err} (retried with backoff)")
                else:
                    error = (permanent.reason, permanent.message)
                    if state.permanent is None or state.permanent[:3] != (generation, *error):
                        log.warning("sync of %s/%s: %s (waits for a spec change)", *key, permanent)
                        RECONCILE_ERRORS.labels(permanent.reason).inc()
                        announcements = [(events.WARNING, events.RECONCILE_ERROR, permanent.message)]
                    state.permanent = (generation, *error, time.monotonic())
        if created:
            # posted before the status that marks the job created, under a name of the job's own: a
            # sync cut short in between (the operator killed, the post refused) posts it again, and the
            # API server keeps one
            self._post(key, events.NORMAL, events.CREATED, "created the job's children", job, once=True)
        problems = Problems(
            reconcile_error=error,
            trainer_waiting=_first_cause(state, COMPONENT_TRAINER),
            pool_waiting=_first_cause(state, COMPONENT_TOOL_POOL),
            lost_trainers=_lost_trainers(state),
            lost_nodes=_lost_nodes(state, self.unready_nodes, ray_cluster(first(self.rayjobs.get(key)))),
        )
        try:
            self._write_status(key, parsed, state, generation, problems, _ready_workers(state), announcements)
        except Exception as err:
            if transient is None:
                raise
            log.warning("status of %s/%s not written: %s", *key, err)  # the refusal is raised below
        RECONCILE_DURATION.observe(time.monotonic() - started)
        if transient is not None:
            raise transient  # the work queue retries the key with backoff (and posts its Event)

    def _report_invalid_spec(
        self, key: Key, job: dict[str, Any], state: JobState, generation: int, message: str
    ) -> None:
        """A spec that does not parse (the API server validates what it admits; an object stored
        under an older CRD may not fit): one Warning Event per generation naming the fields, the
        children and the status left as they are until the spec changes."""
        if state.permanent is not None and state.permanent[:3] == (generation, INVALID_SPEC, message):
            return
        log.warning("sync of %s/%s: %s (waits for a spec change)", *key, message)
        RECONCILE_ERRORS.labels(INVALID_SPEC).inc()
        state.permanent = (generation, INVALID_SPEC, message, time.monotonic())
        self._post(key, events.WARNING, events.RECONCILE_ERROR, message, job)

    def _apply_children(
        self, job: Job, rayjob: dict[str, Any] | None, state: JobState
    ) -> list[tuple[str, str, str]]:
        """Apply the children that may differ from the cluster; what to announce. The builders are
        pure: inputs equal to the last sync's give the same manifests, so while every child is
        applied as built and its watch shows that apply's resourceVersion, nothing is built."""
        seen = Live(
            rayjob_suspend=rayjob["spec"]["suspend"] if rayjob else None,
            pool=_pool(first(self.deployments.get((job.namespace, job.name)))),
        )
        with state.lock:
            reapply, state.reapply = state.reapply, False
            live = dict(state.live)
        key = inputs_key(job, self.settings, seen)
        if not reapply and state.built is not None and state.built[0] == key:
            applied = state.applied
            if all(_current(applied.get(child), digest, live.get(child)) for child, digest in state.built[1]):
                return []
        children = build_children(job, self.settings, seen)
        due, built = [], []
        for manifest in children:
            child = (manifest["kind"], manifest["metadata"]["name"])
            digest = manifest_hash(manifest)
            built.append((child, digest))
            if reapply or not _current(state.applied.get(child), digest, live.get(child)):
                due.append((child, digest, manifest))
        state.built = (key, tuple(built))
        try:
            return self._apply_due(job, rayjob, state, due, resize(job, seen.pool))
        except Exception:
            state.built = None  # the cache knows the children, not a resize: the next sync builds again
            if reapply:  # what this resync's pass did not get through is applied in full next time
                with state.lock:
                    state.reapply = True
            raise

    def _apply_due(
        self,
        job: Job,
        rayjob: dict[str, Any] | None,
        state: JobState,
        due: list[tuple[ChildId, str, dict[str, Any]]],
        size: int | None = None,
    ) -> list[tuple[str, str, str]]:
        announcements: list[tuple[str, str, str]] = []
        others = [item for item in due if not BY_KIND[item[0][0]].after_others]
        # Independent objects go in parallel; then, one by one, those that refer to them.
        futures = [self.threads.submit(self._apply, manifest) for _, _, manifest in others]
        failure: Exception | None = None
        for (child, digest, _), future in zip(others, futures, strict=True):
            try:
                announcements += _remember(state, child, digest, future.result())
            except Exception as err:  # the others are still remembered: not re-applied next time
                failure = failure or err
        if size is not None:  # after the Deployment's apply: a hand-over follows the size it applied
            try:
                self._resize(job, size)
            except Exception as err:  # a pool still goes to 0 on suspension when another child fails
                failure = failure or err
        if failure is not None:
            raise failure
        for child, digest, manifest in [item for item in due if BY_KIND[item[0][0]].after_others]:
            previous = state.applied.get(child)
            announcements += _remember(state, child, digest, self._apply(manifest))
            if child[0] != "RayJob":
                continue
            wanted = bool(manifest["spec"].get("suspend"))
            changed = previous is None or previous.digest != digest
            kueue = bool(job.spec.cluster.queue_name)  # then Kueue suspends and resumes
            if changed and not kueue and rayjob is not None and bool(rayjob["spec"]["suspend"]) != wanted:
                announcements.append(_suspension(wanted))
        return announcements

    def _apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Apply one child; a failure raises ChildError, which names it. A ScaledObject the cluster
        refuses says how to set KEDA up."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            return self.kube.apply(manifest)
        except ApiError as err:
            advice = explain_api_error(err.status) if kind == "ScaledObject" else ""
            cause: Exception = KedaConfigError(f"{advice} ({err})") if advice else err
            raise ChildError(kind, name, cause) from err
        except Exception as err:
            raise ChildError(kind, name, err) from err

    def _resize(self, job: Job, replicas: int) -> None:
        """Size the pool through its Deployment's scale subresource, as the autoscaler's field manager
        (toolpool.resize says when); a failure raises ChildError, which names the Deployment."""
        try:
            scale_pool(self.kube, job.namespace, job.name, replicas)
        except Exception as err:
            raise ChildError("Deployment", tool_pool_name(job.name), err) from err

    def _write_status(
        self,
        key: Key,
        job: Job,
        state: JobState,
        generation: int,
        problems: Problems,
        ready_workers: Mapping[str, int],
        announcements: list[tuple[str, str, str]],
    ) -> None:
        old = job.status
        rayjob, deployment = first(self.rayjobs.get(key)), first(self.deployments.get(key))
        new = compute_status(job, rayjob, deployment, generation, now(), problems, ready_workers)
        PHASES.record(key[0], key[1], new["phase"])
        if status_changes(old, new):
            try:
                self.kube.apply_status(API_VERSION, KIND, key[0], key[1], new)
            except ApiError as err:
                if err.status == 404:
                    return  # the job is gone
                raise
            state.status = new
        announcements += status_announcements(old, new)
        for type_, reason, message in announcements:
            self._post(key, type_, reason, message, job.body)

    def _post(
        self,
        key: Key,
        type_: str,
        reason: str,
        message: str,
        job: Mapping[str, Any] | None = None,
        once: bool = False,
    ) -> None:
        """An Event on the job; best effort, as kopf's own are. `once`: exactly one of this reason
        in the job's life (events.once_name): a refusal other than its conflict raises, and the
        work queue retries the sync that posts it."""
        job = job or first(self.jobs.get(key))
        if job is None:
            return
        manifest = events.event_manifest(job, type_, reason, message, dt.datetime.now(dt.UTC), once=once)
        try:
            self.kube.create(manifest)
        except Exception as err:
            if once and isinstance(err, ApiError) and err.status == HTTPStatus.CONFLICT:
                return  # posted before
            if once:
                raise
            log.warning("event %s on %s/%s not posted: %s", reason, *key, err)


def _remember(
    state: JobState, child: ChildId, digest: str, live: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """Record what the API answered (as current as a watch event); announce a re-creation: the
    child was deleted since its last apply (seen by a watch, or found at a resync)."""
    meta = live["metadata"]
    previous = state.applied.get(child)
    state.applied[child] = Applied(digest, meta["resourceVersion"], meta.get("uid", ""))
    with state.lock:
        state.live[child] = meta["resourceVersion"]
    if previous is None or previous.uid == meta.get("uid", ""):
        return []
    return [(events.WARNING, events.CHILD_DELETED, f"re-created the deleted {child[0]} {child[1]}")]


def _suspension(suspended: bool) -> tuple[str, str, str]:
    if suspended:
        return events.NORMAL, events.SUSPENDED, "suspended the RayJob and scaled the tool pool to 0"
    return events.NORMAL, events.RESUMED, "resumed the RayJob and the tool pool"


def overlay(status: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """`status` with the operator's last written fields on top: the index may not have seen that
    write yet. Others' fields inside a shared object (the autoscaler's toolPool.desiredReplicas,
    its condition) stay."""
    merged = dict(status)
    for key, value in ours.items():
        if key == "conditions":
            mine = {c["type"] for c in value}
            merged[key] = [c for c in status.get(key, []) if c["type"] not in mine] + list(value)
        elif isinstance(value, dict) and isinstance(status.get(key), dict):
            merged[key] = {**status[key], **value}
        else:
            merged[key] = value
    return merged


def _pool(deployment: Mapping[str, Any] | None) -> Pool | None:
    """The pool Deployment's index view (handlers.deployment_view) as the builders read it."""
    if deployment is None:
        return None
    return Pool(int(deployment["spec"]["replicas"]), bool(deployment.get("autoscaled")))


def _first_cause(state: JobState, component: str) -> tuple[str, str] | None:
    with state.lock:
        pods = list(state.pods.items())
    causes = sorted((name, pod.cause) for name, pod in pods if pod.component == component and pod.cause)
    return causes[0][1] if causes else None


def _shown(pod: PodSeen | None) -> tuple[Any, Any, str, str]:
    return (pod.cause, pod.lost, pod.group if pod.ready else "", pod.node) if pod else (None, None, "", "")


def _ready_workers(state: JobState) -> Counter[str]:
    """The job's Ready Ray pods by group."""
    with state.lock:
        return Counter(pod.group for pod in state.pods.values() if pod.group and pod.ready)


def _lost_nodes(state: JobState, unready: Mapping[str, str], cluster: str) -> tuple[LostNode, ...]:
    """The nodes not Ready that hold pods of the job, by name, with those pods by component; of the Ray
    pods, those of the attempt's RayCluster `cluster` only (an earlier attempt's, deleted with its
    cluster, stay Terminating on a lost node and hold nothing of this one)."""
    with state.lock:
        pods = sorted(
            (p.node, name, p.component)
            for name, p in state.pods.items()
            if p.node in unready and p.cluster in ("", cluster)
        )
    nodes = sorted({node for node, _, _ in pods})
    return tuple(
        LostNode(
            node,
            unready[node],
            tuple(name for n, name, c in pods if n == node and c != COMPONENT_TOOL_POOL),
            tuple(name for n, name, c in pods if n == node and c == COMPONENT_TOOL_POOL),
        )
        for node in nodes
    )


def _lost_trainers(state: JobState) -> tuple[LostTrainer, ...]:
    with state.lock:
        return tuple(sorted(pod.lost for pod in state.pods.values() if pod.lost))


def status_announcements(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Events for a status change: the phase (a failure as a Warning with its reason), the pool,
    the Ray cluster and the children becoming ready or unready, a trainer restarted and resumed."""
    out = []
    if new.get("restarts", 0) > old.get("restarts", 0):
        recovering = next(c for c in new["conditions"] if c["type"] == RECOVERING)
        out.append((events.WARNING, TRAINER_RESTARTED, recovering["message"]))
    if old.get("phase") != new["phase"]:
        message = f"{old.get('phase') or 'New'} -> {new['phase']}: {new['message']}"
        if new["phase"] == FAILED:
            out.append((events.WARNING, new["reason"], message))
        else:
            out.append((events.NORMAL, f"{events.PHASE_PREFIX}{new['phase']}", message))
    before = {c["type"]: c for c in old.get("conditions", [])}
    for cond in new["conditions"]:
        was = before.get(cond["type"], {})
        flipped = was.get("status") != cond["status"]
        announce = cond["status"] == "True" or cond["type"] in before
        ready_kind = cond["type"] in ("ToolPoolReady", "ClusterReady")
        reason_changed = was.get("reason") != cond["reason"]
        if ready_kind and cond["reason"] == events.NODE_NOT_READY and reason_changed:  # whatever it was
            out.append((events.WARNING, events.NODE_NOT_READY, cond["message"]))
        elif ready_kind and flipped and announce:
            out.append((events.NORMAL, cond["reason"], cond["message"]))
        if cond["type"] == RECONCILED and flipped and cond["status"] == "True" and cond["type"] in before:
            out.append((events.NORMAL, cond["reason"], cond["message"]))
        if cond["type"] == RECOVERING and flipped and cond["reason"] == RESUMED:
            out.append((events.NORMAL, RESUMED, cond["message"]))
    return out
