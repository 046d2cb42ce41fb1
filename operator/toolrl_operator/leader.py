"""One operator at a time: leader election on a coordination.k8s.io/v1 Lease, the way client-go's
leaderelection package does it.

The Deployment's Recreate strategy keeps a rollout from running two operators, but not a pod that is
force-deleted or whose node is lost: the ReplicaSet starts a new pod at once while the old process may
run on for seconds (or, on a partitioned node, for as long as the partition lasts). Two operators
syncing one job post its Events twice and race on its children. So the operator's work (the
reconciler and the autoscaler) starts only once its process holds the Lease, and stops when the Lease
is lost.

A candidate takes the Lease when it is absent, released (no holder) or not renewed for its duration as
measured by the candidate's own clock from when it first saw the holder's last record (clocks of
different machines are never compared). Every write is conditioned on the resourceVersion read, so of
two candidates one wins. The holder renews every RETRY_SECONDS and gives up when no renewal succeeded
for RENEW_DEADLINE_SECONDS, well before another candidate may take over; a graceful stop releases the
Lease so that the next operator starts at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .apply import ApiError, Kube, resource_path

log = logging.getLogger(__name__)

API_VERSION, KIND = "coordination.k8s.io/v1", "Lease"
# client-go's defaults (controller-runtime's too)
LEASE_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10.0
RETRY_SECONDS = 2.0
# (connect, read) seconds of each Lease call: a round fits well within the renew deadline
REQUEST_TIMEOUT = (2.0, 4.0)
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # a namespace
DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class LeaseName:
    namespace: str
    name: str

    @classmethod
    def parse(cls, value: str) -> LeaseName:
        """`namespace/name` (the chart's TOOLRL_LEADER_ELECTION_LEASE)."""
        namespace, _, name = value.partition("/")
        if not (DNS_LABEL.fullmatch(namespace) and DNS_NAME.fullmatch(name)):
            raise ValueError(f"{value!r}: use namespace/name of a Lease (lower-case DNS label/name)")
        return cls(namespace, name)


def identity() -> str:
    """This process among the candidates: its host (the pod's name) and a random suffix, as client-go."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(at: dt.datetime) -> str:
    """A metav1.MicroTime."""
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_spec(
    holder: str, previous: Mapping[str, Any], at: dt.datetime, duration: int = LEASE_SECONDS
) -> dict[str, Any]:
    """The Lease's spec with `holder` holding it from `at` on: a renewal keeps the acquire time, a
    change of holder counts a transition. An empty `holder` releases it."""
    spec: dict[str, Any] = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration,
        "renewTime": micro_time(at),
        "leaseTransitions": int(previous.get("leaseTransitions") or 0),
    }
    if previous.get("holderIdentity") == holder and previous.get("acquireTime"):
        spec["acquireTime"] = previous["acquireTime"]
    else:
        spec["acquireTime"] = micro_time(at)
        if previous and holder:  # a new holder of an existing Lease, released or not (as client-go)
            spec["leaseTransitions"] += 1
    return spec


class LeaderElector:
    """Tries to acquire or renew one Lease for `identity` (blocking calls; the runtime runs them on its
    thread pool). `clock` is monotonic seconds."""

    def __init__(
        self,
        kube: Kube,
        lease: LeaseName,
        identity: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.kube, self.lease, self.identity = kube, lease, identity
        self.clock, self.wall = clock, wall
        self.observed: dict[str, Any] | None = None  # the last spec seen, and when (by our clock)
        self.observed_at = 0.0
        self.renewed_at: float | None = None  # when we last held it for sure

    @property
    def path(self) -> str:
        return resource_path(API_VERSION, KIND, self.lease.namespace, self.lease.name)

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this process holds the Lease after it. A renewal counts from the
        round's start; another holder's record from when its read returned (a slow read never makes
        it look older than it is)."""
        now = self.clock()
        try:
            live = self.kube.request("GET", self.path, timeout=REQUEST_TIMEOUT)
        except ApiError as err:
            if err.status != 404:
                raise
            return self._write("POST", None, {}, now)
        spec = live.get("spec") or {}
        if spec != self.observed:
            self.observed, self.observed_at = spec, self.clock()
        holder = spec.get("holderIdentity") or ""
        duration = int(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
        if holder and holder != self.identity and self.clock() < self.observed_at + duration:
            return False  # another candidate holds it and renewed it within its duration
        return self._write("PUT", live["metadata"]["resourceVersion"], spec, now)

    @property
    def holder(self) -> str:
        """The holder this process last saw ('' when none, or before the first round)."""
        return str((self.observed or {}).get("holderIdentity") or "")

    @property
    def lease_key(self) -> tuple[str, str]:
        return self.lease.namespace, self.lease.name

    def held_for_sure(self) -> bool:
        """Whether this process may go on acting: the last holder seen is this one and a renewal
        succeeded within the renew deadline (past it, another candidate may soon take over)."""
        recent = self.renewed_at is not None and self.clock() - self.renewed_at < RENEW_DEADLINE_SECONDS
        return recent and self.holder == self.identity

    def release(self) -> None:
        """Give the Lease up (a graceful stop): the next candidate takes it at once."""
        if self.renewed_at is None:
            return
        self.renewed_at = None
        try:
            live = self.kube.request("GET", self.path, timeout=REQUEST_TIMEOUT)
            spec = live.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            released = {**lease_spec("", spec, self.wall()), "leaseDurationSeconds": 1}
            manifest = self._manifest(live["metadata"]["resourceVersion"], released)
            self.kube.request("PUT", self.path, manifest, timeout=REQUEST_TIMEOUT)
        except ApiError as err:
            log.warning("leader election: the Lease %s/%s was not released: %s", *self.lease_key, err)

    def _write(
        self, method: str, resource_version: str | None, previous: Mapping[str, Any], now: float
    ) -> bool:
        """Hold the Lease from the round's start `now` on (renewals count from before the call)."""
        spec = lease_spec(self.identity, previous, self.wall())
        path = self.path if method == "PUT" else resource_path(API_VERSION, KIND, self.lease.namespace)
        try:
            self.kube.request(method, path, self._manifest(resource_version, spec), timeout=REQUEST_TIMEOUT)
        except ApiError as err:
            if err.status == 409:  # another candidate wrote first (or created it): it holds the Lease
                return False
            raise
        if previous.get("holderIdentity") != self.identity:
            log.info("leader election: %s acquired the Lease %s/%s", self.identity, *self.lease_key)
        self.observed, self.observed_at, self.renewed_at = spec, now, now
        return True

    def _manifest(self, resource_version: str | None, spec: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.lease.name, "namespace": self.lease.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version  # the write's precondition
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
