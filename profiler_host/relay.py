"""The host's relay: the process that holds the host's gRPC stream to the server, started by
exec from the app (`link.py`) and fed the app's messages over a Unix socket.

gRPC's core is not fork-safe: a process forked while one of its threads is inside gRPC
(a stream being set up, a read in flight) gets a broken copy of its state, and the child
hangs or aborts as soon as it makes a channel of its own. An app the host is loaded into
forks when it likes (`multiprocessing`, a job runner), so gRPC never runs in the app: the
app encodes batches and keeps them until acked, and this process only carries them. It
also keeps gRPC's polling threads off the app's GIL. It carries one stream at a time, as
the app's transport opens them, and exits when the app's end of the socket closes
(the app stopped, exited or died).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio

from profiler_host import relay_frames as frames
from profiler_host.security import ChannelSecurity

METHOD = "/request_profiler.v1.Ingest/Stream"
OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024**2),  # far above a batch
    # BDP probing tunes the window of what this end receives, only acks here (the window
    # batches go out in is the server's to tune): off, an ack costs no probe ping, which
    # is a quarter of a batch's CPU in the relay
    ("grpc.http2.bdp_probe", 0),
]
# A server that refuses this host's credentials or certificate refuses them again on
# every retry: the app drops what it records meanwhile, counted by these reasons.
REFUSALS = {
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
}
TLS_FAILURE = "tls_handshake"
_TLS_WORDS = ("handshake", "ssl", "certificate", "tsi_")
# Under TLS 1.3 a server that refuses the host's certificate closes the connection right
# after the handshake: the host sees only this (a server away refuses the connection).
_CLOSED_IN_HANDSHAKE = ("failed to connect", "socket closed")


def refusal(error: grpc.aio.AioRpcError, tls: bool) -> str:
    """The drop reason when `error` means the server will not take this host's profiles
    ("" when it may take them on a later try)."""
    code = error.code()
    if code in REFUSALS:
        return REFUSALS[code]
    if code != grpc.StatusCode.UNAVAILABLE:
        return ""
    details = (error.details() or "").lower()
    if any(word in details for word in _TLS_WORDS):
        return TLS_FAILURE
    if tls and all(words in details for words in _CLOSED_IN_HANDSHAKE):
        return TLS_FAILURE
    return ""


def open_channel(security: ChannelSecurity, server: str) -> grpc.aio.Channel:
    """A new channel to `server`; certificate files are read now, so renewed ones are used
    from the next stream on."""
    if not security.uses_tls:
        return grpc.aio.insecure_channel(server, options=OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(security.ca),
        private_key=_read(security.key),
        certificate_chain=_read(security.cert),
    )
    return grpc.aio.secure_channel(server, credentials, options=OPTIONS)


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


class Relay:
    """The app's frames in, the stream's replies out, on one event loop: gRPC's asyncio
    stack waits for the network in C with no timeout, so a stream open with nothing to
    carry wakes no Python thread (gRPC's threaded stack polls from Python several times a
    second; the core's own threads wake about a dozen times a second with either)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self.server = ""
        self.security = ChannelSecurity()
        self._outbox: asyncio.Queue[bytes | None] | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._streams: set[asyncio.Task] = set()

    async def run(self, reader: asyncio.StreamReader) -> None:
        """Serves the app's frames until its end of the socket closes (or sends garbage)."""
        try:
            while (frame := await frames.read(reader)) is not None:
                self._handle(*frame)
        except (OSError, ValueError):
            pass
        finally:
            self._end_stream()
            if self._call is not None:
                self._call.cancel()
            if self._streams:
                await asyncio.wait(self._streams, timeout=1.0)

    def _handle(self, kind: int, body: bytes) -> None:
        if kind == frames.SETTINGS:
            settings = json.loads(body)
            self.server = settings["server"]
            self.security = ChannelSecurity(**settings["security"])
        elif kind == frames.OPEN:
            self._open()
        elif kind == frames.MESSAGE and self._outbox is not None:
            self._outbox.put_nowait(body)
        elif kind == frames.END:
            self._end_stream()
        elif kind == frames.CANCEL and self._call is not None:
            self._call.cancel()

    def _end_stream(self) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(None)
            self._outbox = None

    def _open(self) -> None:
        self._end_stream()
        try:
            channel = open_channel(self.security, self.server)
        except OSError as exc:  # a certificate file went away: as if refused
            self._closed("UNAVAILABLE", str(exc), TLS_FAILURE)
            return
        outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        stream: grpc.aio.StreamStreamMultiCallable = channel.stream_stream(
            METHOD, request_serializer=None, response_deserializer=None
        )
        call = stream(_drain(outbox), metadata=self.security.metadata())
        self._outbox, self._call = outbox, call
        task = asyncio.create_task(self._replies(channel, call))
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def _replies(self, channel: grpc.aio.Channel, call: grpc.aio.StreamStreamCall) -> None:
        """Hands the server's replies to the app, then how the stream ended."""
        try:
            async for reply in call:
                self._send(frames.REPLY, reply)
        except grpc.aio.AioRpcError as exc:
            self._closed(exc.code().name, exc.details() or "", refusal(exc, self.security.uses_tls))
        except asyncio.CancelledError:  # cancelled by the app (or the relay is ending)
            self._closed(grpc.StatusCode.CANCELLED.name, "cancelled", "")
        else:
            self._closed("OK", "", "")
        finally:
            if self._call is call:
                self._call = None
            # gRPC's core and its threads stop once no channel object is left (the last
            # one's deallocation shuts them down): the relay keeps none between streams
            await channel.close()

    def _closed(self, code: str, details: str, refused: str) -> None:
        body = json.dumps({"code": code, "details": details, "refusal": refused}).encode()
        self._send(frames.CLOSED, body)

    def _send(self, kind: int, body: bytes) -> None:
        if not self._writer.is_closing():  # else the app is gone: `run` sees the end
            self._writer.write(frames.pack(kind, body))


async def _drain(outbox: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while (item := await outbox.get()) is not None:
        yield item


async def _serve(sock: socket.socket) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    await Relay(writer).run(reader)
    writer.close()


def main() -> None:
    """The relay's entry point (`link.py` starts it with the app's end of a socket pair as
    standard input). It ends with the app's socket, and only then: Ctrl-C in the app's
    terminal is the app's to handle, and a service manager that stops the app by sending
    SIGTERM to each of its processes (systemd's control-group kill) lets the app flush
    its last batches through this relay as it stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asyncio.run(_serve(socket.socket(fileno=0)))
