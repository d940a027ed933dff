"""The ingest worker: decoded host messages -> sessions -> assembled trees -> one storage
transaction per group -> acks. A single thread owns all session state, so nothing in it
needs a lock; streams talk to it through a bounded queue (which is the backpressure).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from sqlalchemy import Engine

from profiler_core import __version__
from profiler_core.wire import ingest_pb2
from profiler_server.assembly import problems as P
from profiler_server.assembly.events import MalformedEvents
from profiler_server.assembly.flatten import summarize
from profiler_server.assembly.group import assemble_all
from profiler_server.assembly.pending import PendingRequest
from profiler_server.assembly.session import SeqTracker, Session
from profiler_server.metrics.health import ServerHealth
from profiler_server.metrics.profiles import ProfileMetrics
from profiler_server.settings import Settings
from profiler_server.storage import recovery, retention
from profiler_server.storage.writer import StoredRequests, Writer, WriteSet

log = logging.getLogger(__name__)

GROUP_MAX = 256  # messages per storage transaction
GROUP_MAX_EVENTS = 100_000  # events per storage transaction: bounds its time, so the ack lag
HEARTBEAT_EVERY = 10.0
REAP_EVERY = 30.0
RETENTION_EVERY = 60.0
DEDUP_WINDOW = 3600.0


class Stream(Protocol):
    """The worker's view of one gRPC stream; both methods are thread-safe."""

    def send(self, message: ingest_pb2.ServerMessage | None) -> None: ...
    def abort(self, code: grpc.StatusCode, details: str) -> None: ...


@dataclass
class Inbound:
    stream: Stream
    hello: ingest_pb2.Hello | None = None
    batch: ingest_pb2.Batch | None = None
    raw: bytes = b""
    closed: bool = False
    received: float = field(default_factory=time.monotonic)


def _events(item: Inbound) -> int:
    return len(item.batch.events.kind) if item.batch is not None else 0


@dataclass
class _Group:
    ws: WriteSet = field(default_factory=WriteSet)
    acks: dict[int, tuple[Stream, ingest_pb2.Ack]] = field(default_factory=dict)
    received: list[float] = field(default_factory=list)
    batches: list[tuple[Session, int, bytes]] = field(default_factory=list)
    sessions: dict[str, Session] = field(default_factory=dict)
    drops: list[tuple[str, dict[str, int], dict[str, int]]] = field(default_factory=list)
    closes: list[Stream] = field(default_factory=list)

    def ack(self, stream: Stream) -> ingest_pb2.Ack:
        entry = self.acks.get(id(stream))
        if entry is None:
            entry = self.acks[id(stream)] = (stream, ingest_pb2.Ack())
        return entry[1]


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
        self.queue: queue.Queue[Inbound | None] = queue.Queue(maxsize=1024)
        self.sessions: dict[str, Session] = {}
        self.streams: dict[int, Session] = {}  # id(stream) -> session
        self.names: dict[int, str] = {}
        self._thread: threading.Thread | None = None
        self._next = {"heartbeat": 0.0, "reap": 0.0, "retention": 0.0}
        # Short timeouts (tests, small deployments) shorten the periodic work with them.
        self._every = {
            "heartbeat": min(HEARTBEAT_EVERY, settings.stream_timeout / 3),
            "reap": min(REAP_EVERY, settings.stream_timeout),
            "retention": min(RETENTION_EVERY, settings.retention / 10),
        }

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="profiler-ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Processes everything queued (storing and acking it), then stops."""
        if self._thread is None:
            return
        self.queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def submit(self, item: Inbound) -> bool:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            return False
        self.health.backlog.set(self.queue.qsize())
        return True

    def _run(self) -> None:
        while True:
            try:
                first = self.queue.get(timeout=0.5)
            except queue.Empty:
                first = False
            items: list[Inbound] = []
            stop = first is None
            if first:
                items.append(first)
                events = _events(first)
                while len(items) < GROUP_MAX and events < GROUP_MAX_EVENTS:
                    try:
                        nxt = self.queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    items.append(nxt)
                    events += _events(nxt)
            self.health.backlog.set(self.queue.qsize())
            self._process(items)
            if stop:
                return

    # --- one group ---------------------------------------------------------------------------
    def _process(self, items: list[Inbound]) -> None:
        group = _Group()
        try:
            self._process_group(items, group)
        except Exception:  # the worker must survive anything; its state may not
            log.exception("ingest worker: unexpected error, dropping the affected sessions")
            self._forget(group, "profiling server error", [item.stream for item in items])

    def _process_group(self, items: list[Inbound], group: _Group) -> None:
        now = self.clock()
        problems: Counter = Counter()
        for item in items:
            if item.hello is not None:
                self._hello(item, group, now, problems)
            elif item.batch is not None:
                self._batch(item, group, now, problems)
            elif item.closed:
                self._closed(item, group, now)
        self._tick(group, now, problems)
        for session in group.sessions.values():
            complete = session.complete()
            if complete:
                self._finish(session, complete, group, problems)
        for session, seq, raw in group.batches:
            payload = raw if session.holds_open(seq) else None
            if payload is not None:
                session.spooled.add(seq)
            group.ws.spool.append(
                {
                    "session_id": session.id,
                    "seq": seq,
                    "received_at": time.time(),
                    "payload": payload,
                }
            )
        self._commit(group, problems)

    def _commit(self, group: _Group, problems: Counter) -> None:
        stored = StoredRequests.empty()
        if group.ws:
            started = time.perf_counter()
            try:
                stored = self.writer.write(group.ws)
            except Exception as exc:
                log.error("storage write failed, dropping affected sessions: %s", exc)
                reason = f"profiling server storage failed: {type(exc).__name__}"
                self._forget(group, reason, [])
                return
            finally:
                self.health.write_seconds.observe(time.perf_counter() - started)
        self.profiles.record(stored, self.names)
        for listener in self.listeners:
            listener(stored)
        for row in stored.rows:
            self.health.count_stored(row["service"], row["truncated"])
        for service, req_drops, event_drops in group.drops:
            self.health.count_host_drops(service, req_drops, event_drops)
        self.health.count_problems(problems)
        self.health.open_requests.set(sum(len(s.pending) for s in self.sessions.values()))
        for stream, ack in group.acks.values():
            stream.send(ingest_pb2.ServerMessage(ack=ack))
        done = self.clock()
        for received in group.received:
            self.health.ack_lag.observe(done - received)
        for stream in group.closes:
            stream.send(None)

    def _forget(self, group: _Group, reason: str, streams: list[Stream]) -> None:
        """After a failure, in-memory state may claim what the database lacks: drop it.
        The hosts reconnect and resend every unacked batch; state is rebuilt from the database."""
        affected = {id(s): s for s in streams}
        affected.update((id(s), s) for s, _ in group.acks.values())
        for sid in list(group.sessions):
            session = self.sessions.pop(sid, None)
            if session is not None and session.stream is not None:
                affected[id(session.stream)] = session.stream
        for stream in affected.values():
            self.streams.pop(id(stream), None)
            stream.abort(grpc.StatusCode.UNAVAILABLE, reason)

    # --- messages ----------------------------------------------------------------------------
    def _hello(self, item: Inbound, group: _Group, now: float, problems: Counter) -> None:
        hello = item.hello
        assert hello is not None  # validated by the stream (ingest/service.py)
        sid = str(uuid.UUID(bytes=hello.session_id))
        session = self.sessions.get(sid)
        if session is None:
            session = Session(hello, self.settings.max_request_events)
            record = recovery.load_session(self.engine, sid)
            if record is not None:
                self._restore(session, record, group, now)
            self.sessions[sid] = session
        session.connected = True
        session.stream = item.stream
        self.streams[id(item.stream)] = session
        group.sessions[sid] = session
        wall = time.time()
        group.ws.sessions.append(
            {
                "id": sid,
                "service": hello.service,
                "hostname": hello.hostname,
                "pid": hello.pid,
                "python_version": hello.python_version,
                "profiler_version": hello.profiler_version or __version__,
                "wall_ns": hello.wall_ns,
                "monotonic_ns": hello.monotonic_ns,
                "owner": self.owner,
                "heartbeat": wall,
                "first_seen": wall,
            }
        )

    def _restore(
        self, session: Session, record: recovery.SessionRecord, group: _Group, now: float
    ) -> None:
        """Rebuilds a session another stream or server left: functions, seen seqs, open requests."""
        for fid, gid, name in record.functions:
            session.functions[fid] = (gid, name)
            self.names[gid] = name
        session.seqs = SeqTracker(max(record.seqs, default=0))
        replay_problems: Counter = Counter()  # counted when first received
        for seq, raw in record.payloads:
            try:
                batch = ingest_pb2.HostMessage.FromString(raw).batch
                session.apply(batch, now, replay_problems)
            except Exception:
                log.exception("session %s: cannot replay spooled batch %d", session.id, seq)
                continue
            session.spooled.add(seq)
        keys = {f"{session.id}-{rid}": p for rid, p in session.pending.items()}
        for key in recovery.stored_request_ids(self.engine, list(keys)):
            released = session.finish(keys[key])
            group.ws.release.extend((session.id, seq) for seq in released)

    def _batch(self, item: Inbound, group: _Group, now: float, problems: Counter) -> None:
        batch = item.batch
        assert batch is not None
        session = self.streams.get(id(item.stream))
        if session is None:
            problems[P.NO_HELLO] += 1
            item.stream.abort(grpc.StatusCode.FAILED_PRECONDITION, "send Hello before batches")
            return
        self.health.batches.inc()
        seq = batch.seq
        ack = group.ack(item.stream)
        group.received.append(item.received)
        if session.seqs.seen(seq):
            problems[P.DUPLICATE_BATCH] += 1
            ack.stored.append(seq)
            return
        try:
            applied = session.apply(batch, now, problems)
        except (MalformedEvents, ValueError) as exc:
            log.debug("session %s batch %d rejected: %s", session.id, seq, exc)
            problems[P.MALFORMED_BATCH] += 1
            ack.rejected.append(seq)
            session.seqs.add(seq)  # never coming back: later batches must not wait for it
            return
        if session.seqs.add(seq):
            problems[P.OUT_OF_ORDER_BATCH] += 1
        if session.seqs.has_gap:
            session.gap_since = session.gap_since or now
        else:
            session.gap_since = 0.0
        self.health.events.inc(applied.events)
        for f in applied.functions:
            self.names[f.function_id] = f.name
            group.ws.functions.append(
                {
                    "id": f.function_id,
                    "name": f.name,
                    "file": f.file,
                    "line": f.line,
                    "kind": f.kind,
                }
            )
            group.ws.session_functions.append(
                {"session_id": session.id, "fid": f.fid, "function_id": f.function_id}
            )
        if applied.drops_requests or applied.drops_events:
            group.drops.append((session.service, applied.drops_requests, applied.drops_events))
        group.sessions[session.id] = session
        group.batches.append((session, seq, item.raw))
        ack.stored.append(seq)

    def _closed(self, item: Inbound, group: _Group, now: float) -> None:
        session = self.streams.pop(id(item.stream), None)
        if session is not None and session.stream is item.stream:
            session.connected = False
            session.stream = None
            session.disconnected_at = now
        group.closes.append(item.stream)

    # --- finishing requests ----------------------------------------------------------------------
    def _finish(
        self, session: Session, pendings: list[PendingRequest], group: _Group, problems: Counter
    ) -> None:
        forest = assemble_all(session.id, pendings, problems)
        summary = summarize(forest, session.interner, problems)
        hello = session.hello
        rows = [
            {
                "id": request.key,
                "session_id": session.id,
                "service": session.service,
                "route": request.route or "(none)",
                "method": request.method,
                "status": request.status,
                "start_ns": hello.wall_ns + (request.start - hello.monotonic_ns),
                "duration_ns": request.end - request.start,
                "truncated": request.truncated,
                "calls": calls,
                "events": request.events,
            }
            for request, calls in zip(forest.requests, forest.calls(), strict=True)
        ]
        group.ws.requests.append(StoredRequests.of(rows, summary))
        for pending in pendings:
            released = session.finish(pending)
            group.ws.release.extend((session.id, seq) for seq in released)

    def _finish_all(
        self,
        session: Session,
        group: _Group,
        problems: Counter,
        reason: str,
        pendings: list[PendingRequest] | None = None,
    ) -> None:
        pendings = list(session.pending.values()) if pendings is None else pendings
        for pending in pendings:
            problems[reason] += 1
            pending.host_truncated = True
        if pendings:
            self._finish(session, pendings, group, problems)

    # --- periodic work -------------------------------------------------------------------------
    def _tick(self, group: _Group, now: float, problems: Counter) -> None:
        s = self.settings
        for sid, session in list(self.sessions.items()):
            if (
                session.seqs.has_gap
                and session.gap_since
                and now - session.gap_since > s.gap_timeout
            ):
                problems[P.GAP] += 1
                session.seqs.skip_gap()
                session.gap_since = now if session.seqs.has_gap else 0.0
                group.sessions[sid] = session
            if not session.connected and now - session.disconnected_at > s.stream_timeout:
                del self.sessions[sid]
                if recovery.still_owner(self.engine, sid, self.owner):
                    self._finish_all(session, group, problems, P.STREAM_DIED)
                continue
            stale = session.stale(now - s.request_timeout)
            if stale:
                self._finish_all(session, group, problems, P.REQUEST_TIMEOUT, stale)
        self._limit_memory(group, problems)
        if now >= self._next["heartbeat"]:
            self._next["heartbeat"] = now + self._every["heartbeat"]
            group.ws.heartbeats.extend(sid for sid, x in self.sessions.items() if x.connected)
        if now >= self._next["reap"]:
            self._next["reap"] = now + self._every["reap"]
            self._reap(group, now, problems)
        if now >= self._next["retention"]:
            self._next["retention"] = now + self._every["retention"]
            self.expire()

    def _limit_memory(self, group: _Group, problems: Counter) -> None:
        held = sum(p.events for x in self.sessions.values() for p in x.pending.values())
        if held <= self.settings.max_open_events:
            return
        oldest = sorted(
            ((p.touched, x, p) for x in self.sessions.values() for p in x.pending.values()),
            key=lambda e: e[0],
        )
        for _, session, pending in oldest:
            if held <= self.settings.max_open_events * 0.9:
                break
            held -= pending.events
            self._finish_all(session, group, problems, P.MEMORY_LIMIT, [pending])

    def _reap(self, group: _Group, now: float, problems: Counter) -> None:
        """Finishes sessions whose server died (their requests are only in the spool)."""
        stale_before = time.time() - self.settings.stream_timeout - 2 * self._every["heartbeat"]
        try:
            orphans = recovery.orphaned_sessions(self.engine, stale_before)
            for sid in orphans:
                if sid in self.sessions or not recovery.claim(
                    self.engine, sid, self.owner, stale_before
                ):
                    continue
                record = recovery.load_session(self.engine, sid)
                if record is None:
                    continue
                hello = recovery.load_hello(self.engine, sid)
                session = Session(hello, self.settings.max_request_events)
                self._restore(session, record, group, now)
                self._finish_all(session, group, problems, P.STREAM_DIED)
        except Exception:
            log.exception("reaping orphaned sessions failed")

    def expire(self) -> None:
        """Deletes what is older than --retention (runs every minute in the worker)."""
        cutoff_ns = time.time_ns() - int(self.settings.retention * 1e9)
        try:
            for _ in range(50):
                if (
                    retention.delete_expired(self.engine, cutoff_ns, time.time() - DEDUP_WINDOW)
                    == 0
                ):
                    break
        except Exception:
            log.exception("retention delete failed")
