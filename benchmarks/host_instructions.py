"""What profiling costs a real web app, counted in instructions rather than CPU seconds.

`host_app` measures CPU time per request, but this VM's speed jumps by up to ~1.8x within
seconds, so two windows of the same unprofiled worker differ by ±15% and a cost of 1-3%
cannot be told from free. Here each setup's app server (the gunicorn sync worker or the
uvicorn process of `host_app`) runs under valgrind's callgrind, which counts the
instructions every thread of the worker executes: the same count for the same work,
whatever else the machine does (so two workers run side by side, one per core).

Each setup's worker lives once: a warm-up of `warmup` requests of the route mix (sent one
at a time), not counted, then two counted phases (`callgrind.Phases`, so start-up and
warm-up blur nothing): the long one serves `requests` back to back, the sparse one one
request every `SPARSE_GAP` seconds for `sparse` seconds (`SPARSE`). Each phase counts what
its requests cost plus what the worker's timers cost meanwhile (uvicorn ticks every 0.1 s,
gunicorn's worker wakes every second, the host's stream threads poll while its stream is
open; under callgrind a request takes ~50x longer, so timers would weigh ~50x their real
share). The sparse phase serves far fewer requests a second than the long one, with the
worker's timers in the same state (the host reports its counts every 5 s, so its stream
stays open in both, as it does under load; a phase that only idled would see it close),
so the two together give both the cost per request and the timers' rate per second
(`_separated`), and the timers' share is taken off. An A/A setup (no profiler, measured
the same way) shows how exact this is. The host's
setups run with `--code-cache off` (every worker rewrites the same code at start-up) and
`--flush-interval 10s` (a batch then holds about as many requests as 0.2 s does at full
speed).

The cyclic garbage collector's share (the inclusive cost of CPython's `gc_collect_main`) is
counted apart too: full collections come in lumps of ~15M instructions, and a setup that
changes the heap's size (the host imports protobuf: thousands more tracked objects)
shifts when they fall, so `ratio outside collector` is the steadier comparison.

Instructions are not cycles (cache misses and branch mispredictions are not counted), and
only deterministic profilers can be compared: a time-based sampler (pyinstrument, py-spy)
would take ~50x more samples per request in a process slowed down by valgrind.

The default sampling rate (10 requests/s per process) is a time rate too, so its row is
composed: `f` = 10 / the rate at which the plain worker fills one core (1 / its CPU per
request under wrk, measured in the same run, as `host_app` loads it), and the default's
instructions per request are `(1 - f)` x those of a request the sampler saw and let pass
while the propagation wrappers set on classes (uvloop's) are in, as they nearly always
are at that rate (`lingering`: the sampler's whole decision runs, the gate stays closed,
the wrappers the warm-up's samples put in stay in; the Python methods patched in their
code are in only while a sampled request is in flight, and out here) + `f` x those of a
recorded request (`all`); `unsampled` is that request with every patch out.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks import callgrind, host_app, overhead, results
from benchmarks.host_app import App, Launch, service
from benchmarks.overhead import NONE, Setup
from benchmarks.server import CLIENT_CORE, SERVER_CORE, ServerProcess

UNSAMPLED = "host, default decision, not sampled"
LINGERING = "host, default decision, not sampled, patches in"
DEFAULT_COMPOSED = "host, default (10/s), composed"
# every worker rewrites the same code at start-up; batches hold as many requests as at full
# speed, where 0.2 s holds ~80 (callgrind slows the worker ~50x)
FLUSH = 10  # s, the host's flush interval in these workers
HOST = ("--code-cache", "off", "--flush-interval", f"{FLUSH}s")
SETUPS = [
    Setup("none", NONE),
    Setup("aa", "none (A/A)"),
    Setup("off", host_app.OFF, host=("--sample-rate", "0", *HOST)),
    Setup("bare", host_app.BARE, host=("--sample-rate", "0", "--include", host_app.NOTHING, *HOST)),
    # a rate that never samples, with every route already seen (and sampled) at warm-up
    Setup(
        "unsampled",
        UNSAMPLED,
        host=("--sample-rate", "0.000001", "--route-interval", "86400", *HOST),
    ),
    # the same with the propagation patches kept in once the warm-up's samples put them in:
    # at the default rate they go out at most once a second, so nearly every request
    # not sampled runs with them in
    Setup(
        "lingering",
        LINGERING,
        host=("--sample-rate", "0.000001", "--route-interval", "86400", *HOST),
        patches_kept=True,
    ),
    Setup("all", host_app.EVERY, host=("--sample-rate", host_app.SAMPLE_ALL, *HOST)),
    Setup("cprofile", "cProfile", peer="cprofile"),
    Setup("cprofile-threads", "cProfile, every thread", peer="cprofile-threads"),
    Setup("yappi", "yappi", peer="yappi"),
]
CORES = (SERVER_CORE, CLIENT_CORE)  # one worker on each, side by side
REQUEST_TIMEOUT = 300.0  # s; a first request under callgrind imports and compiles a lot
SHIP_TIMEOUT = 300.0  # s for the host to ship and the server to store what a phase recorded
QUIET = 2.0  # s the server's stored count must stay unchanged before a phase ends
# (a host setup's: a flush interval more, so no batch is still on its way)
SPARSE = 30.0  # s the sparse phase serves, by default
SPARSE_GAP = 3.0  # s between its requests: under the host's 5-s count reports
DEFAULT_SETUPS = "aa,off,unsampled,lingering,all"  # with none; the peers on request
RATE_WINDOWS = 3  # wrk windows of the plain worker, for the sampled share


def _callgrind(out: Path, core: int) -> Launch:
    return Launch(
        core=core,
        wrapper=(
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
            "--dump-instr=no", "--dump-line=no", "--vgdb=no", callgrind.DUMP_AT,
        ),
        start_timeout=900.0,
        stop_timeout=600.0,
        worker_timeout=3600,
    )  # fmt: skip


def send(app: App, port: int, count: int, seconds: float = 0.0) -> None:
    """`count` requests of the app's mix, in turn, each answered before the next is sent:
    back to back, or spread evenly over `seconds` (which then pass in full)."""
    start = time.monotonic()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT) as client:
        for number in range(count):
            if seconds:
                time.sleep(max(0.0, start + number * seconds / count - time.monotonic()))
            method, path, body = app.mix[number % len(app.mix)]
            client.request(method, path, json=body).raise_for_status()
    time.sleep(max(0.0, start + seconds - time.monotonic()))


def _stored(profiler: ServerProcess, setup: Setup) -> float:
    one = host_app.host_counts(profiler).get(service(setup), {})
    return one.get("profiler_requests_stored_total", 0.0)


def _settle(profiler: ServerProcess, setup: Setup, at_least: float) -> float:
    """Waits until the server holds at least `at_least` requests of the setup and the count
    has stayed the same for `QUIET` seconds and a flush interval; returns it (0 after
    `QUIET` if not a host setup). `at_least` is a floor: under gunicorn, ready checks that
    timed out while the worker started are still queued and answered (and recorded)."""
    if setup.host is None:
        time.sleep(QUIET)
        return 0.0
    deadline = time.monotonic() + SHIP_TIMEOUT
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        now = _stored(profiler, setup)
        if now != last:
            last, since = now, time.monotonic()
        elif now >= at_least and time.monotonic() - since >= QUIET + FLUSH:
            return now
        time.sleep(0.5)
    raise RuntimeError(f"{setup.name}: {last} requests stored, expected {at_least}")


_COLLECTOR = re.compile(r"^\s*([\d,]+) \(.*?\)\s+\S*:gc_collect_main\b")


def _collector_instructions(counts: Path) -> int:
    """What the cyclic garbage collector cost in a phase, all it ran included (the
    inclusive cost of CPython's gc_collect_main, whose inlined parts callgrind lists
    under their own source files)."""
    return sum(
        int(match.group(1).replace(",", ""))
        for match in map(_COLLECTOR.match, callgrind.annotated(counts, "--inclusive=yes"))
        if match
    )


_FUNCTION = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+(\S.*?)(?: \[.*\])?$")


def _by_function(counts: Path) -> Counter:
    """A phase's instructions per function, its own (file:function, directories
    dropped)."""
    functions: Counter = Counter()
    for match in map(_FUNCTION.match, callgrind.annotated(counts, "--auto=no")):
        if match and ":" in match.group(2):
            functions[match.group(2).rsplit("/", 1)[-1]] += int(match.group(1).replace(",", ""))
    return functions


def _recorded_at_warmup(app: App, setup: Setup, warmup: int) -> int:
    """Requests the setup records up to the end of its warm-up, ready check included: all
    of them (`all`), or the first of each route (`unsampled`: a route never seen before is
    sampled). A worker waits for them to be stored before its phases, so that shipping
    them (the flush interval is 10 s) falls in neither."""
    if setup.key == "all":
        return warmup + 1
    if setup.key in ("unsampled", "lingering"):
        return len({path.split("?")[0] for _, path, _ in app.mix}) + 1
    return 0


@dataclass(frozen=True)
class Phase:
    """A counted part of a worker's life: `requests` requests, back to back or spread over
    `seconds`."""

    name: str
    requests: int
    seconds: float


def life(
    app: App,
    setup: Setup,
    phases: tuple[Phase, ...],
    warmup: int,
    profiler: ServerProcess,
    where: tuple[Path, Path | None, int],
) -> dict[str, dict]:
    """One worker of the setup under callgrind (`where`: scratch directory, shop database,
    core), warmed up, then each phase counted: its instructions, and its wall seconds."""
    tmp, shop, core = where
    out = tmp / f"callgrind-{setup.key}"
    out.mkdir()
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every worker
    process = host_app.start_app(
        app,
        setup,
        profiler.target,
        env,
        tmp,
        shop,
        _callgrind(out, core),
        lambda served: send(app, served.port, warmup),
    )
    counted = callgrind.Phases(out / f"cg.{process.worker}", process.worker)
    figures = {}
    try:
        recorded = _settle(profiler, setup, _recorded_at_warmup(app, setup, warmup))
        began = time.monotonic()  # a phase's wall time runs from the signal that begins it
        counted.end()  # start-up and warm-up
        for phase in phases:
            send(app, process.port, phase.requests, phase.seconds)
            stored = recorded
            if setup.host is not None:
                expected = recorded + phase.requests if setup.key == "all" else recorded
                stored = _settle(profiler, setup, expected)
            ended = time.monotonic()
            counts = counted.end()
            figures[phase.name] = {
                "instructions": callgrind.summary(counts),
                "collector_instructions": _collector_instructions(counts),
                "wall_seconds": round(ended - began, 2),
                "served": phase.requests,
                "recorded": stored - recorded,
                "functions": _by_function(counts),
            }
            recorded, began = stored, ended
            print(f"  {setup.name}, {phase.name}: {figures[phase.name]['instructions']:,}")
    finally:
        process.stop()
    return figures


def _full_speed_rate(app: App, profiler: ServerProcess, tmp: Path, shop: Path | None) -> float:
    """The requests per second at which the plain worker fills one core: 1 / its CPU per
    request under wrk (as `host_app` loads it), median of `RATE_WINDOWS` windows. wrk's
    own rate is lower whenever the machine is busy (each request then waits for its turn
    on both cores), which would overstate the share the default rate samples."""
    plain = host_app.start_app(app, SETUPS[0], profiler.target, dict(os.environ), tmp, shop)
    try:
        return statistics.median(1 / plain.window(2, 1)["cpu"] for _ in range(RATE_WINDOWS))
    finally:
        plain.stop()


def _phases(requests: int, sparse: float) -> tuple[Phase, Phase]:
    return Phase("long", requests, 0.0), Phase("sparse", int(sparse // SPARSE_GAP), sparse)


def _separated(long: dict, sparse: dict, key: str) -> tuple[float, float]:
    """`key` per request, and per second of the worker's timers, from the long and sparse
    phases: each is `served` x per request + wall seconds x rate, two equations in two
    unknowns. Timers tick while a worker serves (uvicorn's 0.1 s tick, gunicorn's
    heartbeat, the host's stream and flushes), and under callgrind a request takes ~50x
    longer, so without this a slower setup would be charged ~50x its timers' real share.
    With no request in the sparse phase this is its idle rate, taken off the long phase's
    wall time."""
    wall_long, wall_sparse = long["wall_seconds"], sparse["wall_seconds"]
    served_long, served_sparse = long["served"], sparse["served"]
    per_request = (long[key] * wall_sparse - sparse[key] * wall_long) / (
        served_long * wall_sparse - served_sparse * wall_long
    )
    return per_request, (sparse[key] - served_sparse * per_request) / wall_sparse


def _per_request(phases: dict[str, dict], requests: int) -> dict:
    """Instructions per request, with and without the cyclic collector's. The collector
    is lumpy: a full collection walks every tracked object (~40,000 in these workers,
    ~15M instructions), so one more or one fewer in a life moves its figure by ~0.5% at
    200 requests; its own column shows it."""
    long, sparse = phases["long"], phases["sparse"]
    per_request, rate = _separated(long, sparse, "instructions")
    collector, _ = _separated(long, sparse, "collector_instructions")
    return {
        "per_request": per_request,
        "collector_per_request": collector,
        "outside_collector_per_request": per_request - collector,
        "timers_per_second": rate,
        "recorded_per_request": long["recorded"] / requests,
        "phases": phases,
    }


BY_FUNCTION_TOP = 15  # functions listed per setup


def _where_it_goes(
    functions: dict[str, Counter], setups: list[Setup], requests: int
) -> dict[str, list[tuple[str, float]]]:
    """Per setup but none, the functions whose own instructions per request differ most
    from none's in the long phase (timers' share not taken off: it is spread over the
    interpreter's functions)."""
    out = {}
    for setup in setups:
        if setup.key == "none":
            continue
        more = Counter(functions[setup.key])
        more.subtract(functions["none"])
        top = sorted(more.items(), key=lambda item: -abs(item[1]))[:BY_FUNCTION_TOP]
        out[setup.name] = [(name, round(n / requests, 1)) for name, n in top]
    return out


def run(app_key: str, warmup: int, requests: int, keys: str = "", sparse: float = SPARSE) -> dict:
    app = host_app.APPS[app_key]
    started_load = os.getloadavg()
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    setups = overhead.choose(SETUPS, keys or DEFAULT_SETUPS)
    composes = {LINGERING, host_app.EVERY} <= {s.name for s in setups}
    with tempfile.TemporaryDirectory(prefix="profiler-bench-instr-", dir=scratch) as name:
        tmp = Path(name)
        shop = host_app.shop_database(tmp, dict(os.environ)) if app.shop else None
        with ServerProcess(f"sqlite:///{tmp}/profiles.db", core=CLIENT_CORE) as profiler:
            rate = _full_speed_rate(app, profiler, tmp, shop) if composes else 0.0
            phases = _phases(requests, sparse)
            print(f"{app.key}: {len(setups)} workers under callgrind, {len(CORES)} at a time")
            with ThreadPoolExecutor(len(CORES)) as pool:
                futures = {
                    setup.key: pool.submit(
                        life,
                        app,
                        setup,
                        phases,
                        warmup,
                        profiler,
                        (tmp, shop, CORES[number % len(CORES)]),
                    )
                    for number, setup in enumerate(setups)
                }
                lives = {key: future.result() for key, future in futures.items()}
    functions = {key: counted["long"].pop("functions") for key, counted in lives.items()}
    for counted in lives.values():
        counted["sparse"].pop("functions")
    figures = {setup.name: _per_request(lives[setup.key], requests) for setup in setups}
    if composes:
        figures[DEFAULT_COMPOSED] = {
            key: overhead.at_default_rate(
                figures[LINGERING][key], figures[host_app.EVERY][key], rate
            )
            for key in ("per_request", "collector_per_request", "outside_collector_per_request")
        }
        figures[DEFAULT_COMPOSED]["sampled_share"] = round(overhead.sampled_share(rate), 5)
        figures[DEFAULT_COMPOSED]["full_speed_requests_per_second"] = round(rate, 1)
    base = figures[NONE]
    for figure in figures.values():
        figure["ratio"] = round(base["per_request"] / figure["per_request"], 4)
        figure["ratio_outside_collector"] = round(
            base["outside_collector_per_request"] / figure["outside_collector_per_request"], 4
        )
    rows = [
        (
            setup,
            f"{one['per_request']:,.0f}",
            f"{one['ratio']:.4f}",
            f"{one['collector_per_request']:,.0f}",
            f"{one['ratio_outside_collector']:.4f}",
            f"{one['timers_per_second']:,.0f}" if "timers_per_second" in one else "-",
        )
        for setup, one in figures.items()
    ]
    headers = (
        "setup",
        "instructions/request",
        "ratio to none",
        "of which collector",
        "ratio outside collector",
        "timers' instructions/s",
    )
    print(results.table(headers, rows))
    if composes:
        print(f"sampled share at the default rate: {figures[DEFAULT_COMPOSED]['sampled_share']}")
    data = {
        "app": app.key,
        "include": app.include,
        "warmup_requests": warmup,
        "requests": requests,
        "sparse_seconds": sparse,
        "load_average_at_start": started_load,
        "setups": figures,
    }
    data["by_function"] = _where_it_goes(functions, setups, requests)
    for setup, top in data["by_function"].items():
        print(f"\n{setup}: instructions per request more than none, by function (own, top)")
        print(results.table(("function", "per request"), [(f, f"{n:+,.0f}") for f, n in top]))
    path = results.save(f"host-instructions-{app.key}", data)
    print(f"results: {path}")
    return data
