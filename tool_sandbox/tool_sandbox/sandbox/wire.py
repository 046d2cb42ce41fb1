"""Framing between server and worker, and of a child's reports to its worker: a 4-byte big-endian
length, then JSON (requests to a child are binary: layers.REQUEST)."""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the server's side only: asyncio (and the logging it imports) stays out of workers
    import asyncio

_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size
MAX_FRAME = 64 << 20


def encode(message: dict[str, Any]) -> bytes:
    """UTF-8, not \\u escapes (3x smaller for non-ASCII code); lone surrogates pass through."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> Any:
    return json.loads(body.decode("utf-8", "surrogatepass"))


def frame_size(header: bytes | bytearray) -> int:
    """The body size a header announces; ValueError past MAX_FRAME (the stream cannot be trusted)."""
    (size,) = _HEADER.unpack_from(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return size


async def read_stream_frame(stream: asyncio.StreamReader) -> dict[str, Any]:
    """One frame from an asyncio stream (IncompleteReadError at end of stream)."""
    size = frame_size(await stream.readexactly(HEADER_SIZE))
    return decode(await stream.readexactly(size))


def split(buffer: bytearray) -> list[dict[str, Any]]:
    """Remove and return the complete frames at the start of `buffer`."""
    messages = []
    while len(buffer) >= _HEADER.size:
        size = frame_size(buffer)
        end = _HEADER.size + size
        if len(buffer) < end:
            break
        messages.append(decode(bytes(buffer[_HEADER.size : end])))
        del buffer[:end]
    return messages


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
