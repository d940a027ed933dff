"""Read latency through the HTTP API: one stored request of 10,000 calls, and the folded
flame graph over 100,000 stored requests spread over a day (so over ~1,440 minute buckets
and several routes, as a real day of traffic would be); then, on a database of its own, the
routes overview over 7 days of per-minute counts of 500 routes (benchmarks.routes_overview)."""

from __future__ import annotations

import statistics
import time

import httpx
from sqlalchemy import create_engine, func, select

from benchmarks import ingest, results, routes_overview
from benchmarks.load import ROUTES, Feed, Load, build_feed, serialize
from benchmarks.server import ServerProcess, fresh_database
from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import CallShape, synthetic_run
from profiler_server.storage import schema

BIG = CallShape(calls=10_000, depth=30, functions=200)
SMALL = CallShape(calls=20, depth=8, functions=60)
FUNCTION_OFFSETS = 50  # small requests start at different functions: more distinct stacks
REQUESTS_PER_BATCH = 500
STREAMS = 4
SPAN_NS = 24 * 3600 * 10**9
HOST_CLOCK_NS = 100 * 86400 * 10**9  # synthetic host monotonic clock at Hello
INGEST_CAP_S = 900.0
GOALS_MS = {"request": 50.0, "request_under_ingest": 50.0, "flamegraph": 1000.0}
BACKGROUND_S = 10.0  # ingest running while the big request is read again
BACKGROUND_RAMP_S = 2.0


def spread_feeds(total: int, parts: int) -> list[Feed]:
    """`total` small requests over the last 24 h, split into `parts` sessions."""
    clock = (time.time_ns(), HOST_CLOCK_NS)
    step = SPAN_NS // total
    feeds = []
    for part in range(parts):
        numbers = range(part * total // parts, (part + 1) * total // parts)
        batches, events = [], []
        for seq, offset in enumerate(range(0, len(numbers), REQUESTS_PER_BATCH), 1):
            builder = BatchBuilder()
            if seq == 1:
                for fid in range(1, FUNCTION_OFFSETS + SMALL.functions + 1):
                    builder.function(fid, f"app.module{fid % 5}", f"func_{fid}", "app.py", fid)
            for g in numbers[offset : offset + REQUESTS_PER_BATCH]:
                start = HOST_CLOCK_NS - SPAN_NS + g * step
                kinds, functions, calls, times, end = synthetic_run(
                    SMALL, 1 + g % FUNCTION_OFFSETS, start, g
                )
                builder.start(g + 1, ROUTES[g % len(ROUTES)], "GET", start)
                builder.run(g + 1, 0, kinds, functions, calls, times)
                builder.end(g + 1, end, 200)
            raw, count = serialize(builder, seq)
            batches.append(raw)
            events.append(count)
        feeds.append(Feed(batches, events, clock))
    return feeds


def _timings(client: httpx.Client, path: str, params: dict, repeat: int) -> dict:
    """Cold (first) call, then the median/min/max of `repeat` more, in ms, body included."""
    spent = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        response = client.get(path, params=params)
        response.raise_for_status()
        spent.append((time.perf_counter() - started) * 1000)
    warm = spent[1:]
    return {
        "path": path,
        "params": params,
        "bytes": len(response.content),
        "cold_ms": round(spent[0], 1),
        "median_ms": round(statistics.median(warm), 1),
        "min_ms": round(min(warm), 1),
        "max_ms": round(max(warm), 1),
        "repeat": repeat,
    }


def _count_nodes(node: dict) -> int:
    count, todo = 0, [node]
    while todo:
        current = todo.pop()
        count += 1
        todo.extend(current["children"])
    return count


def _under_ingest(client: httpx.Client, target: str, path: str, repeat: int) -> dict:
    """`path` timed while the ingest benchmark's load streams at the server (it keeps the
    server's one core busy, as a loaded production server would be)."""
    feed = build_feed(ingest.SHAPE, ingest.REQUESTS_PER_BATCH, 40)
    load = Load(target, [feed] * STREAMS, window=8, seconds=BACKGROUND_S)
    load.start()
    time.sleep(BACKGROUND_RAMP_S)
    timings = _timings(client, path, {}, repeat)
    outcome = load.join()
    timings["background_events_per_second"] = round(outcome.events_per_second)
    return timings


def _ingest(target: str, feeds: list[Feed]) -> dict:
    load = Load(target, feeds, window=8, seconds=INGEST_CAP_S, repeat=False)
    load.start()
    outcome = load.join()
    expected = sum(f.total_events for f in feeds)
    if outcome.events != expected or outcome.errors:
        raise RuntimeError(f"ingest incomplete: {outcome.events}/{expected} {outcome.errors}")
    return {
        "events": outcome.events,
        "seconds": round(outcome.seconds, 1),
        "events_per_second": round(outcome.events_per_second),
        "sessions": outcome.sessions,
    }


def _table_counts(url: str) -> dict:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (schema.requests, schema.stack_nodes, schema.stack_buckets)
            }
    finally:
        engine.dispose()


def run(db: str, total: int, routes: int, days: int) -> dict:
    started = time.perf_counter()
    small = spread_feeds(total, STREAMS)
    big = build_feed(BIG, 1, 1)
    print(
        f"built {total:,} small requests and one of {BIG.calls:,} calls "
        f"in {time.perf_counter() - started:.1f} s"
    )
    with (
        fresh_database(db) as url,
        ServerProcess(url) as server,
        httpx.Client(base_url=server.http, timeout=60) as client,
    ):
        small_ingest = _ingest(server.target, small)
        big_ingest = _ingest(server.target, [big])
        big_id = f"{big_ingest['sessions'][0]}-1"
        counts = _table_counts(url)
        listed = client.get("/api/requests", params={"order": "duration", "limit": 1}).json()
        tree = client.get(f"/api/requests/{big_id}").json()
        folded = client.get("/api/flamegraph", params={"format": "folded"}).text
        figures = {
            "db": db,
            "ingest": {"small": small_ingest, "big": big_ingest},
            "stored": counts,
            "big_request": {
                "id": big_id,
                "listed_first_by_duration": listed["requests"][0]["id"] == big_id,
                "calls": tree["calls"],
                "nodes": sum(_count_nodes(lane["root"]) for lane in tree["lanes"]),
            },
            "folded_lines": folded.count("\n"),
            "timings": {
                "request": _timings(client, f"/api/requests/{big_id}", {}, 20),
                "flamegraph": _timings(client, "/api/flamegraph", {"format": "folded"}, 5),
                "list": _timings(client, "/api/requests", {"limit": 100}, 20),
                "functions": _timings(client, "/api/functions", {}, 5),
            },
        }
        figures["timings"]["request_under_ingest"] = _under_ingest(
            client, server.target, f"/api/requests/{big_id}", 20
        )
    figures["server_exit_code"] = server.returncode
    with fresh_database(db) as url:
        figures["routes_overview"] = routes_overview.run(url, routes, days, _timings)
    report(figures)
    print(f"saved {results.save(f'queries-{db}', figures)}")
    return figures


def report(f: dict) -> None:
    print()
    stored = f["stored"]
    print(
        f"stored {stored['requests']:,} requests ({stored['stack_nodes']:,} stacks, "
        f"{stored['stack_buckets']:,} stack-minute buckets) on {f['db']}; ingest of the small "
        f"ones: {f['ingest']['small']['events_per_second']:,} events/s; big request: "
        f"{f['big_request']['calls']:,} calls, {f['big_request']['nodes']:,} nodes; "
        f"folded flame graph: {f['folded_lines']:,} lines"
    )
    rows = []
    for name, t in f["timings"].items():
        goal = GOALS_MS.get(name)
        verdict = "" if goal is None else ("meets" if t["median_ms"] < goal else "ABOVE")
        rows.append(
            (
                name,
                t["path"]
                + (
                    "?" + "&".join(f"{k}={v}" for k, v in t["params"].items())
                    if t["params"]
                    else ""
                ),
                f"{t['bytes']:,}",
                t["cold_ms"],
                f"{t['median_ms']} (n={t['repeat']})",
                f"{t['min_ms']}-{t['max_ms']}",
                f"{verdict} < {goal:.0f} ms" if goal else "",
            )
        )
    print(
        results.table(("query", "path", "bytes", "cold ms", "median ms", "range ms", "goal"), rows)
    )
    background = f["timings"]["request_under_ingest"]["background_events_per_second"]
    print(f"request_under_ingest: read while the ingest load ran at {background:,} events/s")
    routes_overview.report(f["routes_overview"])
