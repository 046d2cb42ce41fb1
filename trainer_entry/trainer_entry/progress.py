"""Patch `status.progress` of the trainer's own ToolRLJob, at most every few seconds.

Plain HTTPS with the pod's ServiceAccount token (the operator's `J-trainer` Role allows exactly this),
so the trainer image needs no Kubernetes client library. A failed patch is logged, never fatal.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from toolrl_api import API_VERSION, PLURAL
from toolrl_api.status_types import StatusProgress

log = logging.getLogger(__name__)

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MIN_INTERVAL_SECONDS = 5.0


def timestamp(now: datetime) -> str:
    """A metav1.Time: RFC 3339, seconds, UTC."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def progress_patch(
    step: int,
    total_steps: int,
    reward_mean: float,
    now: datetime,
    trajectories: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The merge patch body: only `status.progress`, which the trainer owns, as the API's StatusProgress
    (a field the CRD lacks, which the apiserver would drop without a word, raises here); `trajectories`
    are the run's counts by their status names (metrics.TrainerMetrics.trajectory_counts: how many were
    excluded and why)."""
    progress = StatusProgress.model_validate(
        {
            "step": int(step),
            "totalSteps": int(total_steps),
            "rewardMean": round(float(reward_mean), 6),
            "lastUpdateTime": timestamp(now),
            **(trajectories or {}),
        }
    )
    return {"status": {"progress": progress.model_dump(by_alias=True, exclude_none=True)}}


def status_path(namespace: str, name: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"


@dataclass
class ApiTarget:
    """Where and as whom to patch: in a pod, from the ServiceAccount mount and service env.
    With `token_file`, the token is read from it for every request: the kubelet rotates the
    projected token (hourly by default; the API server stops accepting the old one), so a token
    read once would silently end progress reporting on a long run."""

    base_url: str
    token: str
    ssl_context: ssl.SSLContext | None
    token_file: str | None = None

    def current_token(self) -> str:
        if self.token_file:
            try:
                with open(self.token_file) as fh:
                    self.token = fh.read().strip()
            except OSError as err:  # keep the last token; the patch then says if it is refused
                log.warning("cannot re-read the ServiceAccount token %s: %s", self.token_file, err)
        return self.token

    @classmethod
    def in_cluster(cls, sa_dir: str = SA_DIR) -> ApiTarget:
        """`sa_dir` is where the ServiceAccount's `token` and `ca.crt` are mounted; tests point it
        at files minted for a real cluster, so the very path a pod takes is exercised."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if not host:
            raise RuntimeError(
                "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST unset): progress is not reported"
            )
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        with open(f"{sa_dir}/token") as fh:
            token = fh.read().strip()
        context = ssl.create_default_context(cafile=f"{sa_dir}/ca.crt")
        return cls(
            base_url=f"https://{host}:{port}", token=token, ssl_context=context, token_file=f"{sa_dir}/token"
        )

    def merge_patch(self, path: str, body: dict[str, Any]) -> urllib.request.Request:
        """A JSON merge patch of `path` (an API path) as this identity; open it with `ssl_context`."""
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def request(
        self, method: str, path: str, body: dict[str, Any], content_type: str
    ) -> urllib.request.Request:
        """A request of `path` (an API path, with its query) as this identity; open it with `ssl_context`."""
        return urllib.request.Request(
            self.base_url.rstrip("/") + path,
            data=json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": content_type, "Authorization": f"Bearer {self.current_token()}"},
        )


class ProgressReporter:
    """Sends progress when the step moved and the last patch is old enough (or when forced)."""

    def __init__(
        self,
        target: ApiTarget,
        namespace: str,
        name: str,
        min_interval: float = MIN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.path = status_path(namespace, name)
        self.min_interval = min_interval
        self.clock = clock
        self._last_sent: float | None = None
        self._pending: tuple[int, int, float, dict[str, Any] | None] | None = None
        self.sent = 0

    def update(
        self,
        step: int,
        total_steps: int,
        reward_mean: float,
        force: bool = False,
        trajectories: dict[str, Any] | None = None,
    ) -> bool:
        """Remember the latest progress; patch it now if allowed. Returns whether a patch was sent."""
        self._pending = (step, total_steps, reward_mean, trajectories)
        now = self.clock()
        if not force and self._last_sent is not None and now - self._last_sent < self.min_interval:
            return False
        return self.flush()

    def flush(self) -> bool:
        """Send the pending progress, if any; it stays pending until a patch succeeds, so a failed
        patch is retried by the next call instead of losing the step."""
        if self._pending is None:
            return False
        pending = self._pending
        step, total, reward, trajectories = pending
        body = progress_patch(step, total, reward, now=datetime.now(UTC), trajectories=trajectories)
        self._last_sent = self.clock()
        request = self.target.merge_patch(self.path, body)
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.target.ssl_context) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            log.warning(
                "progress patch refused (HTTP %s): %s; check the J-trainer Role allows patching %s/status",
                exc.code,
                exc.read()[:200],
                PLURAL,
            )
            return False
        except (urllib.error.URLError, OSError) as exc:
            log.warning("progress patch failed: %s", exc)
            return False
        if self._pending == pending:
            self._pending = None
        self.sent += 1
        return True

    def finish(self) -> bool:
        """The last patch of the run: flush, and retry once if that failed (nothing comes after)."""
        return self.flush() or self.flush()
