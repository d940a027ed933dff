"""What a server reads to take over a session another stream (or server) left behind."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Engine, and_, select, update

from profiler_core.wire import ingest_pb2
from profiler_server.storage import schema


@dataclass
class SessionRecord:
    functions: list[tuple[int, int, str]]  # fid, function id, name
    seqs: list[int]  # every batch stored (within the dedup window)
    payloads: list[tuple[int, bytes]]  # batches still holding unfinished requests


def load_session(engine: Engine, session_id: str) -> SessionRecord | None:
    s, sf, f, sp = schema.sessions, schema.session_functions, schema.functions, schema.spool
    with engine.connect() as conn:
        if conn.execute(select(s.c.id).where(s.c.id == session_id)).first() is None:
            return None
        functions = conn.execute(
            select(sf.c.fid, sf.c.function_id, f.c.name)
            .join(f, f.c.id == sf.c.function_id)
            .where(sf.c.session_id == session_id)
        ).all()
        seqs = (
            conn.execute(select(sp.c.seq).where(sp.c.session_id == session_id).order_by(sp.c.seq))
            .scalars()
            .all()
        )
        payloads = conn.execute(
            select(sp.c.seq, sp.c.payload)
            .where(sp.c.session_id == session_id, sp.c.payload.is_not(None))
            .order_by(sp.c.seq)
        ).all()
    return SessionRecord([tuple(r) for r in functions], list(seqs), [tuple(r) for r in payloads])


def stored_request_ids(engine: Engine, ids: list[str]) -> set[str]:
    return _stored(engine, schema.requests.c.id, ids)


def stored_session_ids(engine: Engine, ids: list[str]) -> set[str]:
    """Which of `ids` the store has sessions of: a group's Hellos are looked up together,
    so a fleet reconnecting at once costs a query a group, not one per host."""
    return _stored(engine, schema.sessions.c.id, ids)


def _stored(engine: Engine, key: ColumnElement[str], ids: list[str]) -> set[str]:
    found: set[str] = set()
    with engine.connect() as conn:
        for i in range(0, len(ids), 500):
            found.update(conn.execute(select(key).where(key.in_(ids[i : i + 500]))).scalars())
    return found


def orphaned_sessions(engine: Engine, stale_before: float, limit: int = 20) -> list[str]:
    """Sessions with unfinished requests whose owner stopped refreshing its heartbeat."""
    s, sp = schema.sessions, schema.spool
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(s.c.id)
                .where(
                    s.c.heartbeat < stale_before,
                    select(sp.c.seq)
                    .where(sp.c.session_id == s.c.id, sp.c.payload.is_not(None))
                    .exists(),
                )
                .limit(limit)
            ).scalars()
        )


def claim(engine: Engine, session_id: str, owner: str, stale_before: float) -> bool:
    """Atomically takes a stale session; False if another server got it first."""
    with engine.begin() as conn:
        result = conn.execute(
            update(schema.sessions)
            .where(
                and_(schema.sessions.c.id == session_id, schema.sessions.c.heartbeat < stale_before)
            )
            .values(owner=owner, heartbeat=time.time())
        )
        return result.rowcount == 1


def still_owner(engine: Engine, session_id: str, owner: str) -> bool:
    with engine.connect() as conn:
        found = conn.execute(
            select(schema.sessions.c.owner).where(schema.sessions.c.id == session_id)
        ).scalar()
    return found is None or found == owner


def load_hello(engine: Engine, session_id: str) -> ingest_pb2.Hello:
    """The session's Hello as stored, for finishing it without its host."""
    with engine.connect() as conn:
        row = (
            conn.execute(select(schema.sessions).where(schema.sessions.c.id == session_id))
            .mappings()
            .one()
        )
    return ingest_pb2.Hello(
        session_id=uuid.UUID(session_id).bytes,
        service=row["service"],
        hostname=row["hostname"],
        pid=row["pid"],
        python_version=row["python_version"],
        profiler_version=row["profiler_version"],
        wall_ns=row["wall_ns"],
        monotonic_ns=row["monotonic_ns"],
    )
