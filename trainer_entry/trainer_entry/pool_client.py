"""Async client of the tool pool's `POST /v1/execute`.

Thousands of rollouts share one connection pool per process and event loop, a concurrency cap, and
one retry policy. Whatever goes wrong becomes a `CallResult` the model can read: a rollout never
dies because a tool call failed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from trainer_entry.observations import OBSERVATION_DEFAULT, observation

RETRYABLE_HTTP = (429, 502, 503, 504)
MAX_BACKOFF_SECONDS = 30.0
# HTTP allowance on top of the execution timeout: the pool answers `timeout` itself when it can.
HTTP_GRACE_SECONDS = 5.0

Recorder = Callable[[str, str, float], None]

# Whose a failure is (docs/contracts.md, "Whose failure"): the same two values as the pool's `fault`.
FAULT_CODE = "code"
FAULT_INFRA = "infra"
# statuses the client makes up itself; every one is the infrastructure's
UNREACHABLE = "unreachable"


def _no_record(tool: str, outcome: str, seconds: float) -> None:
    return None


@dataclass
class CallResult:
    """A tool call as seen by the trainer; `status` is the pool's, or `unreachable` for client failures;
    `fault` is None when ok, else `code` (the model's) or `infra` (see `classify`)."""

    status: str
    fault: str | None = None
    output: str = ""
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_seconds: float = 0.0
    truncated: bool = False
    attempts: int = 1
    error: str = ""
    raw: dict[str, Any] = field(default_factory=dict)
    observation_format: str = OBSERVATION_DEFAULT
    """How `observation` words it: the calling tool's observationFormat (tools.PoolTool sets it)."""

    def __post_init__(self) -> None:
        if self.fault is None:
            self.fault = classify(self.status)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def infra_failure(self) -> bool:
        return self.fault == FAULT_INFRA

    def observation(self) -> str:
        """The text the model reads back, in the calling tool's format (observations.observation)."""
        return observation(self)


def classify(status: str, pool_fault: Any = None) -> str | None:
    """Whose failure a pool answer is: the pool's own `fault` when it sent a valid one, else from the
    status (an older pool): `rejected` and `unreachable` are the infrastructure's, other failures the
    code's, `ok` nobody's."""
    if pool_fault in (FAULT_CODE, FAULT_INFRA) and status != "ok":
        return pool_fault
    if status == "ok":
        return None
    return FAULT_INFRA if status in ("rejected", UNREACHABLE) else FAULT_CODE


def transport_failure(status: str, error: str, attempts: int, **extra: Any) -> CallResult:
    """A call that got no usable answer from the pool: always the infrastructure's failure."""
    return CallResult(status=status, fault=FAULT_INFRA, error=error, attempts=attempts, **extra)


def retry_after_seconds(header: str | None, default: float) -> float:
    """Seconds to wait from a Retry-After header (delta-seconds form), else `default`."""
    if header is None:
        return default
    try:
        return max(0.0, float(header))
    except ValueError:
        return default


def backoff_seconds(attempt: int, base: float) -> float:
    """Exponential backoff for retry number `attempt` (0-based), capped."""
    return min(MAX_BACKOFF_SECONDS, base * (2**attempt))


class PoolClient:
    """One process-wide client per pool URL and event loop (see `shared_client`)."""

    def __init__(
        self,
        base_url: str,
        *,
        max_retries: int = 3,
        retry_delay_seconds: float = 1.0,
        max_concurrency: int = 256,
        request_timeout_seconds: float = 30.0,
        record: Recorder = _no_record,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/execute"
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.retry_delay = retry_delay_seconds
        self.request_timeout = request_timeout_seconds
        self.record = record
        self.sleep = sleep
        self._limit = asyncio.Semaphore(max_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._max_concurrency = max_concurrency

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_concurrency, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def ready(self) -> bool:
        """True when the pool's `/readyz` answers 200."""
        try:
            async with self._http().get(
                self.base_url + "/readyz", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def tools(self) -> list[dict[str, Any]]:
        """The pool's tools as it serves them (GET /v1/tools: name, type, description, inputSchema)."""
        timeout = aiohttp.ClientTimeout(total=30)
        async with self._http().get(self.base_url + "/v1/tools", timeout=timeout) as resp:
            resp.raise_for_status()
            return list((await resp.json())["tools"])

    async def execute(
        self,
        tool: str,
        payload: Any,
        timeout_seconds: float | None = None,
        session: str | None = None,
        sample: dict[str, Any] | None = None,
    ) -> CallResult:
        """Run `tool` with `payload` (and the row's `sample` values, for a function tool) in the pool;
        retries transient failures, never raises for them."""
        body: dict[str, Any] = {"tool": tool, "input": payload}
        if sample:
            body["sample"] = sample
        limit = timeout_seconds if timeout_seconds is not None else self.request_timeout
        if timeout_seconds is not None:
            body["timeoutSeconds"] = timeout_seconds
        if session is not None:
            body["session"] = session
        http_timeout = aiohttp.ClientTimeout(total=limit + HTTP_GRACE_SECONDS)
        start = time.perf_counter()
        async with self._limit:
            result = await self._with_retries(body, http_timeout, limit)
        self.record(tool, result.status, time.perf_counter() - start)
        return result

    async def _with_retries(
        self, body: dict[str, Any], http_timeout: aiohttp.ClientTimeout, limit: float
    ) -> CallResult:
        error = ""
        for attempt in range(self.max_retries + 1):
            wait = backoff_seconds(attempt, self.retry_delay)
            try:
                async with self._http().post(self.url, json=body, timeout=http_timeout) as resp:
                    if resp.status == 200:
                        return _answer(await resp.text(), attempt + 1)
                    text = (await resp.text())[:300]
                    error = f"HTTP {resp.status}: {text}"
                    if resp.status >= 500 and resp.status not in RETRYABLE_HTTP:
                        return transport_failure(UNREACHABLE, error, attempt + 1)
                    if resp.status not in RETRYABLE_HTTP:
                        # the pool refused the call's input (400, 413, ...): the model's call is to blame
                        return CallResult(status="error", fault=FAULT_CODE, error=error, attempts=attempt + 1)
                    if resp.status == 429:
                        wait = retry_after_seconds(resp.headers.get("Retry-After"), wait)
            except TimeoutError:
                # the caller's deadline passed without an answer: queued or lost, never the code's own
                # limit (the pool answers `timeout` itself for that, within HTTP_GRACE_SECONDS)
                return transport_failure(
                    "timeout", "no answer from the tool pool in time", attempt + 1, duration_seconds=limit
                )
            except aiohttp.ClientError as exc:
                error = f"{type(exc).__name__}: {exc}"
            if attempt < self.max_retries:
                await self.sleep(wait)
        status = "rejected" if error.startswith("HTTP 429") else UNREACHABLE
        return transport_failure(status, error, self.max_retries + 1)


def _answer(text: str, attempts: int) -> CallResult:
    """The pool's 200 answer as a CallResult; anything but a well-formed result object becomes an error
    observation (a broken or foreign server must not raise into the rollout)."""
    try:
        doc = json.loads(text)
        if isinstance(doc, dict):
            return _parse(doc, attempts)
    except (ValueError, TypeError):
        pass
    return transport_failure(
        "error",
        f"the tool pool answered something unexpected (HTTP 200, not a result object): {text[:200]!r}",
        attempts,
    )


def _parse(doc: dict[str, Any], attempts: int) -> CallResult:
    output = doc.get("output", "")
    status = str(doc.get("status", "error"))
    return CallResult(
        status=status,
        fault=classify(status, doc.get("fault")),
        output=output if isinstance(output, str) else _json_text(output),
        stdout=str(doc.get("stdout") or ""),
        stderr=str(doc.get("stderr") or ""),
        exit_code=doc.get("exitCode"),
        duration_seconds=float(doc.get("durationSeconds") or 0.0),
        truncated=bool(doc.get("truncated", False)),
        attempts=attempts,
        raw=doc,
    )


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


_CLIENTS: dict[tuple[str, int, frozenset[tuple[str, Any]]], PoolClient] = {}


def shared_client(base_url: str, **options: Any) -> PoolClient:
    """The client of this process and running event loop for `base_url` with these `options` (created
    on first use). Options are part of the key: the tools' call policy (timeouts, retries, concurrency)
    must not depend on whether a tool or a reward made the process's first call."""
    key = (base_url, id(asyncio.get_running_loop()), frozenset(options.items()))
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = PoolClient(base_url, **options)
    return client
