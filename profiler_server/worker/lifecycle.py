"""The session lifecycle: open (a Hello), apply batches, restore from the database, close
(the stream ends), finish requests, reap sessions a dead server left. Only the ingest
worker's thread calls it, so its state needs no lock."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter

import grpc
from sqlalchemy import Engine

from profiler_core import __version__
from profiler_core.wire import ingest_pb2
from profiler_server.assembly import problems as P
from profiler_server.assembly.events import MalformedEvents
from profiler_server.assembly.flatten import summarize
from profiler_server.assembly.group import assemble_all
from profiler_server.assembly.pending import PendingRequest
from profiler_server.assembly.session import Limits, SeqTracker, Session
from profiler_server.storage import recovery
from profiler_server.storage.writer import StoredRequests
from profiler_server.worker.group import Group, Inbound, Stream

log = logging.getLogger(__name__)


class Sessions:
    def __init__(self, engine: Engine, owner: str, limits: Limits, write_lock: threading.Lock):
        """`write_lock` serialises the writes done here (claiming a session) with the
        worker's commits and retention's deletes: SQLite has a single writer."""
        self.engine = engine
        self.owner = owner
        self.limits = limits
        self.write_lock = write_lock
        self.live: dict[str, Session] = {}
        self.streams: dict[int, Session] = {}  # id(stream) -> session
        self.release_later: list[tuple[str, int]] = []  # spool releases found by reset()

    def connected(self) -> list[str]:
        return [sid for sid, x in self.live.items() if x.connected]

    def open_requests(self) -> int:
        return sum(len(s.pending) for s in self.live.values())

    # --- messages ------------------------------------------------------------------------
    def stored(self, items: list[Inbound]) -> set[str]:
        """The sessions of the Hellos among `items` that are not live here but stored (left
        by another stream or server): one lookup for them all."""
        hellos = [item.hello for item in items if item.hello is not None]
        ids = {str(uuid.UUID(bytes=hello.session_id)) for hello in hellos}
        ids.difference_update(self.live)
        return recovery.stored_session_ids(self.engine, sorted(ids)) if ids else set()

    def hello(self, item: Inbound, group: Group, now: float, stored: set[str]) -> None:
        """Opens (or takes over) the Hello's session; `stored`: what `stored()` found."""
        hello = item.hello
        assert hello is not None  # validated by the stream (ingest/service.py)
        sid = str(uuid.UUID(bytes=hello.session_id))
        session = self.live.get(sid)
        if session is None:
            session = Session(hello, self.limits)
            record = recovery.load_session(self.engine, sid) if sid in stored else None
            if record is not None:
                self.restore(session, record, group, now)
            self.live[sid] = session
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

    def batch(self, item: Inbound, group: Group, now: float, problems: Counter) -> None:
        batch = item.batch
        assert batch is not None
        session = self.streams.get(id(item.stream))
        if session is None:
            problems[P.NO_HELLO] += 1
            item.stream.abort(grpc.StatusCode.FAILED_PRECONDITION, "send Hello before batches")
            return
        group.batches_received += 1
        seq = batch.seq
        ack = group.ack(item.stream)
        group.received.append(item.received)
        group.sessions[session.id] = session  # before apply(), which changes it
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
        group.events_received += applied.events
        if applied.evicted:
            self.finish_all(session, group, problems, P.OPEN_REQUEST_LIMIT, applied.evicted)
        for f in applied.functions:
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
        if batch.HasField("route_counts"):
            group.route_minutes.add(session.service, batch.route_counts, problems)
        if applied.drops_requests or applied.drops_events:
            group.drops.append((session.service, applied.drops_requests, applied.drops_events))
        group.batches.append((session, seq, item.raw))
        ack.stored.append(seq)

    def closed(self, item: Inbound, group: Group, now: float) -> None:
        session = self.streams.pop(id(item.stream), None)
        if session is not None and session.stream is item.stream:
            session.connected = False
            session.stream = None
            session.disconnected_at = now
        group.closes.append(item.stream)

    # --- restoring ---------------------------------------------------------------------------
    def restore(
        self, session: Session, record: recovery.SessionRecord, group: Group, now: float
    ) -> None:
        """Rebuilds a session another stream or server left: functions, seen seqs, open requests."""
        for fid, gid, name in record.functions:
            session.functions[fid] = (gid, name)
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

    def reset(self, group: Group, now: float) -> None:
        """Puts the group's sessions back as the database has them (the transaction rolled
        back, but assembling changed them in memory), as when their hosts reconnect."""
        for sid, old in group.sessions.items():
            if self.live.get(sid) is not old:
                continue  # finished or reaped in this group: the reaper finds it again
            fresh = Session(old.hello, self.limits)
            record = recovery.load_session(self.engine, sid)
            if record is not None:
                scratch = Group()
                self.restore(fresh, record, scratch, now)
                self.release_later.extend(scratch.ws.release)
            fresh.connected, fresh.stream = old.connected, old.stream
            fresh.disconnected_at, fresh.gap_since = old.disconnected_at, old.gap_since
            self.live[sid] = fresh
            if fresh.stream is not None:
                self.streams[id(fresh.stream)] = fresh

    def forget(self, group: Group, reason: str, streams: list[Stream]) -> None:
        """After a failure, in-memory state may claim what the database lacks: drop it.
        The hosts reconnect and resend every unacked batch; state is rebuilt from the database."""
        affected = {id(s): s for s in streams}
        affected.update((id(s), s) for s, _ in group.acks.values())
        for sid in list(group.sessions):
            session = self.live.pop(sid, None)
            if session is not None and session.stream is not None:
                affected[id(session.stream)] = session.stream
        for stream in affected.values():
            self.streams.pop(id(stream), None)
            stream.abort(grpc.StatusCode.UNAVAILABLE, reason)

    def rejected(self, item: Inbound) -> None:
        """Forgets what a message the store refused left behind (see Pipeline._reject)."""
        if item.batch is not None:
            session = self.streams.get(id(item.stream))
            if session is not None:
                session.seqs.add(item.batch.seq)
        elif item.hello is not None:
            self.live.pop(str(uuid.UUID(bytes=item.hello.session_id)), None)
            self.streams.pop(id(item.stream), None)
        else:
            self.streams.pop(id(item.stream), None)

    # --- finishing requests ----------------------------------------------------------------
    def finish(
        self,
        finishing: list[tuple[Session, list[PendingRequest]]],
        group: Group,
        problems: Counter,
    ) -> None:
        """Stores the requests of all `finishing` sessions as one forest: assembling and
        summarizing cost per group, not per session (a fleet sends one request a batch)."""
        sessions = {session.id: session for session, _ in finishing}
        group.sessions.update(sessions)
        pendings = [p for _, ps in finishing for p in ps]
        forest = assemble_all(pendings, problems)
        summary = summarize(
            forest, {sid: session.interner for sid, session in sessions.items()}, problems
        )
        rows = []
        for request, calls in zip(forest.requests, forest.calls(), strict=True):
            session = sessions[request.session_id]
            hello = session.hello
            rows.append(
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
            )
        group.ws.requests.append(StoredRequests.of(rows, summary))
        for session, session_pendings in finishing:
            for pending in session_pendings:
                released = session.finish(pending)
                group.ws.release.extend((session.id, seq) for seq in released)

    def finish_all(
        self,
        session: Session,
        group: Group,
        problems: Counter,
        reason: str,
        pendings: list[PendingRequest] | None = None,
    ) -> None:
        pendings = list(session.pending.values()) if pendings is None else pendings
        for pending in pendings:
            problems[reason] += 1
            pending.host_truncated = True
        if pendings:
            self.finish([(session, pendings)], group, problems)

    # --- sessions no stream holds ------------------------------------------------------------
    def reap(self, group: Group, now: float, problems: Counter, stale_before: float) -> None:
        """Finishes sessions whose server died (their requests are only in the spool)."""
        try:
            orphans = recovery.orphaned_sessions(self.engine, stale_before)
            for sid in orphans:
                if sid in self.live or sid in group.sessions:
                    continue  # held, or finished in this very transaction (not yet stored)
                with self.write_lock:
                    claimed = recovery.claim(self.engine, sid, self.owner, stale_before)
                if not claimed:
                    continue
                record = recovery.load_session(self.engine, sid)
                if record is None:
                    continue
                hello = recovery.load_hello(self.engine, sid)
                session = Session(hello, self.limits)
                self.restore(session, record, group, now)
                self.finish_all(session, group, problems, P.STREAM_DIED)
        except Exception:
            log.exception("reaping orphaned sessions failed")
