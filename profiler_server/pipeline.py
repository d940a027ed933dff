"""The ingest worker: it groups queued host messages, hands them to the session lifecycle
(worker/lifecycle.py) and assembles what they finish; the storer (worker/storer.py)
commits one storage transaction per group on its own thread, in order, and sends the acks
after it, while the worker assembles the next group. Housekeeping runs between groups on
its own schedule, retention on its own thread (worker/housekeeping.py). A single thread
owns all session state, so nothing in it needs a lock; streams talk to it through a
bounded queue (which is the backpressure)."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError, StatementError

from profiler_core.wire import ingest_pb2
from profiler_server.assembly import problems as P
from profiler_server.assembly.session import Limits, Session
from profiler_server.metrics.health import ServerHealth
from profiler_server.metrics.profiles import ProfileMetrics
from profiler_server.settings import Settings
from profiler_server.storage.writer import StoredRequests, Writer, WriteSet
from profiler_server.worker.group import Group, Inbound, Stream, events
from profiler_server.worker.housekeeping import Housekeeping, Retention
from profiler_server.worker.lifecycle import Sessions
from profiler_server.worker.storer import Storer

__all__ = ["Inbound", "Pipeline", "Stream"]

log = logging.getLogger(__name__)

GROUP_MAX = 256  # messages per storage transaction
GROUP_MAX_EVENTS = 100_000  # events per storage transaction: bounds its time, so the ack lag
GROUP_LINGER = 0.02  # seconds a group waits to fill: what an ack waits at most for it
LINGER_FROM = 2 / GROUP_LINGER  # messages/s from which a linger gathers more than one
STOP_SLACK = 5.0  # seconds past the stop timeout for the group in hand


@dataclass
class Assembled:
    """A group ready to store: its messages, what they made, the problems they counted."""

    items: list[Inbound]
    group: Group
    problems: Counter


def _message_at_fault(exc: Exception) -> bool:
    """Whether a failed group may hold a message the store can never take: the database
    refused the data, or assembling it failed. Any other database error (away, locked,
    deadlocked, a table or a privilege missing) is the database's: the hosts resend later."""
    if isinstance(exc, DBAPIError):
        return isinstance(exc, DataError | IntegrityError) and not exc.connection_invalidated
    return isinstance(exc, StatementError) or not isinstance(exc, SQLAlchemyError)


class Pipeline:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        health: ServerHealth,
        profiles: ProfileMetrics,
        clock: Callable[[], float] = time.monotonic,
        listeners: Sequence[Callable[[StoredRequests], None]] = (),
    ) -> None:
        """`listeners` see every committed group of requests (e.g. the Pyroscope exporter);
        they run in this worker, so they must be quick and must not raise."""
        self.engine = engine
        self.settings = settings
        self.health = health
        self.profiles = profiles
        self.clock = clock
        self.listeners = listeners
        self.owner = str(uuid.uuid4())
        self.writer = Writer(engine, self.owner)
        self.write_lock = threading.Lock()  # SQLite has one writer: commits take turns
        self.queue: queue.Queue[Inbound] = queue.Queue(maxsize=1024)
        limits = Limits(
            settings.max_request_events,
            settings.max_open_requests,
            settings.max_session_functions,
            settings.max_name_length,
        )
        self.lifecycle = Sessions(engine, self.owner, limits, self.write_lock)
        self.housekeeping = Housekeeping(settings, self.lifecycle)
        self.retention = Retention(engine, settings, self.write_lock)
        self.storer: Storer[Assembled] = Storer(self._store)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._rate = 0.0  # messages taken per second, over the last whole second
        self._rate_since = time.monotonic()
        self._taken = 0
        self._deadline = 0.0
        self._on_room: Callable[[], None] | None = None

    @property
    def sessions(self) -> dict[str, Session]:
        """The live sessions, by id."""
        return self.lifecycle.live

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Starts the worker and its storer (a worker not started, as in tests, stores each
        group before `_process` returns)."""
        self.storer.start()
        self._thread = threading.Thread(target=self._run, name="profiler-ingest", daemon=True)
        self._thread.start()
        self.retention.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stores and acks what is queued, for at most `timeout` seconds (and the group in
        hand when it passes); what is left is logged, and its streams end with UNAVAILABLE
        so that their hosts resend it (to this server once back, or another)."""
        if self._thread is None:
            return
        self.retention.stop()
        self._deadline = time.monotonic() + timeout
        self._stopping.set()
        self._thread.join(timeout + STOP_SLACK)
        if self._thread.is_alive():
            log.error("the ingest worker is still storing a group at shutdown; its acks are lost")
        self._thread = None
        self.storer.stop(STOP_SLACK)

    def submit(self, item: Inbound) -> bool:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            return False
        self.health.backlog.set(self.queue.qsize())
        return True

    def when_room(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once, on the worker's thread, the next time the worker takes
        messages off the queue: how streams waiting on a full queue learn when to try
        again. The worker may have taken some just before this is called, so the caller
        tries `submit` once more after it before waiting."""
        self._on_room = callback

    def _made_room(self) -> None:
        callback, self._on_room = self._on_room, None
        if callback is not None:
            callback()

    def _run(self) -> None:
        while True:
            stopping = self._stopping.is_set()
            if stopping and (self.queue.empty() or time.monotonic() >= self._deadline):
                self.catch_up()
                self._abandon()
                return
            wait = 0.05 if stopping else self.housekeeping.wait(self.clock())
            items = self._next_group(wait)
            self.health.backlog.set(self.queue.qsize())
            if items:
                self._process(items)
            else:
                self.catch_up()
            if not stopping and self.housekeeping.due(self.clock()):
                self._housekeep()

    def _next_group(self, wait: float) -> list[Inbound]:
        """The messages of one transaction: what is queued, within the group bounds, and
        when messages arrive at LINGER_FROM a second or more, what arrives within
        GROUP_LINGER of the first. A group has a fixed cost of a few milliseconds: at a
        steady stream from many hosts, groups of one message each would spend most of the
        core on it. Below that rate a linger would gather nothing and only delay the ack
        (a host holds what is not acked in its buffer)."""
        try:
            first = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
        except queue.Empty:
            return []
        items = [first]
        count = events(first)
        now = time.monotonic()
        until = now + GROUP_LINGER
        lingered = self._stopping.is_set() or self._rate < LINGER_FROM
        while len(items) < GROUP_MAX and count < GROUP_MAX_EVENTS:
            try:
                nxt = self.queue.get_nowait()
            except queue.Empty:
                if lingered:
                    break
                lingered = True  # one sleep, not a wake-up per message arriving
                time.sleep(max(0.0, until - time.monotonic()))
                continue
            items.append(nxt)
            count += events(nxt)
        self._made_room()
        self._taken += len(items)
        if now - self._rate_since >= 1.0:
            self._rate = self._taken / (now - self._rate_since)
            self._rate_since, self._taken = now, 0
        return items

    def _abandon(self) -> None:
        """At shutdown: says what was not stored, and ends those streams."""
        streams: dict[int, Stream] = {}
        batches = count = 0
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            streams[id(item.stream)] = item.stream
            if item.batch is not None:
                batches += 1
                count += events(item)
        self._made_room()
        open_requests = self.lifecycle.open_requests()
        if batches:
            log.warning(
                "shutdown: %d batches (%d events) from %d streams not stored within the "
                "timeout; their hosts resend them",
                batches,
                count,
                len(streams),
            )
        if open_requests:
            log.info(
                "shutdown: %d unfinished requests stay in the spool for the next server",
                open_requests,
            )
        for stream in streams.values():
            stream.abort(grpc.StatusCode.UNAVAILABLE, "profiling server shutting down")
        self.health.backlog.set(0)

    # --- one group ---------------------------------------------------------------------------
    def _process(self, items: list[Inbound]) -> None:
        """Assembles one group and hands it to the storer; what the storer gave back (a
        group that failed, and those after it) is redone first, one group at a time."""
        if not self.storer.running:
            self._process_now(items)
        else:
            self._redo_returned()
            job = Assembled(items, Group(), Counter())
            try:
                self._assemble(items, job.group, job.problems)
            except Exception:  # redone alone, after what is before it
                self.storer.wait_idle()
                self._redo_returned(job)
            else:
                self.storer.submit(job)

    def catch_up(self) -> None:
        """Waits for the storer and redoes what it gave back: then every group handed in
        is stored or rejected (when the queue is empty, and in tests)."""
        self.storer.wait_idle()
        self._redo_returned()

    def _assemble(self, items: list[Inbound], group: Group, problems: Counter) -> None:
        now = self.clock()
        stored = self.lifecycle.stored(items)
        for item in items:
            if item.hello is not None:
                self.lifecycle.hello(item, group, now, stored)
            elif item.batch is not None:
                self.lifecycle.batch(item, group, now, problems)
            elif item.closed:
                self.lifecycle.closed(item, group, now)
        self._settle(group, problems)

    def _store(self, job: Assembled) -> None:
        """The storer's step: commit, then metrics and acks (raises if the commit fails)."""
        stored = self._write(job.group)
        self._publish(job.group, job.problems, stored)

    def _redo_returned(self, *also: Assembled) -> None:
        """Redoes, one group at a time, the groups the storer gave back and `also`: their
        sessions are first put back as the database has them, since each was assembled
        on the state a group that was not stored left in memory."""
        redo = [*self.storer.returned(), *also]
        if not redo:
            return
        touched = Group()
        for job in redo:
            touched.sessions.update(job.group.sessions)
        try:
            self.lifecycle.reset(touched, self.clock())
        except Exception:
            log.exception("ingest worker: cannot rebuild sessions, dropping them")
            streams = [item.stream for job in redo for item in job.items]
            self.lifecycle.forget(touched, "profiling server error", streams)
            return
        for job in redo:
            self._process_now(job.items)

    def _process_now(self, items: list[Inbound]) -> None:
        """Assembles, stores and acks one group on this thread; a group that cannot be
        stored is split until the message at fault is found and rejected, so the others
        are stored."""
        group = Group()
        problems: Counter = Counter()
        try:
            self._assemble(items, group, problems)
            stored = self._write(group)
        except Exception as exc:  # the worker must survive anything; its state may not
            self._failed(items, group, exc)
            return
        self._publish(group, problems, stored)

    def _housekeep(self) -> None:
        """Housekeeping's group. It goes to the storer like a group of messages, so the
        worker does not wait for the storer twice a second; a tick that reads what the
        database has waits for every group before it to be stored. Its changes to the
        sessions are made on what memory has: if a group before it fails, the storer
        gives this one back too and the sessions are put back as the database has them
        (the next tick does its work again)."""
        now = self.clock()
        if not self.storer.running or self.housekeeping.reads_storage(now):
            self.catch_up()
        job = Assembled([], Group(), Counter())
        try:
            self.housekeeping.tick(job.group, now, job.problems)
            self._settle(job.group, job.problems)
            if self.storer.running:
                self.storer.submit(job)
            else:
                self._store(job)
        except Exception as exc:
            log.error("housekeeping failed, dropping the affected sessions: %s", exc)
            self.lifecycle.forget(
                job.group, f"profiling server storage failed: {type(exc).__name__}", []
            )
        self.health.open_requests.set(self.lifecycle.open_requests())

    def _settle(self, group: Group, problems: Counter) -> None:
        """Finishes the group's complete requests and spools its batches."""
        group.ws.release.extend(self.lifecycle.release_later)
        self.lifecycle.release_later.clear()
        finishing = [(s, c) for s in list(group.sessions.values()) if (c := s.complete())]
        if finishing:
            self.lifecycle.finish(finishing, group, problems)
        received_at = time.time()
        for session, seq, raw in group.batches:
            payload = raw if session.holds_open(seq) else None
            if payload is not None:
                session.spooled.add(seq)
            group.ws.spool.append((session.id, seq, received_at, payload))
        group.ws.route_minutes = group.route_minutes.rows()

    def _write(self, group: Group) -> StoredRequests:
        if not group.ws:
            return StoredRequests.empty()
        started = time.perf_counter()
        try:
            with self.write_lock:
                return self.writer.write(group.ws)
        finally:
            self.health.write_seconds.observe(time.perf_counter() - started)

    def _publish(self, group: Group, problems: Counter, stored: StoredRequests) -> None:
        """After the commit: metrics, listeners, then the acks (sent whatever the others do:
        what they ack is stored)."""
        try:
            self.profiles.record(stored)
            self.profiles.requests.record(group.ws.route_minutes)
            for listener in self.listeners:
                listener(stored)
            self.health.count_stored(stored.rows)
            for service, req_drops, event_drops in group.drops:
                self.health.count_host_drops(service, req_drops, event_drops)
            self.health.batches.inc(group.batches_received)
            self.health.events.inc(group.events_received)
            self.health.count_problems(problems)
        except Exception:
            log.exception("metrics of a stored group failed")
        for stream, ack in group.acks.values():
            stream.send(ingest_pb2.ServerMessage(ack=ack))
        done = self.clock()
        for received in group.received:
            self.health.ack_lag.observe(done - received)
        for stream in group.closes:
            stream.send(None)

    # --- a group that cannot be stored -----------------------------------------------------------
    def _failed(self, items: list[Inbound], group: Group, exc: Exception) -> None:
        streams = [item.stream for item in items]
        if not _message_at_fault(exc):
            log.error("storage write failed, dropping the affected sessions: %s", exc)
            reason = f"profiling server storage failed: {type(exc).__name__}"
            self.lifecycle.forget(group, reason, streams)
            return
        try:
            self.lifecycle.reset(group, self.clock())
        except Exception:
            log.exception("ingest worker: cannot rebuild sessions, dropping them")
            self.lifecycle.forget(group, "profiling server error", streams)
            return
        if not items:  # housekeeping's: its sessions are as stored; its next tick redoes it
            log.error("housekeeping's transaction failed: %r", exc)
            return
        if len(items) == 1:
            if self._database_works():
                self._reject(items[0], exc)
            else:
                log.error("storage failed, dropping the affected sessions: %s", exc)
                reason = f"profiling server storage failed: {type(exc).__name__}"
                self.lifecycle.forget(group, reason, streams)
            return
        log.warning("a group of %d messages cannot be stored (%r): splitting it", len(items), exc)
        half = len(items) // 2
        self._process_now(items[:half])
        self._process_now(items[half:])

    def _database_works(self) -> bool:
        """Whether a transaction of the usual kind commits: if it does not either, the fault
        is the database's (a table or a privilege missing), not the message's."""
        probe = WriteSet(heartbeats=self.lifecycle.connected())
        try:
            with self.write_lock:
                self.writer.write(probe)
        except Exception as exc:
            log.error("the database refuses a heartbeat too: %r", exc)
            return False
        return True

    def _reject(self, item: Inbound, exc: Exception) -> None:
        """The one message the store refuses: a batch is acked as rejected (the host drops
        it), a Hello ends its stream; nothing else waits for it."""
        self.health.rejected.labels(P.UNSTORABLE_BATCH).inc()
        log.warning("rejected a message the store cannot hold: %r", exc)
        self.lifecycle.rejected(item)
        if item.batch is not None:
            ack = ingest_pb2.Ack(rejected=[item.batch.seq])
            item.stream.send(ingest_pb2.ServerMessage(ack=ack))
        elif item.hello is not None:
            item.stream.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the server cannot store this Hello"
            )
        else:
            item.stream.send(None)
