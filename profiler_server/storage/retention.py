"""Deletes what is older than --retention, in small chunks so ingest is never blocked long."""

from __future__ import annotations

from sqlalchemy import Engine, delete, select

from profiler_server.storage import route_rollup, schema

CHUNK = 2000


def delete_expired(engine: Engine, cutoff_ns: int, dedup_cutoff: float) -> int:
    """One chunk of each table; returns rows deleted (call again while it is > 0)."""
    deleted = 0
    minute = cutoff_ns // 60_000_000_000
    with engine.begin() as conn:
        ids = (
            conn.execute(
                select(schema.requests.c.id)
                .where(schema.requests.c.start_ns < cutoff_ns)
                .limit(CHUNK)
            )
            .scalars()
            .all()
        )
        if ids:
            for table, column in (
                (schema.request_trees, schema.request_trees.c.request_id),
                (schema.request_functions, schema.request_functions.c.request_id),
                (schema.requests, schema.requests.c.id),
            ):
                deleted += conn.execute(delete(table).where(column.in_(ids))).rowcount
        day = route_rollup.expired_before(minute)
        for table, before in (
            (schema.stack_buckets, minute),
            (schema.function_buckets, minute),
            (schema.route_minutes, day),
            (schema.route_rollups, day),
        ):
            keys = select(table.c.minute).where(table.c.minute < before).limit(1)
            if conn.execute(keys).first() is not None:
                deleted += conn.execute(delete(table).where(table.c.minute < before)).rowcount
        # Batch records only serve dedup of resends; payloads are kept while needed.
        spool = schema.spool
        deleted += conn.execute(
            delete(spool).where(spool.c.received_at < dedup_cutoff, spool.c.payload.is_(None))
        ).rowcount
        stale = schema.sessions.c.heartbeat < cutoff_ns / 1e9
        old = conn.execute(select(schema.sessions.c.id).where(stale).limit(CHUNK)).scalars().all()
        if old:
            deleted += conn.execute(
                delete(schema.session_functions).where(
                    schema.session_functions.c.session_id.in_(old)
                )
            ).rowcount
            deleted += conn.execute(delete(spool).where(spool.c.session_id.in_(old))).rowcount
            deleted += conn.execute(
                delete(schema.sessions).where(schema.sessions.c.id.in_(old))
            ).rowcount
    return deleted
