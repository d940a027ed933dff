"""The shop's SQLite file: where it lives, its schema, transactions, and safe first creation."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

SCHEMA_VERSION = 1
ENV_VAR = "PROFILING_TARGET_DB"

SCHEMA = """
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    sku TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price_cents INTEGER NOT NULL,
    stock INTEGER NOT NULL CHECK (stock >= 0),
    rating REAL NOT NULL
);
CREATE INDEX products_by_category ON products (category, id);
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL UNIQUE,
    region TEXT NOT NULL,
    tier TEXT NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    created_at TEXT NOT NULL,
    status TEXT NOT NULL,
    shipping_cents INTEGER NOT NULL
);
CREATE TABLE order_lines (
    order_id INTEGER NOT NULL REFERENCES orders (id),
    product_id INTEGER NOT NULL REFERENCES products (id),
    quantity INTEGER NOT NULL,
    unit_price_cents INTEGER NOT NULL,
    discount_cents INTEGER NOT NULL,
    tax_cents INTEGER NOT NULL,
    PRIMARY KEY (order_id, product_id)
);
CREATE INDEX order_lines_by_product ON order_lines (product_id, order_id);
"""

Populate = Callable[[sqlite3.Connection], None]


def default_path() -> Path:
    """`$PROFILING_TARGET_DB`, else a file in the system temp dir named after the schema version."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"profiling_target_shop_v{SCHEMA_VERSION}.sqlite3"


class Database:
    """One SQLite file, built complete on first use.

    The file is built under a scratch name and hard-linked into place, so gunicorn workers
    starting together never see it half made: the first to finish wins, the others drop theirs.
    """

    def __init__(self, path: Path, populate: Populate) -> None:
        self.path = path
        self._populate = populate
        self._ready = False
        self._lock = threading.Lock()

    def ensure(self) -> None:
        if self._ready:
            return
        with self._lock:
            if not self.path.exists():
                self._build()
            self._ready = True

    def _build(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(prefix=f"{self.path.name}.", dir=self.path.parent)
        os.close(fd)
        try:
            conn = self._connect(scratch)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(SCHEMA)
                conn.execute("BEGIN")
                self._populate(conn)
                conn.commit()
            finally:
                conn.close()
            with contextlib.suppress(FileExistsError):
                os.link(scratch, self.path)
        finally:
            os.unlink(scratch)

    @staticmethod
    def _connect(path: str | Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=10, isolation_level=None)
        conn.row_factory = sqlite3.Row
        return conn

    @contextlib.contextmanager
    def transaction(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A fresh connection inside one transaction, so a unit of work sees one snapshot.

        Writers take the write lock up front (BEGIN IMMEDIATE): two checkouts that both read
        first and then write would otherwise fail with SQLITE_BUSY instead of waiting.
        """
        self.ensure()
        conn = self._connect(self.path)
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        finally:
            conn.close()
