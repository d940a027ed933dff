"""Ingest throughput: events per second acked end to end (decode, assembly, storage, ack)
by a server on one core, and where the server's time goes while it does that."""

from __future__ import annotations

import resource
import time

from benchmarks import profiling, results
from benchmarks.load import Feed, Load, build_feed
from benchmarks.server import (
    ServerProcess,
    backends_cpu,
    cpu_used,
    fresh_database,
    thread_shares,
)
from profiler_server.loadgen import CallShape

SHAPE = CallShape(calls=200, depth=10, functions=40)  # 400 events per request
REQUESTS_PER_BATCH = 50
GOALS = {"sqlite": 500_000, "postgresql": 300_000}
PROFILE_TOP = 25
PROFILE_TOP_CUMULATIVE = 15


def build(batches: int) -> Feed:
    started = time.perf_counter()
    feed = build_feed(SHAPE, REQUESTS_PER_BATCH, batches)
    print(
        f"built {batches} batches x {REQUESTS_PER_BATCH} requests x {feed.events[0]} events "
        f"({sum(map(len, feed.batches)) / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s"
    )
    return feed


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(
    db: str,
    seconds: float,
    streams: int,
    window: int,
    batches: int,
    profile: bool = False,
) -> dict:
    """Streams the feed from `streams` sessions for `seconds`; returns the figures."""
    feed = build(batches)
    name = f"ingest-{db}" + ("-profiled" if profile else "")
    json_path = results.path_for(name, ".json")
    profile_path = json_path.with_suffix(".prof") if profile else None
    with fresh_database(db) as url, ServerProcess(url, profile_to=profile_path) as server:
        metrics0, threads0 = server.metrics(), server.thread_cpu()
        cpu0, pg0, client0 = server.cpu_seconds(), backends_cpu(url), _client_cpu()
        load = Load(server.target, [feed] * streams, window, seconds)
        load.start()
        outcome = load.join()
        wall = outcome.seconds
        cpu1, pg1, client1 = server.cpu_seconds(), backends_cpu(url), _client_cpu()
        metrics1, threads1 = server.metrics(), server.thread_cpu()
    delta = {k: v - metrics0.get(k, 0.0) for k, v in metrics1.items()}
    writes = delta.get("profiler_storage_write_seconds_count", 0.0)
    figures = {
        "db": db,
        "profiled": profile,
        "streams": streams,
        "window": window,
        "events": outcome.events,
        "batches": outcome.batches,
        "requests": outcome.batches * REQUESTS_PER_BATCH,
        "sessions": len(outcome.sessions),
        "seconds": round(wall, 2),
        "events_per_second": round(outcome.events_per_second),
        "goal_events_per_second": GOALS[db],
        "server_cpu_share": round((cpu1 - cpu0) / wall, 3),
        "server_threads": thread_shares(threads0, threads1, wall),
        "client_cpu_share": round((client1 - client0) / wall, 3),
        "postgres_cpu_share": round(cpu_used(pg0, pg1) / wall, 3),
        "storage_write_share": round(
            delta.get("profiler_storage_write_seconds_sum", 0.0) / wall, 3
        ),
        "storage_transactions": int(writes),
        "batches_per_transaction": round(outcome.batches / writes, 1) if writes else None,
        "mean_ack_lag_s": round(
            delta.get("profiler_ingest_ack_lag_seconds_sum", 0.0)
            / max(delta.get("profiler_ingest_ack_lag_seconds_count", 0.0), 1.0),
            4,
        ),
        "problems": {k: v for k, v in delta.items() if "rejected" in k and v},
        "rejected_batches": outcome.rejected,
        "errors": outcome.errors,
        "server_exit_code": server.returncode,
    }
    if profile_path is not None:
        figures["profile_file"] = str(profile_path)
        figures["profile_top"] = profiling.top(profile_path, "tottime", PROFILE_TOP)
        figures["profile_top_cumulative"] = profiling.top(
            profile_path, "cumtime", PROFILE_TOP_CUMULATIVE
        )
    report(figures)
    print(f"saved {results.save(name, figures, json_path)}")
    return figures


def report(f: dict) -> None:
    verdict = "meets" if f["events_per_second"] >= f["goal_events_per_second"] else "BELOW"
    print()
    print(
        results.table(
            ("ingest", "value"),
            [
                ("database", f["db"] + (" (under cProfile)" if f["profiled"] else "")),
                (
                    "events/s acked",
                    f"{f['events_per_second']:,} ({verdict} goal {f['goal_events_per_second']:,})",
                ),
                (
                    "events / requests / batches",
                    f"{f['events']:,} / {f['requests']:,} / {f['batches']:,}",
                ),
                ("wall s / streams x window", f"{f['seconds']} / {f['streams']} x {f['window']}"),
                ("server CPU (of one core)", f"{f['server_cpu_share']:.0%}"),
                ("client CPU (of one core)", f"{f['client_cpu_share']:.0%}"),
                ("PostgreSQL backends CPU", f"{f['postgres_cpu_share']:.0%}"),
                ("in storage transactions", f"{f['storage_write_share']:.0%} of wall"),
                (
                    "transactions (batches each)",
                    f"{f['storage_transactions']} ({f['batches_per_transaction']})",
                ),
                ("mean ack lag", f"{f['mean_ack_lag_s'] * 1000:.0f} ms"),
                (
                    "problems / rejected / errors",
                    f"{f['problems'] or 0} / {f['rejected_batches']} / {len(f['errors'])}",
                ),
            ],
        )
    )
    print()
    print(
        results.table(
            ("server thread", "tid", "CPU s"),
            [(t["name"], t["tid"], t["cpu_s"]) for t in f["server_threads"]],
        )
    )
    for error in f["errors"]:
        print(f"error: {error}")
    profiling.print_profile(f)
