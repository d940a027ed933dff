"""Memory under sustained ingest: the server's RSS sampled while sessions come and go at
full speed; it should be flat after warm-up (nothing kept per request or per session)."""

from __future__ import annotations

import time

from benchmarks import results
from benchmarks.ingest import build
from benchmarks.load import Load
from benchmarks.server import ServerProcess, fresh_database

FLAT_GROWTH = 0.10  # peak RSS of the last third within 10% of the first third's: flat
MB = 1024 * 1024


def _sample(server: ServerProcess, started: float, events: int) -> dict:
    return {
        "t": round(time.monotonic() - started, 1),
        "rss_mb": round(server.rss_bytes() / MB, 1),
        "events": events,
    }


def run(
    db: str,
    seconds: float,
    streams: int,
    window: int,
    batches: int,
    warmup: float,
    interval: float,
) -> dict:
    feed = build(batches)
    samples: list[dict] = []
    with fresh_database(db) as url, ServerProcess(url) as server:
        started = time.monotonic()
        samples.append(_sample(server, started, 0))
        load = Load(server.target, [feed] * streams, window, seconds)
        load.start()
        next_sample = started + interval
        while load.running() and time.monotonic() < started + seconds + 120:
            time.sleep(max(0.0, min(next_sample - time.monotonic(), 0.5)))
            if time.monotonic() >= next_sample:
                next_sample += interval
                samples.append(_sample(server, started, load.acked_events()))
        outcome = load.join()
        samples.append(_sample(server, started, outcome.events))
    # RSS swings with each storage transaction (its trees are built, stored, freed), so
    # growth is judged on the peaks of the first and last thirds after warm-up.
    after = [s for s in samples if s["t"] >= warmup] or samples[-1:]
    third = max(1, len(after) // 3)
    first_peak = max(s["rss_mb"] for s in after[:third])
    last_peak = max(s["rss_mb"] for s in after[-third:])
    figures = {
        "db": db,
        "seconds": round(outcome.seconds, 1),
        "warmup_s": warmup,
        "events": outcome.events,
        "events_per_second": round(outcome.events_per_second),
        "sessions": len(outcome.sessions),
        "rss_mb_idle": samples[0]["rss_mb"],
        "rss_mb_start": after[0]["rss_mb"],
        "rss_mb_end": samples[-1]["rss_mb"],
        "rss_mb_max": max(s["rss_mb"] for s in samples),
        "rss_mb_peak_first_third": first_peak,
        "rss_mb_peak_last_third": last_peak,
        "growth": round(last_peak / first_peak - 1, 3),
        "flat": last_peak <= first_peak * (1 + FLAT_GROWTH),
        "samples": samples,
        "errors": outcome.errors,
        "server_exit_code": server.returncode,
    }
    report(figures)
    print(f"saved {results.save(f'memory-{db}', figures)}")
    return figures


def report(f: dict) -> None:
    print()
    print(
        results.table(
            ("memory", "value"),
            [
                ("database / sending s", f"{f['db']} / {f['seconds']}"),
                ("events (sessions)", f"{f['events']:,} ({f['sessions']})"),
                ("events/s acked", f"{f['events_per_second']:,}"),
                ("RSS idle", f"{f['rss_mb_idle']} MB"),
                (f"RSS after {f['warmup_s']:.0f} s warm-up", f"{f['rss_mb_start']} MB"),
                ("RSS at end", f"{f['rss_mb_end']} MB"),
                ("RSS max", f"{f['rss_mb_max']} MB"),
                (
                    "peak RSS: first / last third",
                    f"{f['rss_mb_peak_first_third']} / {f['rss_mb_peak_last_third']} MB",
                ),
                (
                    "growth of the peaks",
                    f"{f['growth']:+.1%} ("
                    f"{'flat' if f['flat'] else 'NOT flat'}, limit {FLAT_GROWTH:.0%})",
                ),
                ("errors", len(f["errors"])),
            ],
        )
    )
    for error in f["errors"]:
        print(f"error: {error}")
