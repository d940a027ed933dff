"""Every benchmark still runs (issue 17): each `./dev bench` command once at a tiny size, so
none can rot unnoticed, writing its results to a temporary directory. The figures are not
checked here (no timed assertion in a test); only that each run finished and wrote the
rows and keys the overhead table (`./dev bench table`) reads."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import call_instructions, host_app, table

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "ingest": ["--seconds", "2", "--batches", "5", "--streams", "1"],
    "stages": ["--batches", "2"],
    "depth": ["--rounds", "1", "--events", "2000", "--depths", "200", "--widths", "1000"],
    "memory": ["--seconds", "2", "--batches", "5", "--warmup", "1", "--interval", "0.5"],
    "queries": ["--requests", "200", "--routes", "3", "--days", "1"],
    "host-calls": ["--rounds", "1", "--calls", "2000"],
    "host-unsampled": ["--rounds", "1", "--requests", "200"],
    "host-recorded": [
        "--app",
        "fast-async",
        "--every",
        "2",
        "--requests",
        "4",
        "--setups",
        "none,off,kept,in-flight",
    ],
    "host-calls-versions": ["--rounds", "1", "--calls", "2000", "--instruction-calls", "0"],
    "host-startup": ["--functions", "50", "--rounds", "1"],
    "ui-render": ["--rounds", "1", "--huge-tops", "20"],
}
# one app each (an async one under uvicorn, a sync one under gunicorn): every app takes the
# same path through the benchmark; under callgrind a host life takes ~40 s to start on a
# quiet machine, so the instruction run has one host setup (2 workers, side by side)
HOST_APP = [
    "host-app", "--app", "fast-async", "--rounds", "1", "--seconds", "2", "--warmup", "1",
    "--latency-rounds", "1", "--latency-seconds", "1", "--setups", "aa,off,default",
]  # fmt: skip
HOST_APP_VERSIONS = [
    "host-app-versions", "--apps", "fast-sync", "--rounds", "1", "--seconds", "1",
    "--warmup", "1", "--latency-rounds", "0", "--setups", "off",
]  # fmt: skip
HOST_INSTRUCTIONS = [
    "host-instructions", "--app", "fast-sync", "--warmup", "3", "--requests", "5",
    "--sparse", "4", "--setups", "off",
]  # fmt: skip


def bench(args: list[str], results: Path, timeout: float = 600) -> str:
    """Runs `python -m benchmarks ARGS` with its results in `results`; its stdout. On a
    timeout its whole process group goes (app servers, valgrind, the profiling server)."""
    with subprocess.Popen(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env={**os.environ, "BENCHMARK_RESULTS": str(results)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as done:
        try:
            out, err = done.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(done.pid, signal.SIGKILL)
            raise
    assert done.returncode == 0, out[-3000:] + err[-3000:]
    return out


def only_result(results: Path, name: str) -> dict:
    found = list(results.glob(f"{name}-2*.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


@pytest.mark.parametrize("benchmark", list(TINY))
def test_benchmark_runs_at_a_tiny_size(benchmark: str, tmp_path: Path) -> None:
    out = bench([benchmark, *TINY[benchmark]], tmp_path)
    assert str(tmp_path) in out, out[-2000:]
    assert list(tmp_path.glob(f"{benchmark}-*")), out[-2000:]


def test_stages_runs_the_fleet_shape(tmp_path: Path) -> None:
    shape = ["--shape", "fleet", "--sessions", "7", "--batches", "3", "--group", "4"]
    bench(["stages", *shape, "--instructions"], tmp_path)
    result = only_result(tmp_path, "stages-fleet-sqlite")
    assert (result["sessions"], result["batches"], result["events"]) == (7, 21, 21 * 20)
    assert result["cpu_ms_per_batch"] > 0
    assert result["instructions_per_batch"] > 0


def test_fleet_sets_the_server_against_the_grpc_floor(tmp_path: Path) -> None:
    bench(["fleet", "--streams", "20", "--seconds", "3", "--warmup", "1", "--rate", "0"], tmp_path)
    result = only_result(tmp_path, "fleet-sqlite")
    for run in (result, result["floor"]):
        assert run["acked_batches"] > 0
        assert run["steady_acked_batches"] > 0  # no stream ran out of batches in the warmup
        assert (run["unacked_batches"], run["rejected_batches"], run["error_count"]) == (0, 0, 0)
        assert run["server_cpu_ms_per_batch"] > 0
    assert result["of_floor"]["batches_per_second"] > 0
    assert result["server_exit_code"] == 0
    assert {t["name"] for t in result["server_threads_ms_per_batch"]} >= {"profiler-ingest"}


def test_fleet_without_the_floor_reports_the_server_alone(tmp_path: Path) -> None:
    fleet = ["fleet", "--streams", "5", "--seconds", "2", "--warmup", "1", "--rate", "0"]
    out = bench([*fleet, "--no-floor"], tmp_path)
    result = only_result(tmp_path, "fleet-sqlite")
    assert "floor" not in result and "of_floor" not in result
    assert result["acked_batches"] > 0
    assert "gRPC floor" not in out


def test_fleet_splits_the_hosts_between_servers_on_one_postgresql(tmp_path: Path) -> None:
    fleet = ["fleet", "--db", "postgresql", "--streams", "120", "--seconds", "2", "--rate", "0"]
    bench([*fleet, "--warmup", "1", "--servers", "2", "--no-floor"], tmp_path)
    result = only_result(tmp_path, "fleet-postgresql")
    assert result["servers"] == 2
    assert result["acked_batches"] > 0
    assert (result["unacked_batches"], result["error_count"]) == (0, 0)
    # three channels of 50 streams: both servers took some, and both are in the accounts
    ingest = {t["name"] for t in result["server_threads_ms_per_batch"] if "ingest" in t["name"]}
    assert ingest == {"1: profiler-ingest", "2: profiler-ingest"}


@pytest.fixture(scope="module")
def overhead_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny host-app, host-app-versions and host-instructions run each, in one results
    directory."""
    results = tmp_path_factory.mktemp("overhead-results")
    bench(HOST_APP, results)
    bench(HOST_APP_VERSIONS, results)
    bench(HOST_INSTRUCTIONS, results, timeout=1200)
    return results


def test_host_app_writes_cpu_threads_and_p99_per_setup(overhead_results: Path) -> None:
    result = only_result(overhead_results, "host-app-fast-async")
    assert result["server_modules"] == ["uvloop", "httptools"]
    setups = result["setups"]
    assert set(setups) == {"none", "none (A/A)", host_app.OFF, host_app.DEFAULT}
    for figure in setups.values():
        assert figure["cpu_ratio"]["n"] == 1
        assert figure["p99_ratio"]["n"] == 1
        assert figure["thread_cpu_ms_per_request"]["main"] > 0
        assert figure["cpu_ratio_at_latency_rate"]["n"] == 1
        user, system = figure["user_system_us_per_request"]
        assert user > 0 and system >= 0
    assert setups[host_app.DEFAULT]["sampled_requests_stored"] > 0
    assert setups[host_app.OFF]["sampled_requests_stored"] == 0


def test_host_app_paired_sets_each_setup_beside_none(tmp_path: Path) -> None:
    bench([*HOST_APP[:-1], "aa,off", "--rounds", "2", "--paired"], tmp_path)
    result = only_result(tmp_path, "host-app-fast-async")
    assert result["paired"] is True
    samples, setups = result["samples"], result["setups"]
    for name in ("none (A/A)", host_app.OFF):
        # each window has the none window measured at the same time as its baseline
        assert len(samples[name]["cpu"]) == len(samples[name]["base"]["cpu"]) == 2
        assert setups[name]["cpu_ratio"]["n"] == 2
        assert setups[name]["p99_ratio"]["n"] == 1
    assert len(samples["none"]["cpu"]) == 4  # none's windows of both pairs of both rounds
    assert result["latency_rate"] > 0


def test_host_instructions_counts_each_setup(overhead_results: Path) -> None:
    result = only_result(overhead_results, "host-instructions-fast-sync")
    setups = result["setups"]
    assert set(setups) == {"none", host_app.OFF}
    assert setups["none"]["ratio"] == 1.0
    for figure in setups.values():
        assert figure["per_request"] > 0
        assert figure["recorded_per_request"] == 0.0
        assert set(figure["phases"]) == {"long", "sparse"}
        assert figure["phases"]["sparse"]["served"] == 1
        assert figure["phases"]["long"]["served"] == 5
    # where the host's instructions go, by function, against none
    top = result["by_function"][host_app.OFF]
    assert top and all(":" in name and isinstance(n, float) for name, n in top)


def test_table_sets_cpu_beside_instructions(overhead_results: Path) -> None:
    out = bench(["table"], overhead_results)
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]) for line in out.splitlines()}
    assert {("fast-async", "none (A/A)"), ("fast-async", "default (10/s)")} <= rows
    assert ("fast-sync", "sampling off") in rows
    assert "CPU ratio at half rate" in out and "user / system" in out
    assert "./dev bench host-app --app fast-async" in out
    assert "./dev bench host-instructions --app fast-sync" in out
    brief = bench(["table", "--brief"], overhead_results)
    assert "| fast-async |" in brief
    assert "| fast-sync |" in brief
    # the versions' table: a column per supported CPython, each from its own run
    header = next(line for line in brief.splitlines() if "CPU 3.11" in line)
    assert "CPU 3.12: full / half rate" in header and "CPU 3.13" in header
    off = next(line for line in brief.splitlines() if line.startswith("| fast-sync | sampling off"))
    cells = [cell.strip() for cell in off.split("|")[3:-1]]
    assert len(cells) == 6 and all(re.fullmatch(r"\d\.\d{3} / -", c) for c in cells[:3]), off
    # instructions: counted on this interpreter only, here
    this = ["3.11", "3.12", "3.13"].index(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert re.fullmatch(r"\d\.\d{4}", cells[3 + this]), off
    assert [c for n, c in enumerate(cells[3:]) if n != this] == ["-", "-"], off
    assert "./dev bench host-app-versions --apps fast-sync" in out


def test_versions_table_takes_the_newest_run_of_each_app(tmp_path: Path) -> None:
    """Apps are rerun on their own: each keeps its newest run's row, whichever file."""

    def save(name: str, apps: dict[str, float]) -> None:
        result = {
            "apps": {
                app: {v: {"setups": {host_app.OFF: {"cpu_ratio": ratio}}} for v in ("3.11", "3.12")}
                for app, ratio in apps.items()
            },
            "command": ["benchmarks", "host-app-versions", "--apps", ",".join(apps)],
        }
        (tmp_path / f"host-app-versions-{name}.json").write_text(json.dumps(result))

    save("20260101-000000", {"flask": 0.5, "starlette": 0.6})
    save("20260102-000000", {"flask": 0.7})
    # an instruction count made with another version's venv, its command says so
    other = "3.12" if table.THIS_PYTHON != "3.12" else "3.11"
    counted = {
        "machine": {"python": f"{other}.1"},
        "setups": {host_app.OFF: {"ratio": 0.98}},
        "command": ["benchmarks", "host-instructions", "--app", "flask"],
    }
    (tmp_path / "host-instructions-flask-20260103-000000.json").write_text(json.dumps(counted))
    out = table.versions_table(tmp_path)
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if "sampling off" in line}
    assert "0.700 / -" in rows["flask"] and "0.500" not in rows["flask"]
    assert "0.600 / -" in rows["starlette"]
    assert "| 0.9800 |" in rows["flask"] and "0.9800" not in rows["starlette"]
    assert "--apps flask,starlette" in out and "--apps flask\n" in out + "\n"
    venv = f".venv{other.replace('.', '')}/bin/python -m benchmarks host-instructions --app flask"
    assert venv in out


@pytest.mark.parametrize("mode", call_instructions.MODES)
def test_the_calls_callgrind_counts_run(mode: str) -> None:
    """What `host-calls-versions` counts under callgrind, here without it (the counts take
    minutes per version)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.call_instructions", mode, "100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
