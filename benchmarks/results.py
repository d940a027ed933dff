"""Where results go: one JSON file per run in benchmarks/results/ and a plain table on stdout."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# $BENCHMARK_RESULTS moves them (the smoke tests' tiny runs go to a temporary directory)
RESULTS = Path(os.environ.get("BENCHMARK_RESULTS") or Path(__file__).resolve().parent / "results")


def path_for(name: str, suffix: str) -> Path:
    """A fresh file name in the results directory, e.g. ingest-sqlite-20261122-101500.json."""
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"


def _code_version() -> dict:
    """The commit measured, and whether the code it measures (server, host, the apps) had
    uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
        ).stdout.strip()

    changed = git(
        "status", "--porcelain", "--", "profiler_server", "profiler_core", "profiler_host",
        "profiling_target",
    )  # fmt: skip
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_changes": bool(changed)}


def _loop_ns() -> float:
    """ns per iteration of a plain Python loop, now, on this process's core: this VM's speed
    drifts by up to 2x over minutes, so figures from different runs need this to compare."""
    started = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i
    return round((time.perf_counter() - started) * 1000, 1)


def save(name: str, data: dict, path: Path | None = None) -> Path:
    """Writes the figures with enough context (machine, Python, command) to compare runs."""
    path = path or path_for(name, ".json")
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "code": _code_version(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1_5_15m": os.getloadavg(),
            "python_loop_ns": _loop_ns(),
        },
        **data,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns; numbers are formatted by the caller."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)
