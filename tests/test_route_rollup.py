"""The hourly rollup of route counts (route_hours): every range answers the same from
minutes only as from whole hours plus ragged minutes, on both backends, after ingest writes,
a migration from version 4, and retention."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import Engine, func, select

from profiler_core.latency import BUCKETS
from profiler_server.storage import migrations, route_rollup, schema
from profiler_server.storage.engine import open_engine
from profiler_server.storage.queries import NS_PER_MINUTE
from profiler_server.storage.retention import delete_expired
from profiler_server.storage.route_stats import route_stats
from profiler_server.storage.writer import Writer, WriteSet

START = 483_334 * 60 + 17  # an epoch minute 17 minutes into an hour
SPAN = 5 * 60  # minutes of data: five hours and some, over six clock hours


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
    (START, START + SPAN - 1),  # ragged at both ends
    (START - 17, START + 43 + 2 * 60 - 1),  # whole hours only
    (START + 3, START + 40),  # inside one hour
    (START + 43, START + 43 + 59),  # exactly one hour
    (START + 50, START + 43 + 61),  # across one hour boundary, no whole hour
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


def test_the_split_covers_the_range_once() -> None:
    for first in range(START - 130, START + 130, 7):
        for last in range(first, first + 200, 11):
            hours, ends = route_rollup.split(first, last)
            covered = [m for a, b in ends for m in range(a, b)]
            if hours is not None:
                assert hours[0] % 60 == 0 and hours[1] % 60 == 0 and hours[0] < hours[1]
                covered += range(*hours)
            assert sorted(covered) == list(range(first, last + 1))
            # no clock hour lies whole in the minutes read
            assert all(-(-a // 60) * 60 + 60 > b for a, b in ends)


def test_minute_and_rollup_answers_are_identical(db_url) -> None:
    engine = stored(db_url)
    try:
        with engine.connect() as conn:
            minutes = conn.execute(select(func.count()).select_from(schema.route_minutes))
            hours = conn.execute(select(func.count()).select_from(schema.route_hours))
            assert hours.scalar() < minutes.scalar() / 30
        stats = answer(engine, *RANGES[0], True)
        assert len(stats) == 3
        assert [s.requests for s in stats] == sorted((s.requests for s in stats), reverse=True)
        assert sum(s.requests for s in stats) == sum(r[5] for r in minute_rows(1))
        assert all(sum(s.buckets) == s.requests and 0 < s.errors < s.requests for s in stats)
        assert_same_answers(engine)
    finally:
        engine.dispose()


def test_retention_cuts_both_tables_at_the_same_hour(db_url) -> None:
    engine = stored(db_url)
    try:
        cutoff = START + 43 + 60 + 25  # 25 minutes into the third clock hour
        while delete_expired(engine, cutoff * NS_PER_MINUTE, 0.0):
            pass
        kept = START + 43 + 60  # that hour's start: no hour is partly expired
        with engine.connect() as conn:
            for table in (schema.route_minutes, schema.route_hours):
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
            schema.route_hours.drop(conn)  # v1's create_all makes today's tables
            conn.execute(schema.schema_version.insert().values(version=4))
            conn.execute(
                schema.route_minutes.insert(),
                [dict(zip(schema.route_minutes.c.keys(), r, strict=True)) for r in minute_rows(2)],
            )
        assert migrations.upgrade(engine) == 4
        with engine.connect() as conn:
            assert migrations.current_version(conn) == migrations.LATEST
            hours = sorted(tuple(r) for r in conn.execute(select(schema.route_hours)))
        assert hours == route_rollup.hour_rows(minute_rows(2))
        assert_same_answers(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("seed", [3, 4])
def test_hour_rows_sum_over_methods(seed: int) -> None:
    rows = minute_rows(seed)
    hours = route_rollup.hour_rows(rows)
    assert {len(r) for r in hours} == {len(schema.route_hours.c)}
    assert sum(r[4] for r in hours) == sum(r[5] for r in rows)
    for hour in hours[:20]:
        parts = [r for r in rows if r[0] - r[0] % 60 == hour[0] and (r[1], r[2], r[4]) == hour[1:4]]
        assert list(hour[4:]) == [sum(col) for col in zip(*(r[5:] for r in parts), strict=True)]
