"""The gRPC side of ingest: one bidirectional stream per host session.

Messages arrive as raw bytes (no deserializer registered), so the size limit and
undecodable input are ours to count and answer with a clear status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from profiler_core.wire import ingest_pb2
from profiler_server.assembly import problems as P
from profiler_server.assembly.session import MAX_NS
from profiler_server.metrics.health import ServerHealth
from profiler_server.pipeline import Inbound, Pipeline

log = logging.getLogger(__name__)

SERVICE = "request_profiler.v1.Ingest"
MAX_SERVICE = 200  # sessions.service; hostname and versions are cut to their columns instead


def _hello_problem(hello: ingest_pb2.Hello) -> str | None:
    """Why a Hello cannot be used (None: it can, after cutting overlong descriptions)."""
    if len(hello.session_id) != 16 or not hello.service:
        return "Hello needs a 16-byte session_id and a service"
    if len(hello.service) > MAX_SERVICE:
        return f"service name longer than {MAX_SERVICE} characters"
    if not (0 <= hello.wall_ns < MAX_NS and 0 <= hello.monotonic_ns < MAX_NS):
        return "wall_ns and monotonic_ns must be clock readings (non-negative ns)"
    hello.hostname = hello.hostname[:255]
    hello.python_version = hello.python_version[:64]
    hello.profiler_version = hello.profiler_version[:64]
    if hello.pid > 2**31 - 1:
        hello.pid = 0
    return None


class _Abort:
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details


class StreamHandle:
    """Lets the worker thread answer on this stream (acks, end, abort) through the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.outbox: asyncio.Queue[ingest_pb2.ServerMessage | _Abort | None] = asyncio.Queue()

    def send(self, message: ingest_pb2.ServerMessage | None) -> None:
        self._loop.call_soon_threadsafe(self.outbox.put_nowait, message)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._loop.call_soon_threadsafe(self.outbox.put_nowait, _Abort(code, details))


class IngestService:
    def __init__(self, pipeline: Pipeline, health: ServerHealth, max_message_bytes: int) -> None:
        self.pipeline = pipeline
        self.health = health
        self.max_message_bytes = max_message_bytes
        self.draining = asyncio.Event()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Stream": grpc.stream_stream_rpc_method_handler(
                    self.stream,
                    request_deserializer=None,
                    response_serializer=ingest_pb2.ServerMessage.SerializeToString,
                )
            },
        )

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ingest_pb2.ServerMessage]:
        handle = StreamHandle(asyncio.get_running_loop())
        self.health.open_streams.inc()
        reader = asyncio.create_task(self._read(requests, handle))
        try:
            while True:
                message = await handle.outbox.get()
                if message is None:
                    return
                if isinstance(message, _Abort):
                    await context.abort(message.code, message.details)
                yield message
        finally:
            self.health.open_streams.dec()
            if not reader.done():
                reader.cancel()
                await self._submit(Inbound(handle, closed=True))

    async def _read(self, requests: AsyncIterator[bytes], handle: StreamHandle) -> None:
        hello_seen = False
        try:
            async for raw in self._until_draining(requests):
                self.health.bytes.inc(len(raw))
                if len(raw) > self.max_message_bytes:
                    self.health.rejected.labels(P.OVERSIZED).inc()
                    handle.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"message of {len(raw)} bytes exceeds the server's limit of "
                        f"{self.max_message_bytes} bytes (--max-message-bytes); "
                        "send smaller batches",
                    )
                    break
                try:
                    message = ingest_pb2.HostMessage.FromString(raw)
                except DecodeError:
                    self.health.rejected.labels(P.GARBAGE).inc()
                    continue
                body = message.WhichOneof("body")
                if body == "hello":
                    problem = _hello_problem(message.hello)
                    if problem is not None:
                        self.health.rejected.labels(P.BAD_HELLO).inc()
                        handle.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad Hello: {problem}")
                        break
                    hello_seen = True
                    await self._submit(Inbound(handle, hello=message.hello))
                elif body == "batch":
                    if not hello_seen:
                        self.health.rejected.labels(P.NO_HELLO).inc()
                        handle.abort(
                            grpc.StatusCode.FAILED_PRECONDITION, "send Hello before batches"
                        )
                        break
                    await self._submit(Inbound(handle, batch=message.batch, raw=raw))
                else:
                    self.health.rejected.labels(P.GARBAGE).inc()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the peer went away or sent something grpc refused
            log.debug("stream ended: %s", exc)
            if "larger than max" in str(exc):
                self.health.rejected.labels(P.OVERSIZED).inc()
        # After the last message is processed the worker ends the stream (None in outbox).
        # Also after an abort above: the worker must learn that the session's stream ended.
        await self._submit(Inbound(handle, closed=True))

    async def _until_draining(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        iterator = aiter(requests)
        drain = asyncio.ensure_future(self.draining.wait())
        nxt: asyncio.Future | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(anext(iterator))
                done, _ = await asyncio.wait({nxt, drain}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    return
                try:
                    message = nxt.result()
                except StopAsyncIteration:
                    return
                yield message
        finally:
            drain.cancel()
            if nxt is not None:
                # A read still running is cancelled (else it fails later, stream aborted,
                # with nobody to see it); it, or one that ended while this reader was being
                # cancelled, has its outcome retrieved, or asyncio logs "Task exception was
                # never retrieved" (gRPC ends a cancelled read with StopAsyncIteration).
                nxt.cancel()
                nxt.add_done_callback(_retrieve)

    async def _submit(self, item: Inbound) -> None:
        # A full queue means storage is behind: wait, which stops reading this stream and
        # lets gRPC flow control slow the host down (its batches wait in its own buffer).
        while not self.pipeline.submit(item):
            await asyncio.sleep(0.002)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
