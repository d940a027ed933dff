"""The ingest write path: one transaction per group of batches, then the acks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from itertools import chain
from operator import itemgetter

import numpy as np
from sqlalchemy import Connection, Engine, Table, and_, bindparam, update
from sqlalchemy.dialects import postgresql, sqlite

from profiler_server.assembly.flatten import Summary
from profiler_server.assembly.totals import (
    ACTIVE,
    AWAIT,
    AWAITING,
    CALLS,
    MAX,
    MAX_SLICE,
    READY,
    READYING,
    SELF,
    TOTAL,
    Totals,
)
from profiler_server.storage import route_rollup, schema

KNOWN_IDS_LIMIT = 1_000_000


@dataclass
class StoredRequests:
    """Requests to store: a row and a tree each, and their totals by request index."""

    rows: list[dict]
    trees: list[bytes]  # serialized StoredTree
    stacks: Totals  # key: stack id
    functions: Totals  # key: function id
    nodes: dict[int, tuple[int, int]]  # stack id -> (parent stack id, function id)
    shown: Callable[[int], str | None]  # stack id -> name as shown (None: not one of these)
    function_names: dict[int, str] = field(default_factory=dict)  # function id -> name

    @classmethod
    def of(cls, rows: list[dict], summary: Summary) -> StoredRequests:
        return cls(
            rows,
            summary.trees,
            summary.stacks,
            summary.functions,
            summary.nodes,
            summary.shown,
            summary.function_names,
        )

    @classmethod
    def empty(cls) -> StoredRequests:
        return cls([], [], Totals.empty(), Totals.empty(), {}, _unknown)

    @classmethod
    def concat(cls, parts: list[StoredRequests]) -> StoredRequests:
        offsets = np.cumsum([0, *(len(p) for p in parts)])[:-1].tolist()
        nodes: dict[int, tuple[int, int]] = {}
        function_names: dict[int, str] = {}
        for p in parts:
            nodes.update(p.nodes)
            function_names.update(p.function_names)
        return cls(
            [row for p in parts for row in p.rows],
            [tree for p in parts for tree in p.trees],
            Totals.concat([p.stacks for p in parts], offsets),
            Totals.concat([p.functions for p in parts], offsets),
            nodes,
            _first_shown([p.shown for p in parts]),
            function_names,
        )

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, keep: list[bool]) -> StoredRequests:
        mask = np.array(keep, dtype=bool)
        return StoredRequests(
            [row for row, k in zip(self.rows, keep, strict=True) if k],
            [tree for tree, k in zip(self.trees, keep, strict=True) if k],
            self.stacks.select(mask),
            self.functions.select(mask),
            self.nodes,
            self.shown,
            self.function_names,
        )

    def regroup(self, key: Callable[[dict], tuple]) -> tuple[list[tuple], np.ndarray]:
        """The distinct `key(row)` values, sorted, and each request's index among them."""
        keys = [key(row) for row in self.rows]
        distinct = sorted(set(keys))
        number = {k: i for i, k in enumerate(distinct)}
        return distinct, np.array([number[k] for k in keys], dtype=np.int64)


def _unknown(_: int) -> None:
    return None


def _first_shown(parts: list[Callable[[int], str | None]]) -> Callable[[int], str | None]:
    """Names from several sessions' stacks: the first that knows the stack names it."""

    def shown(sid: int) -> str | None:
        for part in parts:
            name = part(sid)
            if name is not None:
                return name
        return None

    return shown


@dataclass
class WriteSet:
    sessions: list[dict] = field(default_factory=list)  # new or claimed sessions
    heartbeats: list[str] = field(default_factory=list)
    functions: list[dict] = field(default_factory=list)  # id, name, file, line, kind
    session_functions: list[dict] = field(default_factory=list)
    spool: list[tuple] = field(default_factory=list)  # in SPOOL_COLUMNS order
    release: list[tuple[str, int]] = field(default_factory=list)
    requests: list[StoredRequests] = field(default_factory=list)  # one entry per session
    route_minutes: list[tuple] = field(default_factory=list)  # route_minutes rows

    def __bool__(self) -> bool:
        return any(
            (
                self.sessions,
                self.heartbeats,
                self.functions,
                self.session_functions,
                self.spool,
                self.release,
                self.requests,
                self.route_minutes,
            )
        )


def _insert(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


# --- bulk rows -------------------------------------------------------------------------------
# A group's requests bring ~45 rows each (request, tree, functions, bucket aggregates). They go
# to the driver as plain tuples, a statement or two per table: SQLAlchemy's per-row parameter
# processing would cost more than the database does. One strategy per backend, each with
#   insert(conn, table, columns, rows)
#   insert_new(...) -> keys: INSERT ... ON CONFLICT DO NOTHING; the (first) key of rows inserted
#   upsert(..., greatest): INSERT ... ON CONFLICT (primary key) DO UPDATE, adding up the other
#       columns except the `greatest` ones, which keep the larger value.

_Columns = tuple[str, ...]

# Bulk rows are tuples in the tables' own column order.
_TREE_COLUMNS = tuple(schema.request_trees.c.keys())
_REQUEST_FUNCTION_COLUMNS = tuple(schema.request_functions.c.keys())
_REQUEST_FUNCTION_TOTALS = (CALLS, TOTAL, SELF, ACTIVE, MAX)
_STACK_COLUMNS = tuple(schema.stack_nodes.c.keys())
_STACK_BUCKET_COLUMNS = tuple(schema.stack_buckets.c.keys())
_FUNCTION_BUCKET_TOTALS = (CALLS, TOTAL, SELF, ACTIVE, AWAIT, READY, MAX, MAX_SLICE)
_FUNCTION_BUCKET_COLUMNS = tuple(schema.function_buckets.c.keys())
_ROUTE_MINUTE_COLUMNS = tuple(schema.route_minutes.c.keys())
_ROUTE_ROLLUP_COLUMNS = tuple(schema.route_rollups.c.keys())
SPOOL_COLUMNS = tuple(schema.spool.c.keys())


@cache
def _on_conflict_update(table: Table, columns: _Columns, greatest: _Columns, function: str) -> str:
    key = [c.name for c in table.primary_key.columns]
    updates = []
    for name in columns:
        if name in key:
            continue
        old, new = f"{table.name}.{name}", f"excluded.{name}"
        value = f"{function}({old}, {new})" if name in greatest else f"{old} + {new}"
        updates.append(f"{name} = {value}")
    return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(updates)}"


@cache
def _values(table: Table, columns: _Columns, rows: int = 1) -> str:
    row = f"({', '.join('?' * len(columns))})"
    return f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES {', '.join([row] * rows)}"


class _SQLite:
    """executemany on sqlite3; it drops RETURNING rows, so insert_new uses multi-row VALUES."""

    VARIABLES = 999  # the lowest SQLITE_MAX_VARIABLE_NUMBER a build can have

    def insert(self, conn: Connection, table: Table, columns: _Columns, rows: list[tuple]) -> None:
        conn.exec_driver_sql(_values(table, columns), rows)

    def insert_new(
        self, conn: Connection, table: Table, columns: _Columns, rows: list[tuple]
    ) -> set:
        key = table.primary_key.columns[0].name
        per = self.VARIABLES // len(columns)
        inserted = set()
        for first in range(0, len(rows), per):
            chunk = rows[first : first + per]
            sql = f"{_values(table, columns, len(chunk))} ON CONFLICT DO NOTHING RETURNING {key}"
            inserted.update(conn.exec_driver_sql(sql, tuple(chain(*chunk))).scalars().all())
        return inserted

    def upsert(
        self,
        conn: Connection,
        table: Table,
        columns: _Columns,
        rows: list[tuple],
        greatest: _Columns = (),
    ) -> None:
        sql = f"{_values(table, columns)} {_on_conflict_update(table, columns, greatest, 'max')}"
        conn.exec_driver_sql(sql, rows)


@cache
def _pg_types(table: Table, columns: _Columns) -> list[str]:
    # Unbounded (VARCHAR, not VARCHAR(64)): a too-long value fails as in a plain INSERT.
    dialect = postgresql.dialect()
    return [table.c[name].type.compile(dialect=dialect).split("(")[0] for name in columns]


@cache
def _unnest(table: Table, columns: _Columns) -> str:
    arrays = ", ".join(f"%b::{t}[]" for t in _pg_types(table, columns))  # %b: binary format
    return f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT * FROM unnest({arrays})"


class _PostgreSQL:
    """Binary COPY for inserts; otherwise one INSERT ... SELECT FROM unnest(an array per
    column), which keeps the arrays' order: upserts lock rows in the order given."""

    def insert(self, conn: Connection, table: Table, columns: _Columns, rows: list[tuple]) -> None:
        cursor = conn.connection.driver_connection.cursor()
        sql = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
        with cursor, cursor.copy(sql) as copy:
            copy.set_types([t.lower() for t in _pg_types(table, columns)])
            for row in rows:
                copy.write_row(row)

    def insert_new(
        self, conn: Connection, table: Table, columns: _Columns, rows: list[tuple]
    ) -> set:
        key = table.primary_key.columns[0].name
        sql = f"{_unnest(table, columns)} ON CONFLICT DO NOTHING RETURNING {key}"
        return set(conn.exec_driver_sql(sql, _arrays(rows)).scalars().all())  # one fetch

    def upsert(
        self,
        conn: Connection,
        table: Table,
        columns: _Columns,
        rows: list[tuple],
        greatest: _Columns = (),
    ) -> None:
        conflict = _on_conflict_update(table, columns, greatest, "greatest")
        conn.exec_driver_sql(f"{_unnest(table, columns)} {conflict}", _arrays(rows))


def _arrays(rows: list[tuple]) -> tuple[list, ...]:
    return tuple(map(list, zip(*rows, strict=True)))


_BULK: dict[str, _SQLite | _PostgreSQL] = {"sqlite": _SQLite(), "postgresql": _PostgreSQL()}


def _minute(row: dict) -> tuple[int, str, str]:
    return (row["start_ns"] // 60_000_000_000, row["service"], row["route"])


def _buckets(stored: StoredRequests) -> tuple[list[tuple], list[tuple]]:
    """The requests summed per (minute, service, route): stack_buckets and function_buckets
    rows, sorted so that servers sharing a PostgreSQL lock bucket rows in the same order."""
    keys, bucket = stored.regroup(_minute)
    stacks = stored.stacks.regroup(bucket).rows((SELF, CALLS, AWAITING, READYING))
    functions = stored.functions.regroup(bucket).rows(_FUNCTION_BUCKET_TOTALS)
    return [(*keys[b], k, *v) for b, k, v in stacks], [(*keys[b], k, *v) for b, k, v in functions]


class Writer:
    """Owns the write side of the store; remembers which function/stack ids exist already."""

    def __init__(self, engine: Engine, owner: str) -> None:
        self.engine = engine
        self.owner = owner
        self._known_functions: set[int] = set()
        self._known_stacks: set[int] = set()

    def write(self, ws: WriteSet) -> StoredRequests:
        """Stores everything in one transaction; returns the requests that were new. The ids
        it inserted are remembered only once committed: after a rollback they are retried."""
        new_functions: list[int] = []
        new_stacks: list[int] = []
        stored = StoredRequests.empty()
        with self.engine.begin() as conn:
            if ws.sessions:
                self._upsert_sessions(conn, ws.sessions)
            if ws.heartbeats:
                conn.execute(
                    update(schema.sessions)
                    .where(
                        schema.sessions.c.id == bindparam("sid"),
                        schema.sessions.c.owner == self.owner,
                    )
                    .values(heartbeat=time.time()),
                    [{"sid": sid} for sid in ws.heartbeats],
                )
            new_functions = self._insert_functions(conn, ws)
            if ws.spool:  # a batch resent after its commit was not acked is there already
                _BULK[conn.dialect.name].insert_new(conn, schema.spool, SPOOL_COLUMNS, ws.spool)
            if ws.release:
                conn.execute(
                    update(schema.spool)
                    .where(
                        and_(
                            schema.spool.c.session_id == bindparam("sid"),
                            schema.spool.c.seq == bindparam("sq"),
                        )
                    )
                    .values(payload=None),
                    [{"sid": sid, "sq": seq} for sid, seq in ws.release],
                )
            if ws.route_minutes:
                bulk = _BULK[conn.dialect.name]
                bulk.upsert(conn, schema.route_minutes, _ROUTE_MINUTE_COLUMNS, ws.route_minutes)
                rollups = route_rollup.rollup_rows(ws.route_minutes)
                bulk.upsert(conn, schema.route_rollups, _ROUTE_ROLLUP_COLUMNS, rollups)
            if ws.requests:
                stored, new_stacks = self._insert_requests(conn, ws.requests)
        self._remember(self._known_functions, new_functions)
        self._remember(self._known_stacks, new_stacks)
        return stored

    def _upsert_sessions(self, conn: Connection, rows: list[dict]) -> None:
        stmt = _insert(conn, schema.sessions)
        stmt = stmt.on_conflict_do_update(
            index_elements=[schema.sessions.c.id],
            set_={"owner": stmt.excluded.owner, "heartbeat": stmt.excluded.heartbeat},
        )
        conn.execute(stmt, rows)

    def _insert_functions(self, conn: Connection, ws: WriteSet) -> list[int]:
        new = [f for f in ws.functions if f["id"] not in self._known_functions]
        if new:
            unique = {f["id"]: f for f in new}
            conn.execute(
                _insert(conn, schema.functions).on_conflict_do_nothing(),
                sorted(unique.values(), key=lambda f: f["id"]),
            )
        if ws.session_functions:
            conn.execute(
                _insert(conn, schema.session_functions).on_conflict_do_nothing(),
                ws.session_functions,
            )
        return [f["id"] for f in new]

    def _insert_requests(
        self, conn: Connection, parts: list[StoredRequests]
    ) -> tuple[StoredRequests, list[int]]:
        """Returns the requests inserted and the stack ids it inserted."""
        # A request stored before (resent batch, another server) is skipped as a whole,
        # aggregates included: RETURNING tells which rows were really inserted.
        items = StoredRequests.concat(parts)
        bulk = _BULK[conn.dialect.name]
        columns = tuple(items.rows[0])  # the rows' keys, as SQLAlchemy would take them
        row = itemgetter(*columns)
        inserted = bulk.insert_new(conn, schema.requests, columns, [row(r) for r in items.rows])
        stored = items.select([r["id"] in inserted for r in items.rows])
        if not stored:
            return stored, []
        ids = [r["id"] for r in stored.rows]
        bulk.insert(
            conn, schema.request_trees, _TREE_COLUMNS, list(zip(ids, stored.trees, strict=True))
        )
        functions = stored.functions
        if len(functions):
            starts = [r["start_ns"] for r in stored.rows]
            durations = [r["duration_ns"] for r in stored.rows]
            function_rows = [
                (ids[o], fid, starts[o], durations[o], *t)
                for o, fid, t in functions.rows(_REQUEST_FUNCTION_TOTALS)
            ]
            bulk.insert(conn, schema.request_functions, _REQUEST_FUNCTION_COLUMNS, function_rows)
        stack_rows, function_bucket_rows = _buckets(stored)
        new_stacks = self._insert_stacks(conn, stored.nodes)
        if stack_rows:
            bulk.upsert(conn, schema.stack_buckets, _STACK_BUCKET_COLUMNS, stack_rows)
        if function_bucket_rows:
            bulk.upsert(
                conn,
                schema.function_buckets,
                _FUNCTION_BUCKET_COLUMNS,
                function_bucket_rows,
                greatest=("max_ns", "max_slice_ns"),
            )
        return stored, new_stacks

    def _insert_stacks(self, conn: Connection, nodes: dict[int, tuple[int, int]]) -> list[int]:
        new = {k: v for k, v in nodes.items() if k not in self._known_stacks}
        if new:
            rows = [(k, parent, function) for k, (parent, function) in sorted(new.items())]
            _BULK[conn.dialect.name].insert_new(conn, schema.stack_nodes, _STACK_COLUMNS, rows)
        return list(new)

    @staticmethod
    def _remember(known: set[int], ids: Iterable[int]) -> None:
        if len(known) > KNOWN_IDS_LIMIT:
            known.clear()
        known.update(ids)
