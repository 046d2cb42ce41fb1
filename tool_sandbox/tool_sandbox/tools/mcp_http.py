"""The HTTP client of `mcp` tools (httpx2, the MCP SDK's), reading no answer past a bound.

The SDK reads a JSON answer whole before it parses it: a 200 MiB answer cost the pool ~1 GiB (issue 35).
This client reads the body of every response (a JSON answer, an SSE stream, an error) up to the bound
of the call that sent it, then stops: the bound is a context variable, as the SDK sends from tasks of
its own, started in its caller's context. It asks for answers uncompressed and refuses compressed ones
(a small deflated body inflates past any bound before a byte of it is counted).

It also keeps what the server wrote below HTTP 500 (JSON bodies and SSE streams, within the bound, until
the call ends): a JSON-RPC error is the call's own only when the server wrote it in answer to the call
(`written_error`). The SDK raises the same exception for errors it makes up itself from what was no
answer (-32603 for an HTTP error status, -32700 for a body it could not read, -32000 for a stream that
ended without an answer), so the exception alone cannot tell the model's doing from the transport's.

Imported by the `mcp` tools when they first connect, not by every pool (httpx2 is the SDK's)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2

# What the pool reads of an answer no call is waiting for (a server's tool listing at start).
LISTING_BYTES = 16 << 20
# HTTP statuses whose body is never taken as the server's answer to a call: its own failure or load.
NOT_AN_ANSWER = (408, 429)
SSE_LINE = re.compile(rb"\r\n|\r|\n")


@dataclass
class Answer:
    """A response body the server wrote below HTTP 500, as read, and the request it answered."""

    request: bytes  # the JSON-RPC message the pool's client sent
    sse: bool
    chunks: list[bytes] = field(default_factory=list)

    def messages(self) -> Iterator[Any]:
        """The JSON values the server wrote: the body, or each SSE event's data."""
        body = b"".join(self.chunks)
        texts = _sse_data(body) if self.sse else [body]
        for text in texts:
            try:
                yield json.loads(text)
            except ValueError:
                continue


@dataclass
class Bound:
    """How many bytes of an answer's body are read; `exceeded`: a successful (2xx) answer went past;
    `answers`: what the server wrote (below HTTP 500) to the requests sent in the block."""

    limit: int
    exceeded: bool = False
    answers: list[Answer] = field(default_factory=list)

    def written_error(self, method: str) -> tuple[int, str] | None:
        """(code, message) of a well-formed JSON-RPC error the server wrote in answer to a request of
        `method` sent in the block, else None."""
        for message in self._written(method):
            error = message.get("error")
            if (
                isinstance(error, dict)
                and type(error.get("code")) is int
                and isinstance(error.get("message"), str)
            ):
                return error["code"], error["message"]
        return None

    def written_result(self, method: str) -> dict[str, Any] | None:
        """The JSON-RPC result (an object) the server wrote in answer to a request of `method` sent in
        the block, else None."""
        for message in self._written(method):
            if isinstance(message.get("result"), dict):
                return message["result"]
        return None

    def _written(self, method: str) -> Iterator[dict[str, Any]]:
        """The JSON-RPC 2.0 messages the server wrote answering (by id) a request of `method`."""
        for answer in self.answers:
            try:
                request = json.loads(answer.request)
            except ValueError:
                continue
            if not isinstance(request, dict) or request.get("method") != method or "id" not in request:
                continue
            for message in answer.messages():
                if (
                    isinstance(message, dict)
                    and message.get("jsonrpc") == "2.0"
                    and message.get("id") == request["id"]
                ):
                    yield message


def _sse_data(body: bytes) -> list[bytes]:
    """The data of each `message` event of an SSE stream (the events the SDK reads; their `data:` lines
    joined, as the SSE standard does; an event the stream ended within is none)."""
    events, data, kind = [], [], b"message"
    for line in SSE_LINE.split(body)[:-1]:  # the last is what followed the last line break
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if not line:
            if data and kind == b"message":
                events.append(b"\n".join(data))
            data, kind = [], b"message"
        elif field == b"data":
            data.append(value)
        elif field == b"event":
            kind = value
    return events


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
    def __init__(
        self, stream: httpx2.AsyncByteStream, bound: Bound, success: bool, answer: Answer | None
    ) -> None:
        self.stream, self.bound, self.success, self.answer = stream, bound, success, answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self.stream:
            read += len(chunk)
            if read > self.bound.limit:
                self.bound.exceeded |= self.success
                # the SDK ends a request at once on an SSEError, in a JSON answer too (it lets it
                # through, to the caller); what the call answers comes from `exceeded`, not from this
                raise httpx2.SSEError(f"the answer went past {self.bound.limit} bytes; the pool read no more")
            if self.answer is not None:
                self.answer.chunks.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _bound_answer(response: httpx2.Response) -> None:
    """httpx2's response hook (before any of the body is read)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise httpx2.DecodingError(f"the server sent a compressed answer ({encoding}), asked for none")
    bound = _BOUND.get(None) or Bound(LISTING_BYTES)
    kind = response.headers.get("content-type", "").lower()
    answer = None
    if (
        response.status_code < 500
        and response.status_code not in NOT_AN_ANSWER
        and kind.startswith(("application/json", "text/event-stream"))
    ):
        answer = Answer(response.request.content, kind.startswith("text/event-stream"))
        bound.answers.append(answer)
    response.stream = _Bounded(response.stream, bound, response.is_success, answer)


def client(timeout: httpx2.Timeout) -> httpx2.AsyncClient:
    """An HTTP client for one server, shared by its calls (it keeps their connections)."""
    return httpx2.AsyncClient(
        timeout=timeout, headers={"Accept-Encoding": "identity"}, event_hooks={"response": [_bound_answer]}
    )
