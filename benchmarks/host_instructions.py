"""What profiling costs a real web app, counted in instructions rather than CPU seconds.

`host_app` measures CPU time per request, but this VM's speed jumps by up to ~1.8x within
seconds, so two windows of the same unprofiled worker differ by ±15% and a cost of 1-3%
cannot be told from free. Here each setup's app server (the gunicorn sync worker or the
uvicorn process of `host_app`) runs under valgrind's callgrind, which counts the
instructions every thread of the worker executes: the same count for the same work,
whatever else the machine does (so two lives run side by side, one per core).

Each setup lives twice, identically but for the number of requests it serves: `warmup`
requests of the route mix, one at a time, or `warmup + requests`. Callgrind writes the
worker's total when it exits; the difference between the two lives, divided by
`requests`, is what one request costs, with start-up, warm-up and exit cancelled out. An
A/A setup (no profiler, measured the same way) shows how exact that is. The host's setups
run with `--code-cache off`, so both lives rewrite the same code at start-up.

Instructions are not cycles (cache misses and branch mispredictions are not counted), and
only deterministic profilers can be compared: a time-based sampler (pyinstrument, py-spy)
would take ~50x more samples per request in a process slowed down by valgrind. Valgrind
slows the host's transport thread the same way, so it ships smaller batches than at full
speed: its per-batch costs weigh more here than they would.

The default sampling rate (10 requests/s per process) is a time rate too, so its row is
composed: `f` = 10 / the plain worker's request rate under wrk at full speed (measured in
the same run, as `host_app` loads it), and the default's instructions per request are
`(1 - f)` x those of a request the sampler saw and let pass (`unsampled`: the sampler's
whole decision runs, the gate stays closed) + `f` x those of a recorded request (`all`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks import host_app, overhead, results
from benchmarks.host_app import Launch, service
from benchmarks.overhead import NONE, Setup
from benchmarks.server import CLIENT_CORE, SERVER_CORE, ServerProcess

UNSAMPLED = "host, default decision, not sampled"
DEFAULT_COMPOSED = "host, default (10/s), composed"
NO_CACHE = ("--code-cache", "off")
SETUPS = [
    Setup("none", NONE),
    Setup("aa", "none (A/A)"),
    Setup("off", host_app.OFF, host=("--sample-rate", "0", *NO_CACHE)),
    # a rate that never samples, with every route already seen (and sampled) at warm-up
    Setup(
        "unsampled",
        UNSAMPLED,
        host=("--sample-rate", "0.000001", "--route-interval", "86400", *NO_CACHE),
    ),
    Setup("all", host_app.EVERY, host=("--sample-rate", host_app.SAMPLE_ALL, *NO_CACHE)),
    Setup("cprofile", "cProfile", peer="cprofile"),
    Setup("yappi", "yappi", peer="yappi"),
]
# the route mix of shop_mix.lua, one request at a time
CHECKOUT = {"customer_id": 1, "items": [{"product_id": 1, "quantity": 1}]}
MIX = (
    ("GET", "/products/1", None),
    ("GET", "/orders/1", None),
    ("GET", "/products?page=1", None),
    ("POST", "/checkout", CHECKOUT),
)
CORES = (SERVER_CORE, CLIENT_CORE)  # one life on each, side by side
REQUEST_TIMEOUT = 300.0  # s; a first request under callgrind imports and compiles a lot
SHIP_TIMEOUT = 300.0  # s for the host to ship and the server to store what a life recorded
QUIET = 2.0  # s the server's stored count must stay unchanged before the life ends
RATE_WINDOWS = 3  # wrk windows of the plain worker at full speed, for the sampled share


def _callgrind(out: Path, core: int) -> Launch:
    return Launch(
        core=core,
        wrapper=(
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
            "--dump-instr=no", "--dump-line=no", "--vgdb=no",
        ),
        start_timeout=900.0,
        stop_timeout=600.0,
        worker_timeout=3600,
    )  # fmt: skip


def send(port: int, count: int) -> None:
    """`count` requests of the mix, in turn, each answered before the next is sent."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT) as client:
        for number in range(count):
            method, path, body = MIX[number % len(MIX)]
            client.request(method, path, json=body).raise_for_status()


def _stored(profiler: ServerProcess, setup: Setup) -> float:
    one = host_app.host_counts(profiler).get(service(setup), {})
    return one.get("profiler_requests_stored_total", 0.0)


def _settle(profiler: ServerProcess, setup: Setup, at_least: float) -> float:
    """Waits until the server holds at least `at_least` requests of the setup and the count
    has stayed the same for `QUIET` seconds; returns it."""
    deadline = time.monotonic() + SHIP_TIMEOUT
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        now = _stored(profiler, setup)
        if now != last:
            last, since = now, time.monotonic()
        elif now >= at_least and time.monotonic() - since >= QUIET:
            return now
        time.sleep(0.5)
    raise RuntimeError(f"{setup.name}: {last} requests stored, expected {at_least}")


def _instructions(out: Path, pid: int) -> int:
    """The total callgrind wrote for process `pid` when it exited."""
    for line in (out / f"cg.{pid}").read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"callgrind wrote no total for {pid} in {out}")


def life(
    app: str, setup: Setup, count: int, profiler: ServerProcess, tmp: Path, shop: Path, core: int
) -> dict:
    """One life of the worker under callgrind that serves `count` requests of the mix."""
    one_life = dataclasses.replace(setup, name=f"{setup.name} ({count})")  # its own service
    out = tmp / f"callgrind-{setup.key}-{count}"
    out.mkdir()
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every life
    started = time.monotonic()
    process = host_app.start_app(
        app,
        one_life,
        profiler.target,
        env,
        tmp,
        shop,
        _callgrind(out, core),
        lambda served: send(served.port, count),
    )
    try:
        recorded = 0.0
        if setup.host is not None:
            expected = count if setup.key == "all" else 0
            recorded = _settle(profiler, one_life, expected)
    finally:
        process.stop()
    figure = {
        "instructions": _instructions(out, process.worker),
        "recorded": recorded,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"  {setup.name}, {count} requests: {figure}")
    return figure


def _full_speed_rate(app: str, profiler: ServerProcess, tmp: Path, shop: Path) -> float:
    """The plain worker's requests per second under wrk (as `host_app` loads it), median
    of `RATE_WINDOWS` windows."""
    plain = host_app.start_app(app, SETUPS[0], profiler.target, dict(os.environ), tmp, shop)
    try:
        return statistics.median(plain.window(2, 1)[1] for _ in range(RATE_WINDOWS))
    finally:
        plain.stop()


def _per_request(lives: dict, setup: Setup, counts: tuple[int, int]) -> dict:
    short, long = lives[setup.key, counts[0]], lives[setup.key, counts[1]]
    figure = {
        "per_request": (long["instructions"] - short["instructions"]) / (counts[1] - counts[0]),
        "lives": [short, long],
    }
    if setup.host is not None:
        figure["recorded_per_request"] = (long["recorded"] - short["recorded"]) / (
            counts[1] - counts[0]
        )
    return figure


def run(app: str, warmup: int, requests: int, keys: str = "") -> dict:
    started_load = os.getloadavg()
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    setups = overhead.choose(SETUPS, keys)
    composes = {UNSAMPLED, host_app.EVERY} <= {s.name for s in setups}
    counts = (warmup, warmup + requests)
    with tempfile.TemporaryDirectory(prefix="profiler-bench-instr-", dir=scratch) as name:
        tmp = Path(name)
        shop = host_app.shop_database(tmp, dict(os.environ))
        with ServerProcess(f"sqlite:///{tmp}/profiles.db", core=CLIENT_CORE) as profiler:
            rate = _full_speed_rate(app, profiler, tmp, shop) if composes else 0.0
            plan = [(setup, count) for setup in setups for count in counts]
            print(f"{app}: {len(plan)} lives under callgrind, {len(CORES)} at a time")
            with ThreadPoolExecutor(len(CORES)) as pool:
                futures = {
                    (setup.key, count): pool.submit(
                        life, app, setup, count, profiler, tmp, shop, CORES[number % len(CORES)]
                    )
                    for number, (setup, count) in enumerate(plan)
                }
                lives = {key: future.result() for key, future in futures.items()}
    figures = {setup.name: _per_request(lives, setup, counts) for setup in setups}
    base = figures[NONE]["per_request"]
    if composes:
        share = min(1.0, host_app.DEFAULT_RATE / rate)
        figures[DEFAULT_COMPOSED] = {
            "per_request": (1 - share) * figures[UNSAMPLED]["per_request"]
            + share * figures[host_app.EVERY]["per_request"],
            "sampled_share": round(share, 5),
            "full_speed_requests_per_second": round(rate, 1),
        }
    for figure in figures.values():
        figure["ratio"] = round(base / figure["per_request"], 4)
    rows = [
        (setup, f"{one['per_request']:,.0f}", f"{one['ratio']:.4f}")
        for setup, one in figures.items()
    ]
    print(results.table(("setup", "instructions/request", "ratio to none"), rows))
    if composes:
        print(f"sampled share at the default rate: {figures[DEFAULT_COMPOSED]['sampled_share']}")
    data = {
        "app": app,
        "warmup_requests": warmup,
        "requests": requests,
        "load_average_at_start": started_load,
        "setups": figures,
    }
    path = results.save(f"host-instructions-{app}", data)
    print(f"results: {path}")
    return data
