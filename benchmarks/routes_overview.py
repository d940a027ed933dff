"""The routes overview (`GET /api/routes`) over a week of per-minute counts of 500 routes,
as the UI's landing page asks for it with its 7-day preset. The counts are written through
the server's own writer (so `route_rollups` is kept as ingest keeps it), then read over HTTP;
the same query reading minutes only, timed in this process, is the baseline of the ratio."""

from __future__ import annotations

import statistics
import time

import httpx

from benchmarks.server import ServerProcess
from profiler_core.latency import BUCKETS
from profiler_server.storage import migrations, route_rollup
from profiler_server.storage.engine import open_engine
from profiler_server.storage.route_stats import route_stats
from profiler_server.storage.writer import Writer, WriteSet

GOAL_MS = 200.0
NS_PER_MINUTE = 60 * 10**9


def _row(minute: int, route: int, status_class: int) -> tuple:
    """One route_minutes row: a few to a few dozen requests over a spread of buckets."""
    count = 1 + (minute * 7 + route) % 23
    buckets = [0] * BUCKETS
    buckets[8 + (minute + route) % 20] = count - count // 3
    buckets[20 + route % 15] += count // 3
    duration = count * (1 + route % 50) * 2_000_000
    name = f"/route/{route}/{{id}}"
    return (minute, "shop", name, "GET", status_class, count, duration, *buckets)


def fill(url: str, routes: int, first: int, end: int) -> int:
    """Counts for every route in each minute first..end-1 (5xx in one of ten), written an
    hour at a time as ingest would (in small groups) write them; the rows written."""
    engine = open_engine(url)
    migrations.upgrade(engine)
    writer = Writer(engine, "bench")
    written = 0
    try:
        for hour in range(first, end, route_rollup.HOUR):
            rows = []
            for minute in range(hour, min(hour + route_rollup.HOUR, end)):
                for route in range(routes):
                    rows.append(_row(minute, route, 2))
                    if (minute + route) % 10 == 0:
                        rows.append(_row(minute, route, 5))
            rows.sort()
            writer.write(WriteSet(route_minutes=rows))
            written += len(rows)
    finally:
        engine.dispose()
    return written


def _in_process(url: str, since_ns: int, until_ns: int, rollup: bool, repeat: int) -> dict:
    engine = open_engine(url)
    spent = []
    try:
        for _ in range(repeat + 1):
            started = time.perf_counter()
            route_stats(engine, since_ns=since_ns, until_ns=until_ns, rollup=rollup)
            spent.append((time.perf_counter() - started) * 1000)
    finally:
        engine.dispose()
    warm = spent[1:]
    return {"cold_ms": round(spent[0], 1), "median_ms": round(statistics.median(warm), 1)}


def run(db_url: str, routes: int, days: int, timings, repeat: int = 10) -> dict:
    """Fills `db_url` (fresh), then times the overview; `timings(client, path, params, n)`
    is the queries benchmark's HTTP timer."""
    now = time.time_ns()
    since_ns = now - days * 86400 * 10**9
    first = since_ns // NS_PER_MINUTE  # the server's retention (7 days) leaves it in place
    started = time.perf_counter()
    rows = fill(db_url, routes, first, now // NS_PER_MINUTE + 1)
    filled_s = time.perf_counter() - started
    params = {"since": f"{since_ns / 1e9:.3f}", "until": f"{now / 1e9:.3f}"}
    with ServerProcess(db_url) as server, httpx.Client(base_url=server.http, timeout=60) as c:
        http = timings(c, "/api/routes", params, repeat)
        answer = c.get("/api/routes", params=params).json()
    minutes_only = _in_process(db_url, since_ns, now, False, max(3, repeat // 3))
    rollup = _in_process(db_url, since_ns, now, True, repeat)
    return {
        "routes": routes,
        "days": days,
        "route_minute_rows": rows,
        "fill_seconds": round(filled_s, 1),
        "routes_answered": len(answer["routes"]),
        "http": http,
        "in_process": {"minutes_only": minutes_only, "rollup": rollup},
        "rollup_speedup": round(minutes_only["median_ms"] / max(rollup["median_ms"], 0.01), 1),
    }


def report(f: dict) -> None:
    http = f["http"]
    verdict = "meets" if http["median_ms"] < GOAL_MS else "ABOVE"
    inner = f["in_process"]
    print(
        f"routes overview: {f['routes_answered']} routes over {f['days']} d "
        f"({f['route_minute_rows']:,} route-minute rows, written in {f['fill_seconds']} s): "
        f"GET /api/routes median {http['median_ms']} ms (cold {http['cold_ms']}, "
        f"n={http['repeat']}), {verdict} < {GOAL_MS:.0f} ms; in process: minutes only "
        f"{inner['minutes_only']['median_ms']} ms, with route_rollups "
        f"{inner['rollup']['median_ms']} ms ({f['rollup_speedup']}x)"
    )
