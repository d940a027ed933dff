"""Engine creation: SQLite tuned for one writer plus readers, PostgreSQL through psycopg 3."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url


def open_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            # WAL: readers never block the writer. NORMAL: a commit survives a crash of
            # the server process (what an ack promises); FULL would add an fsync per commit.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("psycopg2", ""):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return create_engine(parsed, pool_size=8, max_overflow=4, pool_pre_ping=True)


def redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
