"""The frames between the app and its relay process over their Unix stream socket: a kind
byte, the body's length (4 bytes, big-endian), the body. One stream at a time: the app
sends SETTINGS once, then for each stream OPEN, MESSAGEs (serialized `HostMessage`s) and
END (the host's half-close) or CANCEL; the relay answers REPLYs (serialized
`ServerMessage`s) and, last for each stream, CLOSED (how it ended, as JSON)."""

from __future__ import annotations

import asyncio
import socket
import struct

HEADER = struct.Struct(">BI")
# app -> relay
SETTINGS, OPEN, MESSAGE, END, CANCEL = 1, 2, 3, 4, 5
# relay -> app
REPLY, CLOSED = 16, 17
# a message is at most gRPC's send limit (64 MiB); a longer length is a broken peer
MAX_BODY = 80 * 1024**2


def pack(kind: int, body: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(body)) + body


def send(sock: socket.socket, kind: int, body: bytes = b"") -> None:
    """Writes one frame whole (the caller serialises writers): `sendall`, since a signal
    that interrupts a blocking send after part of it leaves only that part sent."""
    sock.sendall(pack(kind, body))


def body_length(header: bytes) -> tuple[int, int]:
    """The kind and body length a header gives; ValueError for a length no peer sends."""
    kind, length = HEADER.unpack(header)
    if length > MAX_BODY:
        raise ValueError(f"relay frame of {length} bytes: over {MAX_BODY}")
    return kind, length


def receive(sock: socket.socket) -> tuple[int, bytes] | None:
    """The next frame, or None at the end of the socket (the peer closed or died)."""
    header = _exactly(sock, HEADER.size)
    if header is None:
        return None
    kind, length = body_length(header)
    body = _exactly(sock, length)
    if body is None:
        return None
    return kind, body


async def read(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """`receive` for the relay's event loop."""
    try:
        kind, length = body_length(await reader.readexactly(HEADER.size))
        return kind, await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        return None


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return bytes(buffer)
