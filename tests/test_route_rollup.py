"""The rolled-up route counts (route_rollups: days, hours, ten minutes): every range answers
the same from minutes only as from whole spans plus ragged minutes, on both backends, after
ingest writes, a migration from version 4, and retention."""

from __future__ import annotations

import random

from sqlalchemy import Engine, func, select

from profiler_core.latency import BUCKETS
from profiler_server.storage import migrations, route_rollup, schema
from profiler_server.storage.engine import open_engine
from profiler_server.storage.queries import NS_PER_MINUTE
from profiler_server.storage.retention import delete_expired
from profiler_server.storage.route_stats import route_stats
from profiler_server.storage.writer import Writer, WriteSet

MIDNIGHT = 20_001 * route_rollup.DAY  # an epoch minute starting a day
START = MIDNIGHT - 183  # 3 hours 3 minutes before
SPAN = route_rollup.DAY + 400  # minutes of data: a whole day and ragged parts of two others


def minute_rows(seed: int) -> list[tuple]:
    """route_minutes rows: 3 routes of 2 services, two methods, 2xx and 5xx, most minutes."""
    rng = random.Random(seed)
    rows = []
    for minute in range(START, START + SPAN):
        for service, route in (("shop", "/a"), ("shop", "/b"), ("auth", "/a")):
            for method in ("GET", "POST"):
                for status_class in (2, 5):
                    if rng.random() < 0.3:
                        continue
                    buckets = [0] * BUCKETS
                    count = 0
                    for _ in range(rng.randint(1, 4)):
                        n = rng.randint(1, 50)
                        buckets[rng.randrange(BUCKETS)] += n
                        count += n
                    duration = count * rng.randint(10**5, 10**8)
                    rows.append((minute, service, route, method, status_class, count, duration))
                    rows[-1] += tuple(buckets)
    return rows


def stored(url: str, batches: int = 3) -> Engine:
    """A database whose route counts came through the writer, in several batches."""
    engine = open_engine(url)
    migrations.upgrade(engine)
    writer = Writer(engine, "test")
    rows = minute_rows(1)
    for part in range(batches):
        writer.write(WriteSet(route_minutes=sorted(rows[part::batches])))
    return engine


RANGES = [
    (START, START + SPAN - 1),  # ragged at both ends, a whole day inside
    (MIDNIGHT, MIDNIGHT + route_rollup.DAY - 1),  # exactly one day
    (MIDNIGHT - 120, MIDNIGHT + 179),  # whole hours only
    (MIDNIGHT - 57, MIDNIGHT + 2 * 60 + 33),  # hours, ten minutes and minutes
    (MIDNIGHT + 3, MIDNIGHT + 8),  # inside ten minutes
    (MIDNIGHT + 50, MIDNIGHT + 61),  # across an hour's start, no whole hour
    (START - 500, START + SPAN + 500),  # beyond the data on both sides
]


def answer(engine: Engine, first: int, last: int, rollup: bool, **filters) -> list:
    stats, got_first, got_last = route_stats(
        engine,
        since_ns=first * NS_PER_MINUTE,
        until_ns=last * NS_PER_MINUTE + 5,
        rollup=rollup,
        **filters,
    )
    assert (got_first, got_last) == (first, last)
    return stats


def assert_same_answers(engine: Engine) -> None:
    for first, last in RANGES:
        for filters in ({}, {"service": "shop"}, {"route": "/a"}, {"limit": 2}):
            minutes = answer(engine, first, last, False, **filters)
            assert answer(engine, first, last, True, **filters) == minutes, (first, last)


def test_the_split_covers_the_range_once_with_the_coarsest_spans() -> None:
    for first in range(MIDNIGHT - 1500, MIDNIGHT + 200, 37):
        for end in range(first, first + 3000, 41):
            pieces = route_rollup.split(first, end)
            covered = [m for _, a, b in pieces for m in range(a, b)]
            assert covered == list(range(first, end))  # once each, in order
            for span, a, b in pieces:
                assert a % span == 0 and b % span == 0 and a < b
                for coarser in (s for s in route_rollup.SPANS if s > span):
                    assert -(-a // coarser) * coarser + coarser > b  # none fitted in


def test_minute_and_rollup_answers_are_identical(db_url) -> None:
    engine = stored(db_url)
    try:
        with engine.connect() as conn:
            spans = dict(
                conn.execute(
                    select(schema.route_rollups.c.span, func.count()).group_by(
                        schema.route_rollups.c.span
                    )
                ).all()
            )
        assert set(spans) == set(route_rollup.SPANS)  # every span is read in RANGES[0]
        stats = answer(engine, *RANGES[0], True)
        assert len(stats) == 3
        assert [s.requests for s in stats] == sorted((s.requests for s in stats), reverse=True)
        assert sum(s.requests for s in stats) == sum(r[5] for r in minute_rows(1))
        assert all(sum(s.buckets) == s.requests and 0 < s.errors < s.requests for s in stats)
        assert_same_answers(engine)
    finally:
        engine.dispose()


def test_retention_cuts_both_tables_at_the_same_day(db_url) -> None:
    engine = stored(db_url)
    try:
        cutoff = MIDNIGHT + route_rollup.DAY + 30  # half an hour into the last day
        while delete_expired(engine, cutoff * NS_PER_MINUTE, 0.0):
            pass
        kept = MIDNIGHT + route_rollup.DAY  # that day's start: no span is partly expired
        with engine.connect() as conn:
            for table in (schema.route_minutes, schema.route_rollups):
                assert conn.execute(select(func.min(table.c.minute))).scalar() == kept
        assert_same_answers(engine)
    finally:
        engine.dispose()


def test_version_5_sums_the_minutes_a_version_4_database_holds(db_url) -> None:
    engine = open_engine(db_url)
    try:
        with engine.begin() as conn:
            for migrate in migrations.MIGRATIONS[:4]:
                migrate(conn)
            schema.route_rollups.drop(conn)  # v1's create_all makes today's tables
            conn.execute(schema.schema_version.insert().values(version=4))
            conn.execute(
                schema.route_minutes.insert(),
                [dict(zip(schema.route_minutes.c.keys(), r, strict=True)) for r in minute_rows(2)],
            )
        assert migrations.upgrade(engine) == 4
        with engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST
            rollups = sorted(tuple(r) for r in conn.execute(select(schema.route_rollups)))
        assert rollups == route_rollup.rollup_rows(minute_rows(2))
        assert_same_answers(engine)
    finally:
        engine.dispose()


def test_rollup_rows_sum_over_methods_per_span() -> None:
    rows = minute_rows(3)
    rollups = route_rollup.rollup_rows(rows)
    assert {len(r) for r in rollups} == {len(schema.route_rollups.c)}
    for span in route_rollup.SPANS:
        assert sum(r[5] for r in rollups if r[0] == span) == sum(r[5] for r in rows)
    for span, start, service, route, status_class, *values in rollups[::97]:
        parts = [
            r[5:]
            for r in rows
            if start <= r[0] < start + span and (r[1], r[2], r[4]) == (service, route, status_class)
        ]
        assert values == [sum(column) for column in zip(*parts, strict=True)]
