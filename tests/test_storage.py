"""Schema versions and retention, on both backends."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
from sqlalchemy import create_engine, func, insert, select

from profiler_core.wire.builder import BatchBuilder
from profiler_server.assembly.flatten import stable_id
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch
from profiler_server.storage import migrations, queries, schema
from profiler_server.storage.engine import open_engine
from tests.helpers import eventually, metric_value, stored_requests
from tests.processes import ServerProcess

HOUR_NS = 3600 * 10**9


def test_schema_is_created_then_left_alone(db_url) -> None:
    engine = open_engine(db_url)
    try:
        assert migrations.upgrade(engine) == 0
        assert migrations.upgrade(engine) == migrations.LATEST
        with engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST
            rows = conn.execute(select(func.count()).select_from(schema.schema_version)).scalar()
            assert rows == 1
    finally:
        engine.dispose()


def test_newer_schema_is_refused_with_a_clear_error(db_url, tmp_path) -> None:
    engine = open_engine(db_url)
    migrations.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(schema.schema_version.update().values(version=migrations.LATEST + 1))
    with pytest.raises(migrations.SchemaTooNew, match="upgrade request-profiler"):
        migrations.upgrade(engine)
    engine.dispose()
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError):
        ServerProcess(db_url, log)
    assert "newer than this server" in log.read_text()


def send(server, wall_offset_ns: int, ids: range) -> None:
    """Requests from a host whose clock pair places them `wall_offset_ns` in the past."""
    message = hello("shop", uuid.uuid4())
    message.wall_ns -= wall_offset_ns
    builder = BatchBuilder()
    synthetic_batch(builder, CallShape(calls=20, depth=4, functions=6), ids)
    stream = HostStream(server.target)
    stream.send_hello(message)
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1})
    stream.close()


def test_retention_deletes_old_requests_in_the_background(start_server, db_url) -> None:
    server = start_server(db_url, retention=60.0)
    send(server, 2 * HOUR_NS, range(1, 4))
    send(server, 0, range(1, 3))
    engine = server.server.engine
    old_minute = (time.time_ns() - 2 * HOUR_NS) // 60_000_000_000

    def old_buckets() -> int:
        with engine.connect() as conn:
            return conn.execute(
                select(func.count())
                .select_from(schema.stack_buckets)
                .where(schema.stack_buckets.c.minute <= old_minute)
            ).scalar()

    assert metric_value(server.http, "profiler_requests_stored_total") == 5
    assert eventually(lambda: len(stored_requests(server.http)) == 2, timeout=20)
    assert eventually(lambda: old_buckets() == 0, timeout=20)
    with engine.connect() as conn:
        trees = conn.execute(select(func.count()).select_from(schema.request_trees)).scalar()
        functions = conn.execute(
            select(func.count(func.distinct(schema.request_functions.c.request_id)))
        ).scalar()
    assert trees == 2 and functions == 2


def test_request_count_stops_past_its_cap(tmp_path, monkeypatch) -> None:
    """Paging counts the matches, but never more than MAX_COUNT + 1 of them."""
    engine = create_engine(f"sqlite:///{tmp_path / 'count.db'}")
    schema.metadata.create_all(engine)
    row = {"session_id": "s", "service": "shop", "route": "/a", "method": "GET", "status": 200,
           "truncated": False, "calls": 1, "events": 2}  # fmt: skip
    with engine.begin() as conn:
        conn.execute(
            insert(schema.requests),
            [{**row, "id": f"s-{i}", "start_ns": i, "duration_ns": i} for i in range(10)],
        )
    monkeypatch.setattr(queries, "MAX_COUNT", 4)
    page, counted = queries.list_requests(engine, queries.RequestFilter(limit=2, offset=6))
    assert [r["id"] for r in page] == ["s-3", "s-2"] and counted == 5
    _, few = queries.list_requests(engine, queries.RequestFilter(min_duration_ns=7))
    assert few == 3


def test_rows_are_keyed_by_plain_str(tmp_path) -> None:
    """SQLAlchemy keys a row by `quoted_name`, a str subclass orjson refuses as a dict key:
    an answer holding such a row was written by the slow fallback encoder (a 10,000-call
    request took 200 ms instead of 40). The queries hand the API plain `str` keys."""
    engine = create_engine(f"sqlite:///{tmp_path / 'keys.db'}")
    schema.metadata.create_all(engine)
    name = "shop.views:index"
    with engine.begin() as conn:
        conn.execute(
            insert(schema.requests),
            [{"id": "s-1", "session_id": "s", "service": "shop", "route": "/a", "method": "GET",
              "status": 200, "truncated": False, "calls": 1, "events": 2, "start_ns": 1,
              "duration_ns": 1}],
        )  # fmt: skip
        conn.execute(
            insert(schema.functions),
            [{"id": stable_id(name), "name": name, "file": "shop/views.py", "line": 3, "kind": 0}],
        )
    listed, _ = queries.list_requests(engine, queries.RequestFilter())
    sources = queries.function_sources(engine, [name])
    assert len(listed) == len(sources) == 1
    for row in (*listed, *sources):
        assert {type(key) for key in row} == {str}, row
    assert orjson.loads(orjson.dumps(sources)) == [
        {"name": name, "file": "shop/views.py", "line": 3}
    ]
