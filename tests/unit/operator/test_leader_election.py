"""Leader election on a Lease: one holder at a time, a take-over only after the holder stopped
renewing for the Lease's duration (by the candidate's own clock), at once after a release."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import signal
from typing import Any

import pytest
from toolrl_operator import leader
from toolrl_operator.apply import ApiError
from toolrl_operator.handlers import Runtime
from toolrl_operator.leader import LeaderElector, LeaseName
from toolrl_operator.settings import Settings, SettingsError

LEASE = LeaseName("toolrl-system", "toolrl-operator")
PATH = "/apis/coordination.k8s.io/v1/namespaces/toolrl-system/leases"


class LeaseApi:
    """The API server's part in it: one Lease, created once, replaced only at its resourceVersion."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if self.down:
            raise ApiError(503, "ServiceUnavailable", "the API server is restarting")
        if method == "GET":
            assert path == f"{PATH}/{LEASE.name}"
            if self.lease is None:
                raise ApiError(404, "NotFound", "leases not found")
            return copy.deepcopy(self.lease)
        if method == "POST":
            assert path == PATH
            if self.lease is not None:
                raise ApiError(409, "AlreadyExists", "already exists")
        else:
            assert method == "PUT" and path == f"{PATH}/{LEASE.name}"
            assert self.lease is not None
            if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def candidate(api: LeaseApi, name: str, clock: Clock) -> LeaderElector:
    wall = lambda: dt.datetime(2026, 12, 7, tzinfo=dt.UTC) + dt.timedelta(seconds=clock.now)  # noqa: E731
    return LeaderElector(api, LEASE, name, clock=clock, wall=wall)  # type: ignore[arg-type]


def test_one_candidate_holds_the_lease_and_the_other_takes_over_only_after_it_expired() -> None:
    api, clock_a, clock_b = LeaseApi(), Clock(), Clock()
    a, b = candidate(api, "a", clock_a), candidate(api, "b", clock_b)
    assert a.try_acquire_or_renew() and a.held_for_sure()
    assert not b.try_acquire_or_renew() and b.holder == "a"
    first = copy.deepcopy(api.lease)
    # a renews: b sees a new record each time, so its wait starts again
    for _ in range(10):
        clock_a.now += leader.RETRY_SECONDS
        clock_b.now += leader.RETRY_SECONDS
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert api.lease and first
    assert api.lease["spec"]["acquireTime"] == first["spec"]["acquireTime"]
    assert api.lease["spec"]["renewTime"] != first["spec"]["renewTime"]
    # a dies: b waits the Lease's duration from when it saw a's last renewal, by its own clock
    clock_b.now += leader.LEASE_SECONDS - 1
    assert not b.try_acquire_or_renew()
    clock_b.now += 1
    assert b.try_acquire_or_renew() and b.held_for_sure()
    assert api.lease["spec"]["holderIdentity"] == "b" and api.lease["spec"]["leaseTransitions"] == 1
    # a, had it only been paused, sees b and may not act any more
    clock_a.now += leader.RETRY_SECONDS
    assert not a.try_acquire_or_renew() and not a.held_for_sure()


def test_a_released_lease_is_taken_at_once() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert api.lease and api.lease["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew() and b.holder == "b"
    b.release()
    b.release()  # nothing more to give up
    assert api.lease["spec"]["holderIdentity"] == ""


def test_of_two_candidates_writing_the_same_version_one_wins() -> None:
    api, clock = LeaseApi(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    assert a.try_acquire_or_renew()
    a.release()
    live = api.request("GET", f"{PATH}/{LEASE.name}")
    stale = live["metadata"]["resourceVersion"]
    assert b.try_acquire_or_renew()
    # a writes on the version it read before b's write: the API server refuses it
    assert not a._write("PUT", stale, live["spec"], clock())
    assert api.lease and api.lease["spec"]["holderIdentity"] == "b"


def test_a_slow_read_never_makes_the_holders_record_look_older_than_it_is() -> None:
    """The candidate's wait for a record starts when its read returned, not when it was sent."""
    api, clock = LeaseApi(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    assert a.try_acquire_or_renew()
    read = api.request

    def slow_read(method: str, path: str, body: Any = None, **kwargs: Any) -> dict[str, Any]:
        if method == "GET":
            clock.now += leader.LEASE_SECONDS  # the read took the Lease's whole duration
        return read(method, path, body, **kwargs)

    api.request = slow_read  # type: ignore[method-assign]
    assert not b.try_acquire_or_renew() and b.holder == "a"
    api.request = read  # type: ignore[method-assign]
    clock.now += leader.RETRY_SECONDS  # its next round, a moment after it saw a's record
    assert not b.try_acquire_or_renew(), "took over a Lease it saw renewed a moment ago"


def test_a_holder_that_cannot_renew_stops_acting_before_anyone_may_take_over() -> None:
    api, clock = LeaseApi(), Clock()
    a = candidate(api, "a", clock)
    assert a.try_acquire_or_renew()
    api.down = True
    clock.now += leader.RENEW_DEADLINE_SECONDS - 0.1
    with pytest.raises(ApiError):
        a.try_acquire_or_renew()
    assert a.held_for_sure()
    clock.now += 0.1
    assert not a.held_for_sure()
    assert leader.RENEW_DEADLINE_SECONDS < leader.LEASE_SECONDS


def test_the_lease_setting_is_namespace_and_name() -> None:
    env = {"TOOLRL_LEADER_ELECTION_LEASE": "toolrl-system/toolrl-operator"}
    assert Settings.from_env(env).leader_election_lease == LEASE
    assert Settings.from_env({}).leader_election_lease is None
    for bad in ("toolrl-operator", "a/b/c", "Toolrl/op", "/op"):
        with pytest.raises(SettingsError, match=r"TOOLRL_LEADER_ELECTION_LEASE.*namespace/name"):
            Settings.from_env({"TOOLRL_LEADER_ELECTION_LEASE": bad})


def test_the_runtime_works_only_while_it_holds_the_lease(monkeypatch) -> None:
    """The reconciler and the autoscaler start once the Lease is held; when another holder is seen,
    they stop and the operator stops itself (SIGTERM: kopf's graceful stop, then the pod restarts)."""
    api, clock = LeaseApi(), Clock()
    other = candidate(api, "other", clock)
    assert other.try_acquire_or_renew()
    ours = candidate(api, "ours", clock)
    rt = Runtime(Settings(), api, {}, {}, {}, ours)  # type: ignore[arg-type]
    monkeypatch.setattr(leader, "RETRY_SECONDS", 0.01)
    signals: list[int] = []
    monkeypatch.setattr("toolrl_operator.handlers.os.kill", lambda pid, sig: signals.append(sig))

    async def scenario() -> None:
        rt.start()
        await asyncio.sleep(0.1)
        assert not rt.work, "started without the Lease"
        other.release()
        for _ in range(200):
            if rt.work:
                break
            await asyncio.sleep(0.01)
        assert rt.work and api.lease and api.lease["spec"]["holderIdentity"] == "ours"
        # another takes it (ours was paused past the duration): ours stops working and the operator
        api.lease["spec"]["holderIdentity"] = "other"
        for _ in range(200):
            if signals:
                break
            await asyncio.sleep(0.01)
        assert signal.SIGTERM in signals and not rt.work
        await rt.stop()

    try:
        asyncio.run(scenario())
    finally:
        rt.threads.shutdown()
