"""The HTTP client of `mcp` tools (httpx2, the MCP SDK's), reading no answer past a bound.

The SDK reads a JSON answer whole before it parses it: a 200 MiB answer cost the pool ~1 GiB (issue 35).
This client reads the body of every response (a JSON answer, an SSE stream, an error) up to the bound
of the call that sent it, then stops: the bound is a context variable, as the SDK sends from tasks of
its own, started in its caller's context. It asks for answers uncompressed and refuses compressed ones
(a small deflated body inflates past any bound before a byte of it is counted).

Imported by the `mcp` tools when they first connect, not by every pool (httpx2 is the SDK's)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx2

# What the pool reads of an answer no call is waiting for (a server's tool listing at start).
LISTING_BYTES = 16 << 20


@dataclass
class Bound:
    """How many bytes of an answer's body are read; `exceeded`: a successful (2xx) answer went past."""

    limit: int
    exceeded: bool = False


_BOUND: contextvars.ContextVar[Bound] = contextvars.ContextVar("mcp_answer_bound")


@contextlib.contextmanager
def reading_at_most(limit: int) -> Iterator[Bound]:
    """Answers to what this task sends in the block (through the SDK's tasks too): `limit` bytes each."""
    bound = Bound(limit)
    token = _BOUND.set(bound)
    try:
        yield bound
    finally:
        _BOUND.reset(token)


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, bound: Bound, success: bool) -> None:
        self.stream, self.bound, self.success = stream, bound, success

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self.stream:
            read += len(chunk)
            if read > self.bound.limit:
                self.bound.exceeded |= self.success
                # the SDK ends a request at once on an SSEError, in a JSON answer too (it lets it
                # through, to the caller); what the call answers comes from `exceeded`, not from this
                raise httpx2.SSEError(f"the answer went past {self.bound.limit} bytes; the pool read no more")
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _bound_answer(response: httpx2.Response) -> None:
    """httpx2's response hook (before any of the body is read)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise httpx2.DecodingError(f"the server sent a compressed answer ({encoding}), asked for none")
    bound = _BOUND.get(None) or Bound(LISTING_BYTES)
    response.stream = _Bounded(response.stream, bound, response.is_success)


def client(timeout: httpx2.Timeout) -> httpx2.AsyncClient:
    """An HTTP client for one server, shared by its calls (it keeps their connections)."""
    return httpx2.AsyncClient(
        timeout=timeout, headers={"Accept-Encoding": "identity"}, event_hooks={"response": [_bound_answer]}
    )
