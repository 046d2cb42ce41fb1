"""Operator-wide settings; the environment (set by the Helm chart) is their one home."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from .leader import LeaseName
from .scale_decision import Policy


class SettingsError(ValueError):
    """An operator environment variable has a value the operator cannot use."""


@dataclass(frozen=True)
class Settings:
    trainer_image: str = "toolrl-trainer:0.1.0"
    tool_sandbox_image: str = "toolrl-tool-sandbox:0.1.0"
    monitoring_namespace: str = "monitoring"
    prometheus_url: str = ""  # the autoscaler reads pool load here; empty: it scrapes the pods
    autoscaler_interval_seconds: float = 5.0
    # The autoscaler's stable window: the load is averaged over it, and a burst's panic mode lasts
    # that long after the last burst-sized reading (at least the panic window, 6 s).
    autoscaler_stable_window_seconds: float = Policy.stable_window_seconds
    # Every job is synced this often even without events: a safety net for missed watch events
    # and the pace at which permanent errors are retried without a spec change.
    resync_seconds: float = 300.0
    operator_namespace: str = ""  # where the operator runs (POD_NAMESPACE); empty out of cluster
    # Where KubeRay runs: Ray NetworkPolicies admit it to the dashboard. Empty: namespaces
    # labelled RAY_DASHBOARD_ACCESS_LABEL instead.
    kuberay_namespace: str = ""
    # The Lease of leader election (namespace/name; the chart sets it): the operator works only
    # while it holds it. None: no election (one operator run by hand).
    leader_election_lease: LeaseName | None = None
    # Addresses besides the monitoring namespace's pods that may read the jobs' /metrics: a Prometheus
    # outside the cluster or on a node's network (its packets come from a node's address, not a pod's).
    metrics_cidrs: tuple[str, ...] = ()
    # Addresses besides KubeRay's namespace that may reach the Ray dashboard: KubeRay outside the pod
    # network, or through the API server's proxy (`--use-kubernetes-proxy`: the API server's address).
    kuberay_cidrs: tuple[str, ...] = ()

    def metrics_namespaces(self) -> list[str]:
        """Namespaces whose pods may read the jobs' /metrics: Prometheus's and the operator's."""
        return [self.monitoring_namespace, *([self.operator_namespace] if self.operator_namespace else [])]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Read TOOLRL_TRAINER_IMAGE, TOOLRL_TOOL_SANDBOX_IMAGE, TOOLRL_MONITORING_NAMESPACE,
        TOOLRL_PROMETHEUS_URL, TOOLRL_AUTOSCALER_INTERVAL_SECONDS,
        TOOLRL_AUTOSCALER_STABLE_WINDOW_SECONDS, TOOLRL_RESYNC_SECONDS, TOOLRL_KUBERAY_NAMESPACE,
        TOOLRL_LEADER_ELECTION_LEASE, TOOLRL_METRICS_CIDRS, TOOLRL_KUBERAY_CIDRS and POD_NAMESPACE (the
        operator's own, set by the chart)."""
        env = dict(os.environ) if env is None else env
        defaults = cls()
        seconds = _seconds(env, "TOOLRL_AUTOSCALER_INTERVAL_SECONDS", defaults.autoscaler_interval_seconds)
        window_name = "TOOLRL_AUTOSCALER_STABLE_WINDOW_SECONDS"
        window = _seconds(env, window_name, defaults.autoscaler_stable_window_seconds)
        if window < Policy.panic_window_seconds:
            raise SettingsError(
                f"{window_name}={env[window_name]!r}: use at least the panic window, "
                f"{Policy.panic_window_seconds:g} seconds"
            )
        lease = env.get("TOOLRL_LEADER_ELECTION_LEASE", "")
        try:
            leader_election_lease = LeaseName.parse(lease) if lease else None
        except ValueError as err:
            raise SettingsError(f"TOOLRL_LEADER_ELECTION_LEASE={err}") from None
        return cls(
            trainer_image=env.get("TOOLRL_TRAINER_IMAGE") or defaults.trainer_image,
            tool_sandbox_image=env.get("TOOLRL_TOOL_SANDBOX_IMAGE") or defaults.tool_sandbox_image,
            monitoring_namespace=env.get("TOOLRL_MONITORING_NAMESPACE") or defaults.monitoring_namespace,
            prometheus_url=env.get("TOOLRL_PROMETHEUS_URL", "").rstrip("/"),
            autoscaler_interval_seconds=seconds,
            autoscaler_stable_window_seconds=window,
            resync_seconds=_seconds(env, "TOOLRL_RESYNC_SECONDS", defaults.resync_seconds),
            operator_namespace=env.get("POD_NAMESPACE", ""),
            kuberay_namespace=env.get("TOOLRL_KUBERAY_NAMESPACE", ""),
            leader_election_lease=leader_election_lease,
            metrics_cidrs=_cidrs(env, "TOOLRL_METRICS_CIDRS"),
            kuberay_cidrs=_cidrs(env, "TOOLRL_KUBERAY_CIDRS"),
        )


def _cidrs(env: dict[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of CIDRs (IPv4 or IPv6), each an address with its prefix length; host bits
    are cleared (192.0.2.10/24 is 192.0.2.0/24), as the chart's schema cannot tell them."""
    networks = []
    for cidr in (c.strip() for c in env.get(name, "").split(",") if c.strip()):
        try:
            if "/" not in cidr:
                raise ValueError("no prefix length")
            networks.append(str(ipaddress.ip_network(cidr, strict=False)))
        except ValueError as err:
            raise SettingsError(
                f"{name}={env[name]!r}: {cidr!r} is not a CIDR ({err}); give networks such as 192.0.2.10/32,"
                " comma-separated"
            ) from None
    return tuple(networks)


def _seconds(env: dict[str, str], name: str, default: float) -> float:
    value = env.get(name) or str(default)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise SettingsError(f"{name}={value!r}: use a positive number of seconds")
    return seconds
