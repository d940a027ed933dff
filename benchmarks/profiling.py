"""Reading a server profile: where CPU went, with waits (epoll, locks, sleeps) left out, since
cProfile counts a thread's idle wait as that function's own time."""

from __future__ import annotations

import pstats
from pathlib import Path

from benchmarks import results

WAITS = ("select.epoll", "_thread.lock", "time.sleep", "threading.Condition", "'wait'")


OURS = ("/profiler_server/", "/profiler_core/")


def top(path: Path, key: str, count: int) -> list[dict]:
    """The `count` functions with the most `key` time ("tottime" or "cumtime"). By cumtime
    only our own code is listed, without the thread entry points (their cumulative time
    includes the idle waits, so it exceeds all busy time)."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    busy = {k: v for k, v in stats.items() if not any(w in k[2] for w in WAITS)}
    total = sum(v[2] for v in busy.values()) or 1.0
    column = {"tottime": 2, "cumtime": 3}[key]
    if key == "cumtime":
        busy = {k: v for k, v in busy.items() if any(o in k[0] for o in OURS) and v[3] < total}
    rows = sorted(busy.items(), key=lambda item: -item[1][column])[:count]
    return [
        {
            "function": f"{Path(file).name}:{line}({func})",
            "ncalls": nc,
            "tottime_s": round(tt, 3),
            "cumtime_s": round(ct, 3),
            "share": round((tt if key == "tottime" else ct) / total, 3),
        }
        for (file, line, func), (_, nc, tt, ct, _) in rows
    ]


def table(rows: list[dict], key: str) -> str:
    """`share` is of the profiled CPU time (all functions' own time, waits excluded)."""
    return results.table(
        ("tottime s", "cumtime s", f"{key} share", "ncalls", "function"),
        [
            (r["tottime_s"], r["cumtime_s"], f"{r['share']:.1%}", r["ncalls"], r["function"])
            for r in rows
        ],
    )


def print_profile(figures: dict) -> None:
    """The server profile a run kept in `figures` (`profile_top`, `profile_top_cumulative`),
    if it ran under cProfile."""
    if figures.get("profile_top"):
        print("\nserver profile (main + ingest threads), by own time:")
        print(table(figures["profile_top"], "tottime"))
        print("\nby cumulative time:")
        print(table(figures["profile_top_cumulative"], "cumtime"))
