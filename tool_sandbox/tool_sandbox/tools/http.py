"""The `http` tool: forwards a call's JSON input to an external API (for example a StableToolBench
server), with one timeout across all attempts, retries with backoff on 5xx and connection errors, and a
rate limit shared by every call to the tool."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from tool_sandbox.config import ToolConfig
from tool_sandbox.sandbox import outcome
from tool_sandbox.tools.arguments import argument_problems
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult


class RateLimiter:
    """A token bucket: `rate` calls per second, bursts up to `rate` (at least one)."""

    def __init__(self, rate: float, clock: Any = time.monotonic) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.clock = clock
        self.updated = clock()

    def delay(self) -> float:
        """Take a token; return how long to wait before using it (0 when one was available)."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


NOTHING = (b"", 0)  # an answer's body as _read gives it: none
# What the pool reads of an upstream's answer (issue 35: a 200 MiB answer read whole cost ~1 GiB): 16 times
# what the tool keeps, as a program's output past 16 times its limit is killed (room for an MCP answer's
# JSON-RPC framing, escapes and its text given twice, as content and structured content), at least 1 MiB
# (what the MCP SDK reads of one SSE event).
ANSWER_FACTOR, ANSWER_MIN_BYTES = 16, 1 << 20


def answer_limit(max_output_bytes: int) -> int:
    """How many bytes of an upstream's answer the pool reads for a tool keeping `max_output_bytes`."""
    return max(ANSWER_FACTOR * max_output_bytes, ANSWER_MIN_BYTES)


def backoff(attempt: int, base: float) -> float:
    """Delay before retry `attempt` (1-based): base, 2*base, 4*base ..."""
    return base * (2 ** (attempt - 1))


class HttpTool(Tool):
    type = "http"
    description = "Call the remote API behind this tool with JSON arguments."
    # The body the project's http APIs take (a StableToolBench server's): the call's input is POSTed to
    # the url as it is, never checked against this schema here; a caller may add keys beside `arguments`
    # (the trainer adds a row's context, the API's routing).
    input_schema = {
        "type": "object",
        "description": (
            "The JSON body POSTed as is to the tool's url: the API call's arguments under `arguments`;"
            " a caller may add keys beside it (the trainer adds the row's context)"
        ),
        "properties": {"arguments": {"type": "object", "description": "Arguments of the API call"}},
        "required": ["arguments"],
        "additionalProperties": True,
    }
    needs_egress = True

    def __init__(self, config: ToolConfig) -> None:
        super().__init__(config)
        self.limiter = RateLimiter(config.rate_limit_per_second)
        self.client: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.client = aiohttp.ClientSession(raise_for_status=False)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def execute(self, payload: Any, timeout: float | None) -> ToolResult:
        if not isinstance(payload, dict | list):
            raise ToolInputError("input of an http tool must be a JSON object (sent as the request body)")
        said = await argument_problems(None, payload, self.effective_timeout(timeout))
        if said:
            return self._result(outcome.ERROR, NOTHING, time.monotonic(), said, fault=outcome.FAULT_CODE)
        assert self.client is not None
        seconds = self.effective_timeout(timeout)
        started = time.monotonic()
        wait = self.limiter.delay()
        if wait > seconds:
            return self._result(
                outcome.REJECTED, NOTHING, started, f"rate limit of {self.config.rate_limit_per_second}/s"
            )
        await asyncio.sleep(wait)
        deadline = started + seconds  # one deadline for all attempts and the pauses between them
        last, status = "", outcome.ERROR
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                pause = backoff(attempt, self.config.retry_delay_seconds)
                if time.monotonic() + pause >= deadline:
                    return self._result(
                        outcome.TIMEOUT,
                        NOTHING,
                        started,
                        f"{last}; no time left for a retry within {seconds}s",
                        fault=outcome.FAULT_INFRA,
                    )
                await asyncio.sleep(pause)
            left = deadline - time.monotonic()
            try:
                async with self.client.post(
                    self.config.url, json=payload, timeout=aiohttp.ClientTimeout(total=left)
                ) as response:
                    body = await self._read(response)
                    if response.status < 500:
                        ok = response.status < 400
                        return self._result(
                            outcome.OK if ok else outcome.ERROR,
                            body,
                            started,
                            "" if ok else f"HTTP {response.status}",
                            response.status,
                        )
                    last, status = f"HTTP {response.status} after {attempt + 1} attempt(s)", outcome.ERROR
            except TimeoutError:
                return self._result(
                    outcome.TIMEOUT,
                    NOTHING,
                    started,
                    f"no answer within {seconds}s after {attempt + 1} attempt(s)",
                    fault=outcome.FAULT_INFRA,
                )
            except aiohttp.ClientError as exc:
                last, status = f"{type(exc).__name__}: {exc} after {attempt + 1} attempt(s)", outcome.ERROR
        # the upstream answered 5xx or not at all on every attempt: its failure, not the model's
        return self._result(status, NOTHING, started, last, fault=outcome.FAULT_INFRA)

    async def _read(self, response: aiohttp.ClientResponse) -> tuple[bytes, int]:
        """The first maxOutputBytes of an answer's body and the body's size: the rest is read and
        dropped as it comes (a 200 MiB answer read whole cost the server ~1 GiB), up to answer_limit;
        past it the connection is closed unread (a size past answer_limit: more than that)."""
        limit, kept, total = self.config.max_output_bytes, bytearray(), 0
        async for chunk in response.content.iter_any():
            total += len(chunk)
            if len(kept) < limit:
                kept += chunk[: limit - len(kept)]
            if total > answer_limit(limit):
                response.close()
                break
        return bytes(kept), total

    def _result(
        self,
        status: str,
        body: tuple[bytes, int],
        started: float,
        message: str,
        code: int | None = None,
        fault: str | None = None,
    ) -> ToolResult:
        kept, total = body
        limit, bound = self.config.max_output_bytes, answer_limit(self.config.max_output_bytes)
        if total <= limit:  # whole: JSON made compact, an API's quoted lone surrogate kept readable
            raw = _pretty(kept.decode("utf-8", "replace")).encode("utf-8", "surrogatepass")
            kept, total = raw[:limit], len(raw)
        output, truncated = outcome.cap_output(kept, min(total, bound), limit, more=total > bound)
        return ToolResult(
            status=status,
            output=output,
            stdout=output,
            exitCode=code,
            truncated=truncated,
            durationSeconds=round(time.monotonic() - started, 6),
            message=message,
            fault=fault,
        )


def _pretty(body: str) -> str:
    try:
        return json.dumps(json.loads(body), ensure_ascii=False)
    except ValueError:
        return body
