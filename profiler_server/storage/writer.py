"""The ingest write path: one transaction per group of batches, then the acks."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, Connection, Engine, Table, and_, bindparam, func, update
from sqlalchemy.dialects import postgresql, sqlite

from profiler_server.assembly.flatten import (
    ACTIVE,
    AWAIT,
    CALLS,
    MAX,
    MAX_SLICE,
    READY,
    SELF,
    TOTAL,
)
from profiler_server.storage import schema

KNOWN_IDS_LIMIT = 1_000_000


@dataclass
class StoredRequest:
    row: dict
    tree: bytes  # serialized StoredTree
    functions: dict[int, list[int]]
    stacks: list[tuple[int, str, int, int]]  # stack id, signature, self ns, calls

    @property
    def id(self) -> str:
        return self.row["id"]

    @property
    def minute(self) -> int:
        return self.row["start_ns"] // 60_000_000_000


@dataclass
class WriteSet:
    sessions: list[dict] = field(default_factory=list)  # new or claimed sessions
    heartbeats: list[str] = field(default_factory=list)
    functions: list[dict] = field(default_factory=list)  # id, name, file, line, kind
    session_functions: list[dict] = field(default_factory=list)
    spool: list[dict] = field(default_factory=list)
    release: list[tuple[str, int]] = field(default_factory=list)
    requests: list[StoredRequest] = field(default_factory=list)

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
            )
        )


def _insert(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def _greatest(conn: Connection, a: ColumnElement, b: ColumnElement) -> ColumnElement:
    return func.greatest(a, b) if conn.dialect.name == "postgresql" else func.max(a, b)


class Writer:
    """Owns the write side of the store; remembers which function/stack ids exist already."""

    def __init__(self, engine: Engine, owner: str) -> None:
        self.engine = engine
        self.owner = owner
        self._known_functions: set[int] = set()
        self._known_stacks: set[int] = set()

    def write(self, ws: WriteSet) -> list[StoredRequest]:
        """Stores everything in one transaction; returns the requests that were new."""
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
            self._insert_functions(conn, ws)
            if ws.spool:
                conn.execute(_insert(conn, schema.spool).on_conflict_do_nothing(), ws.spool)
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
            return self._insert_requests(conn, ws.requests) if ws.requests else []

    def _upsert_sessions(self, conn: Connection, rows: list[dict]) -> None:
        stmt = _insert(conn, schema.sessions)
        stmt = stmt.on_conflict_do_update(
            index_elements=[schema.sessions.c.id],
            set_={"owner": stmt.excluded.owner, "heartbeat": stmt.excluded.heartbeat},
        )
        conn.execute(stmt, rows)

    def _insert_functions(self, conn: Connection, ws: WriteSet) -> None:
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
        self._remember(self._known_functions, (f["id"] for f in new))

    def _insert_requests(self, conn: Connection, items: list[StoredRequest]) -> list[StoredRequest]:
        # A request stored before (resent batch, another server) is skipped as a whole,
        # aggregates included: RETURNING tells which rows were really inserted.
        stmt = (
            _insert(conn, schema.requests)
            .on_conflict_do_nothing()
            .returning(schema.requests.c.id, sort_by_parameter_order=True)
        )
        inserted_ids = {row[0] for row in conn.execute(stmt, [item.row for item in items])}
        stored = [item for item in items if item.id in inserted_ids]
        if not stored:
            return stored
        conn.execute(
            schema.request_trees.insert(),
            [{"request_id": s.id, "tree": s.tree} for s in stored],
        )
        function_rows = [
            {
                "request_id": s.id,
                "function_id": fid,
                "start_ns": s.row["start_ns"],
                "duration_ns": s.row["duration_ns"],
                "calls": t[CALLS],
                "total_ns": t[TOTAL],
                "self_ns": t[SELF],
                "active_ns": t[ACTIVE],
                "max_ns": t[MAX],
            }
            for s in stored
            for fid, t in s.functions.items()
        ]
        if function_rows:
            conn.execute(schema.request_functions.insert(), function_rows)
        self._insert_stacks(conn, stored)
        self._add_buckets(conn, stored)
        return stored

    def _insert_stacks(self, conn: Connection, stored: list[StoredRequest]) -> None:
        new: dict[int, str] = {}
        for s in stored:
            for stack_id, sig, _, _ in s.stacks:
                if stack_id not in self._known_stacks:
                    new[stack_id] = sig
        if new:
            conn.execute(
                _insert(conn, schema.stacks).on_conflict_do_nothing(),
                [{"id": k, "signature": v} for k, v in sorted(new.items())],
            )
            self._remember(self._known_stacks, new)

    def _add_buckets(self, conn: Connection, stored: list[StoredRequest]) -> None:
        stacks: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        functions: dict[tuple, list[int]] = defaultdict(lambda: [0] * 8)
        for s in stored:
            key = (s.minute, s.row["service"], s.row["route"])
            for stack_id, _, self_ns, calls in s.stacks:
                agg = stacks[(*key, stack_id)]
                agg[0] += self_ns
                agg[1] += calls
            for fid, t in s.functions.items():
                agg = functions[(*key, fid)]
                for i in (CALLS, TOTAL, SELF, ACTIVE, AWAIT, READY):
                    agg[i] += t[i]
                agg[MAX] = max(agg[MAX], t[MAX])
                agg[MAX_SLICE] = max(agg[MAX_SLICE], t[MAX_SLICE])
        # Sorted keys: servers sharing a PostgreSQL lock bucket rows in the same order.
        if stacks:
            self._upsert_stack_buckets(conn, stacks)
        if functions:
            self._upsert_function_buckets(conn, functions)

    def _upsert_stack_buckets(self, conn: Connection, stacks: dict[tuple, list[int]]) -> None:
        table = schema.stack_buckets
        stmt = _insert(conn, table)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[table.c.minute, table.c.service, table.c.route, table.c.stack_id],
                set_={
                    "self_ns": table.c.self_ns + stmt.excluded.self_ns,
                    "calls": table.c.calls + stmt.excluded.calls,
                },
            ),
            [
                {
                    "minute": k[0],
                    "service": k[1],
                    "route": k[2],
                    "stack_id": k[3],
                    "self_ns": v[0],
                    "calls": v[1],
                }
                for k, v in sorted(stacks.items())
            ],
        )

    def _upsert_function_buckets(self, conn: Connection, functions: dict[tuple, list[int]]) -> None:
        table = schema.function_buckets
        stmt = _insert(conn, table)
        summed = ("calls", "total_ns", "self_ns", "active_ns", "await_ns", "ready_ns")
        set_ = {name: table.c[name] + stmt.excluded[name] for name in summed}
        for name in ("max_ns", "max_slice_ns"):
            set_[name] = _greatest(conn, table.c[name], stmt.excluded[name])
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[
                    table.c.minute,
                    table.c.service,
                    table.c.route,
                    table.c.function_id,
                ],
                set_=set_,
            ),
            [
                {
                    "minute": k[0],
                    "service": k[1],
                    "route": k[2],
                    "function_id": k[3],
                    "calls": v[CALLS],
                    "total_ns": v[TOTAL],
                    "self_ns": v[SELF],
                    "active_ns": v[ACTIVE],
                    "await_ns": v[AWAIT],
                    "ready_ns": v[READY],
                    "max_ns": v[MAX],
                    "max_slice_ns": v[MAX_SLICE],
                }
                for k, v in sorted(functions.items())
            ],
        )

    @staticmethod
    def _remember(known: set[int], ids: Iterable[int]) -> None:
        if len(known) > KNOWN_IDS_LIMIT:
            known.clear()
        known.update(ids)
