"""Schema upgrades: a database written by an older server keeps its data and gets what the
new version adds; the flame graph and function queries read the indexes that v2 adds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Column, Engine, MetaData, Table, event, inspect, select, text

from profiler_server.assembly.flatten import OUTSIDE_ID, OUTSIDE_NAME, stable_id
from profiler_server.assembly.stacktree import stack_id
from profiler_server.storage import migrations, queries, schema
from profiler_server.storage.engine import open_engine

NS_PER_MINUTE = queries.NS_PER_MINUTE
MINUTES = (1000, 1001, 1060)  # three buckets: two adjacent, one an hour later
HANDLER, QUERY = stable_id("shop:handler"), stable_id("db:query")  # as ingest names them


# stack_buckets as versions 1 to 5 made it: no await_ns, ready_ns
V4_STACK_BUCKETS = Table(
    schema.stack_buckets.name,
    MetaData(),
    *(
        Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in schema.stack_buckets.columns
        if c.name not in ("await_ns", "ready_ns")
    ),
)


def v1_database(url: str) -> Engine:
    """A database as a v1 server leaves it: only the first migration, version 1, some data."""
    engine = open_engine(url)
    with engine.begin() as conn:
        migrations.MIGRATIONS[0](conn)
        conn.execute(schema.schema_version.insert().values(version=1))
        # v1 made the signatures' table, and stack buckets without waits (the tables of
        # today are made by v1's create_all)
        schema.stack_nodes.drop(conn)
        migrations.legacy_stacks.create(conn)
        schema.stack_buckets.drop(conn)
        V4_STACK_BUCKETS.create(conn)
        conn.execute(
            migrations.legacy_stacks.insert(),
            [
                {"id": 1, "signature": "shop:handler"},
                {"id": 2, "signature": "shop:handler;db:query"},
            ],
        )
        conn.execute(
            schema.functions.insert(),
            [
                {"id": HANDLER, "name": "shop:handler", "file": "shop.py", "line": 3, "kind": 0},
                {"id": QUERY, "name": "db:query", "file": "db.py", "line": 7, "kind": 0},
            ],
        )
        stack_rows, function_rows = [], []
        for n, minute in enumerate(MINUTES, start=1):
            for route in ("/a", "/b"):
                key = {"minute": minute, "service": "shop", "route": route}
                stack_rows.append({**key, "stack_id": 1, "self_ns": n * 10, "calls": n})
                stack_rows.append({**key, "stack_id": 2, "self_ns": n * 100, "calls": 2 * n})
                for fid, self_ns in ((HANDLER, n * 10), (QUERY, n * 100)):
                    function_rows.append(
                        {
                            **key,
                            "function_id": fid,
                            "calls": n,
                            "total_ns": self_ns + 5,
                            "self_ns": self_ns,
                            "active_ns": self_ns,
                            "await_ns": 0,
                            "ready_ns": 0,
                            "max_ns": self_ns,
                            "max_slice_ns": self_ns,
                        }
                    )
        conn.execute(V4_STACK_BUCKETS.insert(), stack_rows)
        conn.execute(schema.function_buckets.insert(), function_rows)
        conn.execute(
            schema.requests.insert().values(
                id="s-1",
                session_id="s",
                service="shop",
                route="/a",
                method="GET",
                status=200,
                start_ns=MINUTES[0] * NS_PER_MINUTE,
                duration_ns=5_000_000,
                truncated=False,
                calls=2,
                events=4,
            )
        )
        conn.execute(schema.request_trees.insert().values(request_id="s-1", tree=b"\x0a\x01x"))
    return engine


# v3 turns the signatures into a prefix tree and moves the stack buckets to its ids
RESTACKED = {schema.schema_version.name, schema.stack_nodes.name, schema.stack_buckets.name}


def contents(engine: Engine) -> dict[str, list[tuple]]:
    """Every table's rows but those v3 changes."""
    with engine.connect() as conn:
        return {
            table.name: sorted(tuple(row) for row in conn.execute(select(table)))
            for table in schema.metadata.sorted_tables
            if table.name not in RESTACKED
        }


def stack_rows(engine: Engine) -> tuple[list[tuple], list[tuple]]:
    """Stack buckets with the stack's frames instead of its id; and the stack nodes."""
    with engine.connect() as conn:
        nodes = sorted(tuple(r) for r in conn.execute(select(schema.stack_nodes)))
        buckets = conn.execute(select(schema.stack_buckets)).all()
    by_id = {sid: (parent, function) for sid, parent, function in nodes}
    rows = []
    for minute, service, route, sid, *values in buckets:
        frames = []
        while sid:
            sid, function = by_id[sid]
            frames.append(function)
        rows.append((minute, service, route, tuple(frames[::-1]), *values))
    return sorted(rows), nodes


def v2_indexes(engine: Engine) -> dict[str, list[str]]:
    """Name -> columns of the v2 indexes present."""
    found = {}
    for table, (name, _) in schema.bucket_indexes.items():
        for index in inspect(engine).get_indexes(table):
            if index["name"] == name:
                found[name] = list(index["column_names"])
    return found


def expected_indexes(engine: Engine) -> dict[str, list[str]]:
    """SQLite gets the covering indexes; PostgreSQL none (its planner would not use them)."""
    if engine.dialect.name != "sqlite":
        return {}
    return {name: list(columns) for name, columns in schema.bucket_indexes.values()}


def test_a_v1_database_is_upgraded_and_keeps_its_data(db_url) -> None:
    engine = v1_database(db_url)
    try:
        before = contents(engine)
        with engine.connect() as conn:
            legacy_buckets = conn.execute(select(V4_STACK_BUCKETS)).all()
        assert v2_indexes(engine) == {}
        assert migrations.upgrade(engine) == 1
        with engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST
            versions = conn.execute(select(schema.schema_version.c.version)).scalars().all()
            assert versions == [migrations.LATEST]
        # v6 adds the function a lane's time outside profiled calls goes to
        outside = (OUTSIDE_ID, OUTSIDE_NAME, "", 0, 0)
        assert contents(engine) == {**before, "functions": sorted([*before["functions"], outside])}
        assert v2_indexes(engine) == expected_indexes(engine)
        with engine.connect() as conn:
            assert not inspect(conn).has_table(migrations.legacy_stacks.name)
        buckets, nodes = stack_rows(engine)
        outer = stack_id(0, HANDLER)
        assert nodes == sorted([(outer, 0, HANDLER), (stack_id(outer, QUERY), outer, QUERY)])
        frames = {1: (HANDLER,), 2: (HANDLER, QUERY)}
        assert buckets == sorted(  # v6: no waits known before it
            (minute, service, route, frames[sid], self_ns, calls, 0, 0)
            for minute, service, route, sid, self_ns, calls in legacy_buckets
        )
        assert migrations.upgrade(engine) == migrations.LATEST  # then left alone

        # What the API reads is right with either query shape (whole range, a time range).
        assert queries.stack_totals(engine) == [
            ("shop:handler", 2 * (10 + 20 + 30), 2 * (1 + 2 + 3)),
            ("shop:handler;db:query", 2 * (100 + 200 + 300), 2 * 2 * (1 + 2 + 3)),
        ]
        first_hour = {
            "since_ns": MINUTES[0] * NS_PER_MINUTE,
            "until_ns": MINUTES[1] * NS_PER_MINUTE,
        }
        assert queries.stack_totals(engine, route="/b", **first_hour) == [
            ("shop:handler", 10 + 20, 1 + 2),
            ("shop:handler;db:query", 100 + 200, 2 * (1 + 2)),
        ]
        assert queries.stack_totals(engine, service="other", since_ns=0) == []
        late = queries.function_totals(engine, since_ns=MINUTES[2] * NS_PER_MINUTE)
        assert [(f["name"], f["calls"], f["self_ns"], f["max_ns"]) for f in late] == [
            ("db:query", 2 * 3, 2 * 300, 300),
            ("shop:handler", 2 * 3, 2 * 30, 30),
        ]
        whole = queries.function_totals(engine, route="/a")
        assert [(f["name"], f["calls"], f["total_ns"], f["max_ns"]) for f in whole] == [
            ("db:query", 6, 600 + 3 * 5, 300),
            ("shop:handler", 6, 60 + 3 * 5, 30),
        ]
        assert list(whole[0]) == list(late[0])  # the same fields, in the same order
    finally:
        engine.dispose()


def test_a_new_database_gets_every_version(db_url) -> None:
    engine = open_engine(db_url)
    try:
        assert migrations.upgrade(engine) == 0
        assert v2_indexes(engine) == expected_indexes(engine)
    finally:
        engine.dispose()


def test_postgresql_upgrade_waits_for_the_migration_lock(pg_url) -> None:
    """Servers starting together on one PostgreSQL: one migrates, the others wait."""
    engine = v1_database(pg_url)
    found: list[int] = []
    try:
        with engine.connect() as holder:
            holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": migrations.LOCK_KEY})
            upgrading = threading.Thread(target=lambda: found.append(migrations.upgrade(engine)))
            upgrading.start()
            time.sleep(1.0)
            assert upgrading.is_alive()
            with engine.connect() as conn:
                assert migrations.current_version(conn) == 1
            holder.rollback()  # ends the transaction: releases the lock
        upgrading.join(60)
        assert found == [1]
        with engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST
    finally:
        engine.dispose()


def sqlite_plan(engine: Engine, run: Callable[[], object]) -> str:
    """SQLite's plan for the grouped statement that `run` executes."""
    statements: list[tuple[str, tuple]] = []

    def capture(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    [(statement, parameters)] = [s for s in statements if "GROUP BY" in s[0]]
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        return " | ".join(row[3] for row in rows)


@pytest.mark.parametrize(
    ("totals", "index", "key"),
    [
        (queries.stack_totals, "ix_stack_buckets_stack", "stack_id"),
        (queries.function_totals, "ix_function_buckets_function", "function_id"),
    ],
)
def test_sqlite_sums_read_the_covering_index_without_statistics(
    tmp_path, totals: Callable, index: str, key: str
) -> None:
    """No ANALYZE has run (none ever does on SQLite): the whole range streams through the
    index in key order, a time range seeks per key, a route filter never reads the table."""
    engine = v1_database(f"sqlite:///{tmp_path / 'profiler.db'}")
    try:
        migrations.upgrade(engine)
        with engine.connect() as conn:
            assert not inspect(conn).has_table("sqlite_stat1")
        for args in ({}, {"service": "shop", "route": "/a"}):
            plan = sqlite_plan(engine, lambda args=args: totals(engine, **args))
            assert f"USING COVERING INDEX {index}" in plan
            assert "TEMP B-TREE FOR GROUP BY" not in plan
        for args in ({"since_ns": 0}, {"since_ns": 0, "until_ns": 1, "route": "/a"}):
            plan = sqlite_plan(engine, lambda args=args: totals(engine, **args))
            assert f"USING COVERING INDEX {index} ({key}=? AND minute>?" in plan
            assert "TEMP B-TREE FOR GROUP BY" not in plan
    finally:
        engine.dispose()
