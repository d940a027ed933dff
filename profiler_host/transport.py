"""Streams batches to the profiling server from one background thread.

App threads only hand over finished requests (a deque append); encoding, the network,
retries and waiting all happen here. Every batch stays in a byte-bounded backlog until
the server acks it as stored; after a reconnect (exponential backoff with jitter) the
backlog is sent again under the same session, and the server stores each seq once. Over
budget, whole requests are dropped before they are encoded and counted by reason; the
counts reach the server in the next batch. Created lazily, and never carried across a
fork: a child process starts a session of its own.
"""

from __future__ import annotations

import logging
import os
import platform
import queue
import random
import socket
import sys
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from profiler_core.wire import ingest_pb2
from profiler_host.batching import Batcher
from profiler_host.functions import FunctionRegistry
from profiler_host.recording import Request

log = logging.getLogger("profiler_host")

METHOD = "/request_profiler.v1.Ingest/Stream"
PROFILER_VERSION = "0.1.0"
MAX_BACKOFF = 30.0
# CPython 3.12 starts no thread once the interpreter finalizes, not even in exit handlers
# (3.11 and 3.13 do): there the first sampled request waits this long at most for the
# stream's threads (see Transport.start)
STREAM_THREADS_WAIT = 0.25 if sys.version_info[:2] == (3, 12) else 0.0


@dataclass(frozen=True)
class TransportSettings:
    server: str
    service: str
    buffer_bytes: int = 32 * 1024**2
    flush_interval: float = 0.2
    max_batch_events: int = 50_000


class Transport:
    def __init__(
        self,
        settings: TransportSettings,
        registry: FunctionRegistry,
        running: Callable[[], list[Request]],
    ) -> None:
        self.settings = settings
        self.registry = registry
        self._running = running
        self._finished: deque[Request] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # backlog and counters
        self._collecting = threading.Lock()  # held while requests are between queue and backlog
        self._thread: threading.Thread | None = None
        self._idle = False  # the transport thread waits for a kick, with no timeout
        self._streaming = threading.Event()  # the first stream's threads run, or it failed
        self._pid = os.getpid()
        self._new_session()

    def _new_session(self) -> None:
        self.session_id = uuid.uuid4().bytes
        self.batcher = Batcher(self.registry)
        self._seq = 0
        self._backlog: OrderedDict[int, bytes] = OrderedDict()
        self.backlog_bytes = 0
        self.dropped_requests: Counter[str] = Counter()
        self.dropped_events: Counter[str] = Counter()
        self._unreported: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        self.stored_batches = 0
        self.connected = False
        self._outbox: queue.SimpleQueue[bytes | None] | None = None

    # --- app side: cheap, never blocks on the network -------------------------------

    def start(self) -> None:
        """Starts streaming (in this process): running requests are sent as they record.

        On 3.12 the first call waits (boundedly, once) until the stream's threads run: a
        script whose only request ends just before it exits could not start them later."""
        self._ensure_thread()
        self._kick()
        if STREAM_THREADS_WAIT:
            self._streaming.wait(STREAM_THREADS_WAIT)

    def submit(self, request: Request) -> None:
        """A request has ended; it is encoded and sent from the transport thread."""
        self._ensure_thread()
        self._finished.append(request)
        self._kick()

    def _kick(self) -> None:
        """Wakes the transport thread if it sleeps until there is work: while there is, it
        batches every flush interval and needs no wake per request."""
        if self._idle:
            self._wake.set()

    @property
    def pending(self) -> int:
        """Finished requests not yet taken by the transport thread."""
        return len(self._finished)

    def over_budget(self) -> bool:
        return self.backlog_bytes >= self.settings.buffer_bytes

    def drop(self, reason: str, requests: int = 1, events: int = 0) -> None:
        with self._lock:
            if requests:
                self.dropped_requests[reason] += requests
                self._unreported[0][reason] += requests
            if events:
                self.dropped_events[reason] += events
                self._unreported[1][reason] += events
        self._kick()  # the server hears of it

    # --- lifecycle --------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():
            self.after_fork()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="request-profiler-transport", daemon=True
                    )
                    self._thread.start()

    def after_fork(self) -> None:
        """In a child: forget the parent's session, thread and channel (never reused)."""
        self._pid = os.getpid()
        self._thread = None
        self._idle = False
        self._finished.clear()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._streaming = threading.Event()
        self._lock = threading.Lock()
        self._collecting = threading.Lock()
        self._new_session()

    def flush(self, timeout: float) -> bool:
        """Sends what is recorded and waits up to `timeout` s for acks; True if all stored."""
        if self._thread is None:
            return not self._finished
        deadline = time.monotonic() + timeout
        self._wake.set()
        while time.monotonic() < deadline:
            with self._collecting:  # a request being encoded is in neither
                if not self._finished and not self._backlog:
                    return True
            time.sleep(0.01)
        return False

    def stop(self, timeout: float) -> bool:
        stored = self.flush(timeout)
        self._stopping.set()
        self._wake.set()
        outbox = self._outbox
        if outbox is not None:
            outbox.put(None)
        return stored

    # --- transport thread -------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            channel = grpc.insecure_channel(
                self.settings.server,
                options=[("grpc.max_send_message_length", 64 * 1024**2)],
            )
            try:
                self._serve_connection(channel)
                backoff = 0.5
            except Exception as exc:  # the server is away: keep recording, retry later
                log.debug("request-profiler: stream to %s ended: %s", self.settings.server, exc)
            finally:
                self._streaming.set()  # whatever became of it, start() waits no more
                self.connected = False
                self._outbox = None
                channel.close()
            if self._stopping.is_set():
                break
            self._collect()  # keep batching (within budget) while disconnected
            self._stopping.wait(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _serve_connection(self, channel: grpc.Channel) -> None:
        outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        outbox.put(self._hello())
        with self._lock:
            for payload in self._backlog.values():
                outbox.put(payload)
        self._outbox = outbox
        stream = channel.stream_stream(
            METHOD,
            request_serializer=None,
            response_deserializer=ingest_pb2.ServerMessage.FromString,
        )
        responses = stream(_drain(outbox))
        acks = threading.Thread(
            target=self._read_acks, args=(responses,), name="request-profiler-acks", daemon=True
        )
        acks.start()
        self._streaming.set()
        self.connected = True
        while not self._stopping.is_set() and acks.is_alive():
            self._wake.wait(self._next_wait())
            self._wake.clear()
            self._idle = False
            self._collect()
        responses.cancel()
        acks.join(timeout=1.0)

    def _next_wait(self) -> float | None:
        """The flush interval while requests run or wait to be sent; otherwise no timeout:
        an idle app's transport costs nothing until a request, a drop, a flush, a stop or
        the stream's end wakes it."""
        self._idle = True  # before looking: work that arrives after the look kicks
        if self._finished or self._running() or any(self._unreported):
            self._idle = False
            return self.settings.flush_interval
        return None

    def _read_acks(self, responses: Iterator[ingest_pb2.ServerMessage]) -> None:
        try:
            for message in responses:
                if message.HasField("ack"):
                    self._acked(message.ack.stored, message.ack.rejected)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                log.debug("request-profiler: server closed the stream: %s", exc.code())
        finally:
            self._wake.set()  # the sending loop reconnects at once

    def _acked(self, stored: list[int], rejected: list[int]) -> None:
        with self._lock:
            for seq in [*stored, *rejected]:
                payload = self._backlog.pop(seq, None)
                if payload is not None:
                    self.backlog_bytes -= len(payload)
            self.stored_batches += len(stored)
        if rejected:
            self.drop("rejected_by_server", requests=0, events=0)

    def _hello(self) -> bytes:
        message = ingest_pb2.HostMessage()
        hello = message.hello
        hello.session_id = self.session_id
        hello.service = self.settings.service
        hello.hostname = socket.gethostname()
        hello.pid = os.getpid()
        hello.python_version = platform.python_version()
        hello.wall_ns = time.time_ns()
        hello.monotonic_ns = time.monotonic_ns()
        hello.profiler_version = PROFILER_VERSION
        return message.SerializeToString()

    def _collect(self) -> None:
        with self._collecting:
            self._collect_locked()

    def _collect_locked(self) -> None:
        """Encodes what was recorded since the last batch. Over budget, a request not yet
        announced is dropped whole; one already partly sent loses its new events and ends
        truncated (only its small end record still goes out)."""
        room = not self.over_budget()
        announced = self.batcher.announced
        finished: list[Request] = []
        while self._finished:
            request = self._finished.popleft()
            if room or request.id in announced:
                finished.append(request)
            else:
                self.drop("buffer_full", events=_discard_events(request))
        running = [r for r in self._running() if room or r.id in announced]
        if not room:
            for request in [*running, *finished]:
                lost = _discard_events(request)
                if lost:
                    request.truncated = True
                    self.drop("buffer_full", requests=0, events=lost)
        with self._lock:
            drops = self._unreported if any(self._unreported) else None
            self._unreported = (Counter(), Counter())
        builder = self.batcher.build(running, finished, drops)
        if builder.empty:
            return
        self._seq += 1
        payload = builder.payload(self._seq)
        with self._lock:
            self._backlog[self._seq] = payload
            self.backlog_bytes += len(payload)
        outbox = self._outbox
        if outbox is not None:
            outbox.put(payload)


def _discard_events(request: Request) -> int:
    return sum(lane.discard() for lane in request.lanes)


def _drain(outbox: queue.SimpleQueue[bytes | None]) -> Iterator[bytes]:
    while True:
        item = outbox.get()
        if item is None:
            return
        yield item
