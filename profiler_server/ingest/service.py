"""The gRPC side of ingest: one bidirectional stream per host session.

Messages arrive as raw bytes (no deserializer registered), so the size limit and
undecodable input are ours to count and answer with a clear status.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from profiler_core.wire import ingest_pb2
from profiler_server.access.tokens import IngestTokens, bearer, permits
from profiler_server.assembly import problems as P
from profiler_server.assembly.session import MAX_NS
from profiler_server.assembly.text import storable
from profiler_server.ingest.lenient import decode_repaired
from profiler_server.metrics.health import ServerHealth
from profiler_server.pipeline import Inbound, Pipeline

log = logging.getLogger(__name__)

SERVICE = "request_profiler.v1.Ingest"
MAX_SERVICE = 200  # sessions.service; hostname and versions are cut to their columns instead
MAX_HOSTNAME = 255  # sessions.hostname
MAX_VERSION = 64  # sessions.python_version, sessions.profiler_version


def _hello_problem(hello: ingest_pb2.Hello, max_name_length: int, problems: Counter) -> str | None:
    """Why a Hello cannot be used (None: it can, its text made storable, overlong
    descriptions cut)."""
    if len(hello.session_id) != 16 or not hello.service:
        return "Hello needs a 16-byte session_id and a service"
    if len(hello.service) > MAX_SERVICE:
        return f"service name longer than {MAX_SERVICE} characters"
    if not (0 <= hello.wall_ns < MAX_NS and 0 <= hello.monotonic_ns < MAX_NS):
        return "wall_ns and monotonic_ns must be clock readings (non-negative ns)"
    hello.service = storable(hello.service, MAX_SERVICE, problems)
    hello.hostname = storable(hello.hostname, min(MAX_HOSTNAME, max_name_length), problems)
    hello.python_version = storable(hello.python_version, MAX_VERSION, problems)
    hello.profiler_version = storable(hello.profiler_version, MAX_VERSION, problems)
    if hello.pid > 2**31 - 1:
        hello.pid = 0
    return None


class _Abort:
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details


class Mailbox:
    """Replies from the worker thread to the streams of one event loop: the worker posts
    them here and the loop is woken once for all that wait (a group's acks to a thousand
    streams are one wake-up, not a thousand `call_soon_threadsafe` writes to its pipe).

    Lock-free: `post` appends before it reads `_scheduled`, and `_deliver` clears
    `_scheduled` before it drains, so a reply is either drained by a delivery already
    scheduled or schedules one of its own (at worst one wake-up too many)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: deque[tuple[StreamHandle, object]] = deque()
        self._scheduled = False

    def post(self, handle: StreamHandle, message: object) -> None:
        self._waiting.append((handle, message))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        waiting = self._waiting
        while waiting:
            handle, message = waiting.popleft()
            handle.put(message)


class StreamHandle:
    """Lets the worker thread answer on this stream (acks, end, abort) through the loop.

    The replies wait in a deque for the stream's writer, which sleeps on one future while
    there is none: an `asyncio.Queue` did the same with more Python per reply."""

    def __init__(self, mailbox: Mailbox) -> None:
        self._mailbox = mailbox
        self._replies: deque[ingest_pb2.ServerMessage | _Abort | None] = deque()
        self._wake: asyncio.Future[None] | None = None

    def send(self, message: ingest_pb2.ServerMessage | None) -> None:
        """Any thread: `message` goes out after those sent before it (None ends the stream)."""
        self._mailbox.post(self, message)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._mailbox.post(self, _Abort(code, details))

    def put(self, message: ingest_pb2.ServerMessage | _Abort | None) -> None:
        """The loop's thread: hands `message` to the writer, waking it if it sleeps."""
        self._replies.append(message)
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():  # cancelled with its stream
                wake.set_result(None)

    async def next(self) -> ingest_pb2.ServerMessage | _Abort | None:
        """The next reply, waiting for one."""
        replies = self._replies
        while not replies:
            self._wake = wake = asyncio.get_running_loop().create_future()
            await wake
        return replies.popleft()


LISTENER = "grpc"
DRAIN = "the server is draining"  # the cancel message that ends a stream's pending read


class IngestService:
    def __init__(
        self,
        pipeline: Pipeline,
        health: ServerHealth,
        max_message_bytes: int,
        tokens: IngestTokens | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.health = health
        self.max_message_bytes = max_message_bytes
        self.tokens = tokens
        self.draining = False
        self._reading: set[asyncio.Task] = set()  # readers waiting for their next message
        # made in the server's loop (`app.ProfilingServer.start`), where all its streams run
        self._loop = asyncio.get_running_loop()
        self._mailbox = Mailbox(self._loop)
        # messages waiting for room in the worker's queue, in arrival order, one per stream
        # at most (each stream's reader waits for its own), and their streams' wake-ups
        self._held: deque[tuple[Inbound, asyncio.Future[None]]] = deque()

    def drain(self) -> None:
        """Stops reading: a stream waiting for its next message ends as if its host had
        closed it (what it sent before is stored and acked), one passing a message on ends
        once it has."""
        self.draining = True
        for reader in list(self._reading):
            reader.cancel(DRAIN)

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
        self, _requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        """One host session: a reader task passes messages on to the worker, while this
        task writes the worker's replies. A plain coroutine on `context.read()` and
        `context.write()` (one of each pending at most; gRPC's request iterator goes
        unused): an async generator on each side cost the event loop two generator hops
        per message."""
        services = await self._authenticate(context)
        handle = StreamHandle(self._mailbox)
        self.health.open_streams.inc()
        reader = asyncio.create_task(self._read(context, handle, services))
        try:
            while (message := await handle.next()) is not None:
                if isinstance(message, _Abort):
                    await context.abort(message.code, message.details)
                await context.write(message)
        finally:
            self.health.open_streams.dec()
            if not reader.done():
                reader.cancel()
                await self._submit(Inbound(handle, closed=True))

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> frozenset[str] | None:
        """The services this stream's token may send for (None: no tokens configured);
        a stream without a known token ends here, UNAUTHENTICATED, before any message."""
        if self.tokens is None:
            return None
        metadata = dict(context.invocation_metadata() or ())
        token = bearer(metadata.get("authorization"))
        services = self.tokens.services_for(token)
        if services is None:
            reason = "no_token" if token is None else "bad_token"
            self.health.denied.labels(LISTENER, reason).inc()
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "this server needs an ingest token: set --token or PROFILER_TOKEN on the host"
                if token is None
                else "unknown ingest token (see the server's --ingest-tokens-file)",
            )
        return services

    async def _read(
        self,
        context: grpc.aio.ServicerContext,
        handle: StreamHandle,
        services: frozenset[str] | None,
    ) -> None:
        hello_seen = False
        try:
            while (raw := await self._next_message(context)) is not None:
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
                    message = self._repaired(raw)
                    if message is None:
                        continue
                    raw = message.SerializeToString()  # what the spool keeps must decode
                body = message.WhichOneof("body")
                if body == "hello":
                    if hello_seen:
                        self.health.rejected.labels(P.SECOND_HELLO).inc()
                        handle.abort(
                            grpc.StatusCode.FAILED_PRECONDITION,
                            "one Hello per stream: open a new stream for another session",
                        )
                        break
                    repaired: Counter = Counter()
                    problem = _hello_problem(
                        message.hello, self.pipeline.settings.max_name_length, repaired
                    )
                    if problem is not None:
                        self.health.rejected.labels(P.BAD_HELLO).inc()
                        handle.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad Hello: {problem}")
                        break
                    self.health.count_problems(repaired)
                    if services is not None and not permits(services, message.hello.service):
                        self.health.denied.labels(LISTENER, "wrong_service").inc()
                        handle.abort(
                            grpc.StatusCode.PERMISSION_DENIED,
                            f"this ingest token may not send for service {message.hello.service!r}",
                        )
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

    def _repaired(self, raw: bytes) -> ingest_pb2.HostMessage | None:
        """A message protobuf refused, with its strings that are not UTF-8 repaired; None
        (counted as garbage) if it is not a HostMessage even so."""
        repaired: Counter = Counter()
        try:
            message = decode_repaired(raw, repaired)
        except DecodeError:
            self.health.rejected.labels(P.GARBAGE).inc()
            return None
        self.health.count_problems(repaired)
        return message

    async def _next_message(self, context: grpc.aio.ServicerContext) -> bytes | None:
        """The stream's next message; None once it ends or the server drains. The drain
        cancels the reads that wait (`drain`) rather than each read racing it: a task and
        a wait of two futures per message were a tenth of the event loop's time under a
        fleet."""
        if self.draining:
            return None
        reader = asyncio.current_task()
        assert reader is not None  # runs in the stream's reader task
        self._reading.add(reader)
        try:
            message = await context.read()
        except asyncio.CancelledError:
            if not self.draining:  # the stream ended: `stream` closes the session
                raise
            reader.uncancel()  # a stream that ended as the drain began closes twice: harmless
            return None
        finally:
            self._reading.discard(reader)
        return None if message is grpc.aio.EOF else message

    async def _submit(self, item: Inbound) -> None:
        """Queues `item` for the worker. A full queue means storage is behind: the stream
        waits in line (`_held`) until the worker takes the next group, which stops reading
        it and lets gRPC flow control slow the host down (its batches wait in its own
        buffer). The line is fed in order as the worker makes room, each item's stream
        woken as its item goes in: streams retrying on a timer, or all woken at each
        group, took the event loop's share of the core from the worker."""
        if not self._held and self.pipeline.submit(item):
            return
        queued = self._loop.create_future()
        self._held.append((item, queued))
        self._feed()
        await queued

    def _feed(self) -> None:
        """Moves the line into the worker's queue while it has room; with some left, asks
        the worker to say when it takes the next group (then tries once more: it may have
        taken one just before it was asked)."""
        held = self._held
        while held:
            item, queued = held[0]
            if not self.pipeline.submit(item):
                self.pipeline.when_room(self._room_made)
                if not self.pipeline.submit(item):
                    return
            held.popleft()
            if not queued.done():  # its stream may have ended meanwhile
                queued.set_result(None)

    def _room_made(self) -> None:
        """The worker took a group off the queue (its thread): feed the line."""
        self._loop.call_soon_threadsafe(self._feed)
