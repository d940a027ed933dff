"""Schema versions, applied in order on start. Several servers may start at once on one
PostgreSQL: an advisory lock makes one of them migrate while the others wait."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Connection, Engine, func, inspect, select, text

from profiler_server.storage import schema

log = logging.getLogger(__name__)

LOCK_KEY = 0x70726F66  # arbitrary, constant: "prof"


def _v1(conn: Connection) -> None:
    schema.metadata.create_all(conn)


def _v2(conn: Connection) -> None:
    """SQLite: covering indexes on the minute buckets (schema.bucket_indexes). PostgreSQL
    gets none: its planner, given statistics, never picks them (it hashes the rows of a
    parallel scan, or of the primary key's minute range), so they would only slow ingest."""
    if conn.dialect.name != "sqlite":
        return
    for table, (name, columns) in schema.bucket_indexes.items():
        conn.execute(text(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({', '.join(columns)})"))


# Append a function for each schema change; never edit a released one.
MIGRATIONS: list[Callable[[Connection], None]] = [_v1, _v2]
LATEST = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    pass


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table(schema.schema_version.name):
        return 0
    return conn.execute(select(func.max(schema.schema_version.c.version))).scalar() or 0


def upgrade(engine: Engine) -> int:
    """Brings the database to LATEST; returns the version found before."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
        found = current_version(conn)
        if found > LATEST:
            raise SchemaTooNew(
                f"database schema version {found} is newer than this server's {LATEST}; "
                "upgrade request-profiler"
            )
        for version in range(found + 1, LATEST + 1):
            log.info("migrating database schema to version %d", version)
            MIGRATIONS[version - 1](conn)
        if found < LATEST:
            conn.execute(schema.schema_version.delete())
            conn.execute(schema.schema_version.insert().values(version=LATEST))
    return found
