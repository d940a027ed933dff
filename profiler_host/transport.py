"""Streams batches to the profiling server from one background thread, through the relay
process that holds the gRPC stream (`link.py`, `relay.py`).

App threads only hand over finished requests, and every request's count (deque appends);
encoding, the network, retries and waiting all happen here; the counts go out every
COUNTS_EVERY seconds. Every batch stays in a byte-bounded backlog until
the server acks it as stored; after a reconnect (exponential backoff with jitter) the
backlog is sent again under the same session, and the server stores each seq once. Over
budget, whole requests are dropped before they are encoded and counted by reason; the
counts reach the server in the next batch. Created lazily, and never carried across a
fork: a child process starts a session of its own.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from profiler_core.wire import ingest_pb2
from profiler_host import request_counts
from profiler_host.batching import Batcher
from profiler_host.events import EVENT_INTS
from profiler_host.functions import FunctionRegistry
from profiler_host.link import Link, Stream, StreamClosed
from profiler_host.recording import Request
from profiler_host.security import ChannelSecurity

log = logging.getLogger("profiler_host")

PROFILER_VERSION = "0.1.0"
MAX_BACKOFF = 30.0
COUNTS_EVERY = 5.0  # seconds between reports of every request's counts
# a request's share of a batch, estimated before it is encoded: its start and end records,
# and per event its kind, function, call and time delta as varints (tests check it bounds)
WIRE_BYTES_PER_REQUEST = 256
WIRE_BYTES_PER_EVENT = 12
# CPython 3.12 starts no thread once the interpreter finalizes, not even in exit handlers
# (3.11 and 3.13 do): there the first sampled request waits this long at most for the
# stream's threads (see Transport.start)
STREAM_THREADS_WAIT = 0.25 if sys.version_info[:2] == (3, 12) else 0.0


@dataclass(frozen=True)
class TransportSettings:
    server: str
    service: str
    buffer_bytes: int = 32 * 1024**2
    flush_interval: float = 1.0
    max_batch_events: int = 50_000
    # all stored and nothing to send for this long: the stream ends until the next request
    # (gRPC's core threads in the relay wake about a dozen times a second while it is open)
    idle_close: float = 5.0
    security: ChannelSecurity = field(default_factory=ChannelSecurity)


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
        self._hurry = threading.Event()  # a flush or stop: send now, no lingering
        self._collected_at = 0.0  # monotonic time the last batch was made (or found empty)
        self._streaming = threading.Event()  # the first stream's threads run, or it failed
        self._logged_refusals: set[tuple[str, str]] = set()
        self._pid = os.getpid()
        self.link = Link(settings.server, settings.security)
        # every request of the app is added here (through the profiler's `counts`, which the
        # middlewares use): one table for the transport's life, emptied for each session
        self.counts = request_counts.new_table(self._counted)
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
        self._backlog_requests: dict[int, int] = {}  # requests each unacked batch ends
        self.stored_batches = 0
        self.idle_closes = 0  # streams ended for idleness (and opened again on demand)
        self.refused: str | None = None  # why the server refused the last stream
        self.connected = False
        self._outbox: queue.SimpleQueue[bytes | None] | None = None
        self.counts.take()  # a forked child's table holds its parent's counts
        self.counts.waiting = True  # the first request counted starts this session's thread
        self.counts.lost = 0
        self._counts_due = time.monotonic() + COUNTS_EVERY
        self._counts_now = False  # a flush or stop sends the counts at once

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

    def _counted(self) -> None:
        """The first request counted since the last report: it goes out within
        COUNTS_EVERY, even from an app none of whose requests is sampled."""
        self._ensure_thread()
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
        """In a child: forget the parent's session, thread and relay (never reused)."""
        self._pid = os.getpid()
        self.link.forget()
        self._thread = None
        self._idle = False
        self._finished.clear()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._hurry = threading.Event()
        self._streaming = threading.Event()
        self._lock = threading.Lock()
        self._collecting = threading.Lock()
        self._new_session()

    def flush(self, timeout: float) -> bool:
        """Sends what is recorded and waits up to `timeout` s for acks; True if all stored."""
        if self._thread is None:
            return not self._finished
        deadline = time.monotonic() + timeout
        self._counts_now = True
        self._hurry.set()
        self._wake.set()
        while time.monotonic() < deadline:
            with self._collecting:  # a request being encoded is in neither
                if not self._finished and not self._backlog and not self.counts.pending:
                    return self.refused is None  # a refusing server stored nothing
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
        # the relay boots while the first requests run, so the first batch finds it ready
        with contextlib.suppress(OSError):  # if it cannot, each attempt tries again
            self.link.prepare()
        backoff = 0.5
        while not self._stopping.is_set():
            idle = False
            try:
                idle = self._serve_connection()
                if self.refused is None:
                    backoff = 0.5
            except Exception as exc:  # the server is away: keep recording, retry later
                log.debug("request-profiler: stream to %s ended: %s", self.settings.server, exc)
            finally:
                self._streaming.set()  # whatever became of it, start() waits no more
                self.connected = False
                self._outbox = None
            if self.refused is not None:
                self._abandon_backlog(self.refused)
            if self._stopping.is_set():
                break
            if idle:  # no thread of ours or gRPC's wakes until work comes (a kick)
                self.idle_closes += 1
                self._wake.clear()  # set by the ended stream's reader
                if self._next_wait() is None and not self._stopping.is_set():
                    self._wake.wait()
                    self._wake.clear()
                self._idle = False
                continue
            self._back_off(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, MAX_BACKOFF)
        self.link.reset()  # stopped: the relay ends with its socket

    def _back_off(self, seconds: float) -> None:
        """Waits `seconds` before the next attempt, batching every flush interval meanwhile
        while there is work: requests that finish while the server is away go into the
        budget (or are dropped, counted) as they come, instead of piling up whole for a
        backoff of up to 30 s; with nothing to do it sleeps until a request or a stop."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set():
            self._collect()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            wait = self._next_wait()
            self._sleep(left if wait is None else min(left, wait))

    def _serve_connection(self) -> bool:
        """Streams until the server goes, the profiler stops, or everything is stored and
        nothing came for `idle_close` s (then True: the stream was ended for idleness)."""
        self.refused = None  # each attempt may find the server's mind changed
        outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        outbox.put(self._hello())
        with self._lock:
            for payload in self._backlog.values():
                outbox.put(payload)
        self._outbox = outbox
        replies = self.link.stream(_drain(outbox))
        # set by the reader as the stream ends, before it wakes this thread: a wake-up that
        # this thread's own `_sleep` clears is not lost on it then (the reader thread may
        # still be alive when this thread looks)
        ended = threading.Event()
        acks = threading.Thread(
            target=self._read_acks,
            args=(replies, ended),
            name="request-profiler-acks",
            daemon=True,
        )
        acks.start()
        self._streaming.set()
        self.connected = True
        idle = False
        while not self._stopping.is_set() and not ended.is_set():
            wait = self._next_wait()
            if wait is None and not self._backlog:
                if not self._sleep(self.settings.idle_close):
                    idle = True  # the server has it all and nothing came: half-close
                    break
            else:
                self._sleep(wait)
            self._collect()
        outbox.put(None)  # the stream's writer ends, whatever ended the stream
        acks.join(timeout=1.0 if idle else 0.0)
        replies.cancel()
        acks.join(timeout=1.0)
        if not replies.finish(timeout=1.0) or acks.is_alive():
            self.link.reset()  # a relay that does not answer is replaced at the next stream
            acks.join()
        return idle

    def _sleep(self, timeout: float | None) -> bool:
        """Sleeps until `timeout` (False) or a kick (True). Woken before its time (a request
        ended, or an ack came), it then waits until the next batch is due, so that requests
        ending close together share one. A batch costs the host's and gRPC's threads about
        the same CPU whatever it holds (milliseconds on a slow machine: the encode, the
        send through gRPC's threads, the ack back through them), so at ten sampled requests
        a second an app pays for at most one batch per flush interval, not one per request.
        A flush, a stop or the stream's end ends that wait."""
        woken = self._wake.wait(timeout)
        if woken:
            left = self._until_due()
            if left > 0:
                self._hurry.wait(left)
        self._wake.clear()
        self._idle = False
        return woken

    def _until_due(self) -> float:
        """Seconds until the next batch: one flush interval after the last (0 after a
        quiet spell, so a request that ends alone goes at once)."""
        return max(self._collected_at + self.settings.flush_interval - time.monotonic(), 0.0)

    def _next_wait(self) -> float | None:
        """Until the next batch is due while requests run or wait to be sent; otherwise no
        timeout: an idle app's transport costs nothing until a request, a drop, a flush, a
        stop or the stream's end wakes it."""
        self._idle = True  # before looking: work that arrives after the look kicks
        self.counts.waiting = True
        if self._finished or self._running() or any(self._unreported):
            self._idle = False
            return self._until_due()
        if self.counts.pending:  # the report is due on a timer: requests counted meanwhile
            self.counts.waiting = False  # need not wake it, but a finished request does
            return max(self._counts_due - time.monotonic(), 0.0)
        return None

    def _read_acks(self, replies: Stream, ended: threading.Event) -> None:
        """Reads the server's acks, and how the stream ended (blocked on the relay's socket
        meanwhile: no wake-up while there is nothing to read), which it marks in `ended`."""
        try:
            for message in replies:
                if message.HasField("ack"):
                    self._acked(message.ack.stored, message.ack.rejected)
        except StreamClosed as exc:
            if exc.refusal:
                self._refuse(exc.refusal, exc.details)
            elif exc.code != "CANCELLED":
                log.debug("request-profiler: server closed the stream: %s", exc)
        finally:
            ended.set()
            self._hurry.set()  # the sending loop reconnects at once, lingering or not
            self._wake.set()

    def _refuse(self, reason: str, details: str) -> None:
        """The server will not take this host's profiles: say so once per distinct cause.
        Recording goes on, retries continue; what is recorded meanwhile is dropped."""
        self.refused = reason
        if (reason, details) not in self._logged_refusals:
            self._logged_refusals.add((reason, details))
            log.warning(
                "request-profiler: the server at %s refuses this host (%s: %s); profiles are "
                "dropped until it accepts (check --token, --tls-ca, --tls-cert)",
                self.settings.server,
                reason,
                details,
            )

    def _abandon_backlog(self, reason: str) -> None:
        """After a refusal: the unacked batches are dropped (their requests counted) and a
        new session begins, so the server never waits for the batches it did not get."""
        with self._collecting, self._lock:
            requests = sum(self._backlog_requests.values())
            self._backlog.clear()
            self._backlog_requests.clear()
            self.backlog_bytes = 0
            self.session_id = uuid.uuid4().bytes
            self.batcher = Batcher(self.registry)
            self._seq = 0
        if requests:
            self.drop(reason, requests=requests)

    def _acked(self, stored: Sequence[int], rejected: Sequence[int]) -> None:
        with self._lock:
            for seq in [*stored, *rejected]:
                payload = self._backlog.pop(seq, None)
                self._backlog_requests.pop(seq, None)
                if payload is not None:
                    self.backlog_bytes -= len(payload)
            self.stored_batches += len(stored)
            emptied = not self._backlog
        if emptied:
            self._kick()  # all stored: the idle stream's countdown starts
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
        self._hurry.clear()  # what a flush asked for is taken now
        self._collected_at = time.monotonic()
        with self._collecting:
            self._collect_locked()

    def _collect_locked(self) -> None:
        """Encodes what was recorded since the last batch. Over budget, a request not yet
        announced is dropped whole; one already partly sent loses its new events and ends
        truncated (only its small end record still goes out)."""
        if self.refused is not None:
            self._discard(self.refused)
            return
        spare = self.settings.buffer_bytes - self.backlog_bytes
        room = spare > 0  # not over budget
        announced = self.batcher.announced
        finished: list[Request] = []
        while self._finished:
            request = self._finished.popleft()
            if spare > 0 or request.id in announced:
                finished.append(request)
                spare -= _wire_bytes(request)
            else:
                self.drop("buffer_full", events=_discard_events(request))
        running = [r for r in self._running() if room or r.id in announced]
        if not room:
            for request in [*running, *finished]:
                lost = _discard_events(request)
                if lost:
                    request.truncated = True
                    self.drop("buffer_full", requests=0, events=lost)
        self._report_lost_counts()
        with self._lock:
            drops = self._unreported if any(self._unreported) else None
            self._unreported = (Counter(), Counter())
        builder = self.batcher.build(running, finished, drops)
        if self._counts_now or time.monotonic() >= self._counts_due:
            self._counts_now = False
            self._counts_due = time.monotonic() + COUNTS_EVERY
            builder.route_counts(request_counts.message(self.counts.take()))
        if builder.empty:
            return
        self._seq += 1
        payload = builder.payload(self._seq)
        with self._lock:
            self._backlog[self._seq] = payload
            self._backlog_requests[self._seq] = len(finished)
            self.backlog_bytes += len(payload)
        outbox = self._outbox
        if outbox is not None:
            outbox.put(payload)

    def _report_lost_counts(self) -> None:
        lost = self.counts.lost
        if lost:
            self.counts.lost -= lost
            self.drop(request_counts.LOST, requests=lost)

    def _discard(self, reason: str) -> None:
        """While refused: finished requests, running requests' new events and the counts
        are dropped."""
        self.counts.take()
        while self._finished:
            self.drop(reason, events=_discard_events(self._finished.popleft()))
        for request in self._running():
            lost = _discard_events(request)
            if lost:
                request.truncated = True
                self.drop(reason, requests=0, events=lost)


def _wire_bytes(request: Request) -> int:
    """About what `request` adds to a batch (an upper estimate: events go out as varint
    columns of a few bytes each), so that one batch overshoots the budget by at most one
    request however many finished at once."""
    ints = sum(len(lane.buffer) - lane.carried for lane in request.lanes)
    return WIRE_BYTES_PER_REQUEST + ints // EVENT_INTS * WIRE_BYTES_PER_EVENT


def _discard_events(request: Request) -> int:
    return sum(lane.discard() for lane in request.lanes)


def _drain(outbox: queue.SimpleQueue[bytes | None]) -> Iterator[bytes]:
    while True:
        item = outbox.get()
        if item is None:
            return
        yield item
