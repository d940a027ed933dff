"""Every benchmark still runs (issue 17): each `./dev bench` command once at a tiny size, so
none can rot unnoticed. The figures are not checked here (no timed assertion in a test);
the benchmarks themselves report them, in docs/benchmarks.md's terms."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "ingest": ["--seconds", "2", "--batches", "5", "--streams", "1"],
    "stages": ["--batches", "2"],
    "memory": ["--seconds", "2", "--batches", "5", "--warmup", "1", "--interval", "0.5"],
    "queries": ["--requests", "200"],
    "host-calls": ["--rounds", "1", "--calls", "2000"],
    "host-startup": ["--functions", "50", "--rounds", "1"],
    "ui-render": ["--rounds", "1"],
}


@pytest.mark.parametrize("benchmark", list(TINY))
def test_benchmark_runs_at_a_tiny_size(benchmark: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", benchmark, *TINY[benchmark]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "benchmarks/results/" in done.stdout, done.stdout[-2000:]
