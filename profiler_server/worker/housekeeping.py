"""Work done on a schedule, not per message: gap, stream and request timeouts, the memory
limit, heartbeats and reaping run in the worker at most every TICK_EVERY seconds (each in a
transaction of its own, between groups); retention deletes run on a thread of their own.
So neither a scan of every session nor a DELETE lies between a group's commit and its acks."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from sqlalchemy import Engine

from profiler_server.assembly import problems as P
from profiler_server.assembly.session import Session
from profiler_server.settings import Settings
from profiler_server.storage import recovery, retention
from profiler_server.worker.group import Group
from profiler_server.worker.lifecycle import Sessions

log = logging.getLogger(__name__)

TICK_EVERY = 0.5
HEARTBEAT_EVERY = 10.0
REAP_EVERY = 30.0
RETENTION_EVERY = 60.0
RETENTION_CHUNKS = 50  # per run: the rest waits for the next one
DEDUP_WINDOW = 3600.0


class Housekeeping:
    """The session-state part: runs in the worker thread (it owns the sessions)."""

    def __init__(self, settings: Settings, sessions: Sessions) -> None:
        self.settings = settings
        self.sessions = sessions
        # Short timeouts (tests, small deployments) shorten the periodic work with them.
        self.every = {
            "tick": TICK_EVERY,
            "heartbeat": min(HEARTBEAT_EVERY, settings.stream_timeout / 3),
            "reap": min(REAP_EVERY, settings.stream_timeout),
        }
        self.next = dict.fromkeys(self.every, 0.0)

    def wait(self, now: float) -> float:
        """Seconds until the next tick is due."""
        return max(0.0, self.next["tick"] - now)

    def due(self, now: float) -> bool:
        return now >= self.next["tick"]

    def reads_storage(self, now: float) -> bool:
        """Whether the tick at `now` reads what the database has: it reaps, or a session's
        stream has timed out (is it still this server's?). Those ticks must see every
        group handed to the storer committed; the others need not wait for it."""
        if now >= self.next["reap"]:
            return True
        return any(self._stream_timed_out(session, now) for session in self.sessions.live.values())

    def _stream_timed_out(self, session: Session, now: float) -> bool:
        """The session's stream ended longer than --stream-timeout ago."""
        timeout = self.settings.stream_timeout
        return not session.connected and now - session.disconnected_at > timeout

    def tick(self, group: Group, now: float, problems: Counter) -> None:
        self.next["tick"] = now + self.every["tick"]
        s, live = self.settings, self.sessions.live
        for sid, session in list(live.items()):
            if (
                session.seqs.has_gap
                and session.gap_since
                and now - session.gap_since > s.gap_timeout
            ):
                problems[P.GAP] += 1
                session.seqs.skip_gap()
                session.gap_since = now if session.seqs.has_gap else 0.0
                group.sessions[sid] = session
            if self._stream_timed_out(session, now):
                del live[sid]
                if recovery.still_owner(self.sessions.engine, sid, self.sessions.owner):
                    self.sessions.finish_all(session, group, problems, P.STREAM_DIED)
                continue
            stale = session.stale(now - s.request_timeout)
            if stale:
                self.sessions.finish_all(session, group, problems, P.REQUEST_TIMEOUT, stale)
        self._limit_memory(group, problems)
        if now >= self.next["heartbeat"]:
            self.next["heartbeat"] = now + self.every["heartbeat"]
            group.ws.heartbeats.extend(self.sessions.connected())
        if now >= self.next["reap"]:
            self.next["reap"] = now + self.every["reap"]
            stale_before = time.time() - s.stream_timeout - 2 * self.every["heartbeat"]
            self.sessions.reap(group, now, problems, stale_before)

    def _limit_memory(self, group: Group, problems: Counter) -> None:
        live = self.sessions.live.values()
        held = sum(p.weight for x in live for p in x.pending.values())
        if held <= self.settings.max_open_events:
            return
        oldest = sorted(
            ((p.touched, x, p) for x in live for p in x.pending.values()), key=lambda e: e[0]
        )
        for _, session, pending in oldest:
            if held <= self.settings.max_open_events * 0.9:
                break
            held -= pending.weight
            self.sessions.finish_all(session, group, problems, P.MEMORY_LIMIT, [pending])


class Retention:
    """Deletes what is older than --retention on a thread of its own, one chunk per
    transaction, each under the write lock: the worker's commits wait at most one chunk."""

    def __init__(self, engine: Engine, settings: Settings, write_lock: threading.Lock) -> None:
        self.engine = engine
        self.settings = settings
        self.write_lock = write_lock
        self.every = min(RETENTION_EVERY, settings.retention / 10)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="profiler-retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30.0)
            self._thread = None

    def _run(self) -> None:
        while True:
            self.expire()
            if self._stop.wait(self.every):
                return

    def expire(self) -> None:
        cutoff_ns = time.time_ns() - int(self.settings.retention * 1e9)
        try:
            for _ in range(RETENTION_CHUNKS):
                if self._stop.is_set():
                    return
                with self.write_lock:
                    deleted = retention.delete_expired(
                        self.engine, cutoff_ns, time.time() - DEDUP_WINDOW
                    )
                if deleted == 0:
                    return
        except Exception:
            log.exception("retention delete failed")
