"""What profiling costs a real web app: CPU of its one worker process per request, its
throughput, and its p99 latency at a moderate rate, under the host and under other
profilers, as ratios to the unprofiled app measured in the same rounds.

Apps (`APPS`): the two sample shops (Flask under gunicorn, Starlette under uvicorn), a fast
async endpoint (Starlette, ~0.1-0.2 ms a request) and a fast sync one (Flask), and apps on
frameworks installed from PyPI whose own packages are instrumented too: FastAPI
(`fastapi.*,starlette.*` and the app) and Django over ASGI (`django.*` and the app). Async
apps run under uvicorn with its default choices (uvloop's loop, httptools' parser: both
installed) and are loaded over several connections; sync apps under gunicorn with one sync
worker. Every setup is its own app server, pinned to core 0 (the shops each on their own
copy of the shop database in /dev/shm); all are started first, then only one at a time is
under load, from core 1 (where the profiling server and py-spy run too).

CPU rounds: wrk (closed loop, full speed, the app's route mix) gives each setup a warm-up
(the host's sampler adapts to the arrival rate) and a measured window; the worker's CPU
comes from its CPU-time clock (every thread, ended ones included, in nanoseconds) before
and after, the latter once the host has shipped what the window recorded, and each
thread's from /proc/PID/task/TID/schedstat, so the host's transport threads show
apart from the app's (Python threads are named at the end of the run by
`benchmarks.served`). Latency rounds: `benchmarks.open_loop` sends Poisson arrivals at
half the unprofiled app's full-speed rate (the median of the CPU rounds) and measures
each request from when it was issued to when its answer arrived (kernel timestamps), with
the same arrival schedule for every setup of a round. `paired`: each CPU window of a setup
runs at the same time as one of the unprofiled app, both on core 0 under their own wrk,
and is set against it (`overhead.interleave_pairs`). The host's relay process (the worker's
child, which holds its gRPC stream) is started before the first round and its CPU is
counted with the worker's. See `overhead` for rounds and ratios.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import open_loop, overhead, peers, served
from benchmarks.overhead import NONE, Setup
from benchmarks.server import CLIENT_CORE, ROOT, SERVER_CORE, ServerProcess, stat_times

CHECKOUT = {"customer_id": 1, "items": [{"product_id": 1, "quantity": 1}]}
SHOP_MIX = (  # as shop_mix.lua sends them
    ("GET", "/products/1", None),
    ("GET", "/orders/1", None),
    ("GET", "/products?page=1", None),
    ("POST", "/checkout", CHECKOUT),
)
FRAMEWORKS = "profiling_target.frameworks"


@dataclass(frozen=True)
class App:
    """An app as the benchmarks serve it: `server` gunicorn (one sync worker) or uvicorn,
    `include` what the host instruments, `mix` the requests sent in turn (method, path,
    body), `connections` wrk's (and the open-loop client's pool to start with)."""

    key: str
    server: str
    target: str  # module:attribute
    include: str
    mix: tuple[tuple[str, str, dict | None], ...]
    connections: int
    shop: bool = False  # reads and writes the shop's database

    @property
    def wrk_script(self) -> tuple[list[str], dict[str, str]]:
        """wrk's `-s` script and its environment for the mix."""
        if self.mix == SHOP_MIX:
            return [str(SHOP_LUA)], {}
        if any(method != "GET" for method, _, _ in self.mix):
            raise ValueError(f"{self.key}: paths.lua sends GET requests only")
        return [str(PATHS_LUA)], {"WRK_PATHS": ",".join(path for _, path, _ in self.mix)}


def _fast(module: str, server: str, connections: int, mix: tuple) -> App:
    target = f"{FRAMEWORKS}.{module}"
    return App(module.replace("_", "-"), server, f"{target}:app", target, mix, connections)


APPS = {
    one.key: one
    for one in (
        App("flask", "gunicorn", "profiling_target.wsgi:app", "profiling_target.*",
            SHOP_MIX, 2, shop=True),
        App("starlette", "uvicorn", "profiling_target.asgi:app", "profiling_target.*",
            SHOP_MIX, 8, shop=True),
        _fast("fast_async", "uvicorn", 8, (("GET", "/items/1", None),)),
        _fast("fast_sync", "gunicorn", 2, (("GET", "/items/1", None),)),
        App("fastapi", "uvicorn", f"{FRAMEWORKS}.fastapi_app:app",
            f"fastapi.*,starlette.*,{FRAMEWORKS}.fastapi_app",
            (("GET", "/items/1", None), ("GET", "/sync/1", None)), 8),
        App("django", "uvicorn", f"{FRAMEWORKS}.django_app:app",
            f"django.*,{FRAMEWORKS}.django_app",
            (("GET", "/items/1/", None), ("GET", "/fast/1/", None)), 8),
    )
}  # fmt: skip
OFF, DEFAULT, EVERY = "host, sampling off", "host, default (10/s)", "host, 100%"
# the host's middleware, sampler, counts and stream with no function rewritten: what sampling
# off costs apart from the closed gates and the rewritten code
BARE = "host, sampling off, nothing instrumented"
NOTHING = "request_profiler_benchmarks_instrument_nothing"  # a module name no app has
SAMPLE_ALL = "1000000"  # sampled requests per second: far above any arrival rate, so all
SETUPS = [
    Setup("none", NONE),
    Setup("aa", "none (A/A)"),
    Setup("off", OFF, host=("--sample-rate", "0")),
    Setup("bare", BARE, host=("--sample-rate", "0", "--include", NOTHING)),
    Setup("default", DEFAULT, host=()),
    Setup("all", EVERY, host=("--sample-rate", SAMPLE_ALL)),
    Setup("cprofile", "cProfile", peer="cprofile"),
    Setup("cprofile-threads", "cProfile, every thread", peer="cprofile-threads"),
    Setup("yappi", "yappi", peer="yappi"),
    Setup("pyinstrument", "pyinstrument", peer="pyinstrument"),
    Setup("pyspy", "py-spy --nonblocking (+ its own CPU)", peer="py-spy"),
]
DEFAULT_SETUPS = "aa,off,default,all"  # with none; the peers on request (--setups)
SHOP_LUA = Path(__file__).resolve().parent / "shop_mix.lua"
PATHS_LUA = Path(__file__).resolve().parent / "paths.lua"
SETTLE = 0.5  # s after a window: the host ships what it recorded (flush interval 0.2 s)
FIRST_LOAD = 3  # s of load after start: imports, templates, the sampler's rate estimate
RELAY_TIMEOUT = 30  # s of load after the first for the host's relay process to start
LATENCY_LOAD = 0.5  # share of the unprofiled app's full-speed rate for the latency rounds
WRK_LINE = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b")
WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
NAMES_TIMEOUT = 5.0  # s for a worker to write its thread names


@dataclass(frozen=True)
class Launch:
    """How an app server is started: pinned to `core`, `wrapper` before its interpreter (a
    tool that runs it, e.g. valgrind); a slow wrapper needs longer timeouts."""

    core: int = SERVER_CORE
    wrapper: tuple[str, ...] = ()
    start_timeout: float = 300.0  # an instrumented framework on a loaded 2-core machine
    stop_timeout: float = 20.0  # then SIGKILL
    worker_timeout: int = 30  # gunicorn's default (and its graceful timeout's)


PLAIN = Launch()


def _serve(app: App, port: int, timeout: int) -> list[str]:
    """The server's module and arguments (run through `benchmarks.served`)."""
    if app.server == "gunicorn":
        return [
            "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}", "--no-control-socket",
            "--timeout", str(timeout), "--graceful-timeout", str(timeout), app.target,
        ]  # fmt: skip
    return [
        "uvicorn", app.target, "--host", "127.0.0.1", "--port", str(port),
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


def service(setup: Setup) -> str:
    """The service name a host setup reports as (its stored requests are counted by it)."""
    return "bench-" + re.sub(r"[^a-z0-9]+", "-", setup.name.lower()).strip("-")


def _command(
    app: App, port: int, setup: Setup, server: str, launch: Launch
) -> tuple[list[str], dict]:
    serve = [*launch.wrapper, sys.executable, "-m", "benchmarks.served", "-m"]
    serve += _serve(app, port, launch.worker_timeout)
    if setup.host is not None:
        return [
            sys.executable, "-m", "profiler_host", "run", "--server", server,
            "--service", service(setup), "--include", app.include, *setup.host, "--", *serve,
        ], {served.PATCHES_KEPT: "1"} if setup.patches_kept else {}  # fmt: skip
    if setup.peer in peers.IN_PROCESS:
        if app.server == "gunicorn":  # started in the worker, after the fork
            serve += ["-c", "python:benchmarks.peers"]
        return serve, {peers.ENV: setup.peer}
    return serve, {}


def wrk(app: App, port: int, seconds: int) -> tuple[int, float]:
    """(requests answered, seconds) of one bounded wrk run on core 1; any error response or
    timeout fails the benchmark."""
    script, env = app.wrk_script
    out = subprocess.run(
        ["taskset", "-c", str(CLIENT_CORE), "wrk", "-t1", f"-c{app.connections}",
         f"-d{seconds}s", "--timeout", "10s", "-s", *script, f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, check=True, env={**os.environ, **env},
    ).stdout  # fmt: skip
    found = WRK_LINE.search(out)
    if found is None or "Non-2xx" in out or re.search(r"timeout [1-9]", out):
        raise RuntimeError(f"wrk on port {port}:\n{out}")
    return int(found[1]), float(found[2]) * WRK_UNITS[found[3]]


def cpu_clock_seconds(pid: int) -> float:
    """CPU seconds of process `pid`: all its threads, ended ones included (its CPU-time
    clock, to the nanosecond; /proc's stat counts 10 ms ticks)."""
    return time.clock_gettime(open_loop.cpu_clock(pid))


def user_system_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid`: the system part holds what the kernel
    spends for it, such as waking the client over loopback as each response is written."""
    _, user, system = stat_times(f"/proc/{pid}/stat")
    return user, system


def thread_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (comm, CPU seconds) of the live threads of `pid` (schedstat: nanoseconds)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                seconds = int(f.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(tid)] = (comm, seconds)
    return out


class AppProcess:
    """One app server (one worker) in one setup, pinned to its launch's core."""

    def __init__(
        self, app: App, setup: Setup, server: str, env: dict, tmp: Path, launch: Launch = PLAIN
    ) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.app = app
        self.setup = setup
        self.names_dir = tmp / f"names-{self.port}"
        self.names_dir.mkdir()
        command, extra_env = _command(app, self.port, setup, server, launch)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(launch.core), *command],
            cwd=ROOT,
            env={**env, **extra_env, served.DIRECTORY: str(self.names_dir)},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.stop_timeout = launch.stop_timeout
        self.worker = 0
        self.requests = 0  # answered, warm-ups included
        self.pyspy: subprocess.Popen | None = None
        try:
            self._wait_ready(launch.start_timeout)
            if setup.peer == "py-spy":
                self.pyspy = peers.attach_pyspy(self.worker, CLIENT_CORE, tmp / f"{self.port}.txt")
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                how = "exited" if self.proc.poll() is not None else f"not ready in {timeout:.0f} s"
                raise RuntimeError(
                    f"{self.app.key}, {self.setup.name}: {how}:\n{self.log.read()[-3000:].decode()}"
                )
            # an answer, not just a connection: gunicorn binds before its worker forks. A
            # connected check waits for its answer until the deadline: one given up on would
            # stay queued and be answered later, so lives would differ in what they served
            left = max(1.0, deadline - time.monotonic())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=left) as sock:
                    sock.sendall(
                        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                    )
                    if sock.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            time.sleep(0.1)
        self.worker = self.proc.pid if self.app.server == "uvicorn" else _only_child(self.proc.pid)

    def cpu_seconds(self) -> float:
        """The worker's CPU, its children's (the host's relay process, which holds its
        stream), and py-spy's when it samples the worker from outside: the CPU the
        machine spends on serving and profiling."""
        worker = cpu_clock_seconds(self.worker) + self.relay_seconds()
        if self.pyspy is None:
            return worker
        return worker + cpu_clock_seconds(self.pyspy.pid)

    def relay_seconds(self) -> float:
        """CPU seconds of the worker's live children: the host's relay (none unprofiled)."""
        total = 0.0
        for child in children(self.worker):
            try:
                total += cpu_clock_seconds(child)
            except OSError:  # gone meanwhile
                continue
        return total

    def wait_for_relay(self, timeout: float) -> None:
        """Loads the app until the host has started its relay process (as its transport's
        thread starts, at the first request counted): its start-up is not a measured
        window's."""
        deadline = time.monotonic() + timeout
        while not children(self.worker):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.app.key}, {self.setup.name}: no relay process")
            self.load(1)

    def load(self, seconds: int) -> tuple[int, float]:
        count, took = wrk(self.app, self.port, seconds)
        self.requests += count
        return count, took

    def window(self, seconds: int, warmup: int) -> dict:
        """One measured wrk run after a warm-up: CPU seconds per request, requests per
        second, and each thread's CPU seconds in it (tid -> [comm, seconds]; a thread
        that ended within the window counts under `ENDED`)."""
        self.load(warmup)
        threads = thread_seconds(self.worker)
        split = user_system_seconds(self.worker)
        relay = self.relay_seconds()
        before = self.cpu_seconds()
        count, took = self.load(seconds)
        if count == 0:  # the worker stalled for the whole window (a machine far too busy)
            raise RuntimeError(f"{self.app.key}, {self.setup.name}: no answer in {seconds} s")
        time.sleep(SETTLE)
        total = self.cpu_seconds() - before
        user, system = (b - a for a, b in zip(split, user_system_seconds(self.worker), strict=True))
        after = thread_seconds(self.worker)
        spent = {
            tid: [comm, seconds - threads.get(tid, (comm, 0.0))[1]]
            for tid, (comm, seconds) in after.items()
        }
        spent[RELAY] = ["", self.relay_seconds() - relay]
        spent[ENDED] = ["", total - sum(seconds for _, seconds in spent.values())]
        return {
            "cpu": total / count,
            "user": user / count,
            "system": system / count,
            "rate": count / took,
            "requests": count,
            "threads": spent,
        }

    def latency_window(self, rate: float, seconds: float, warmup: float, seed: int) -> dict:
        """Open-loop load at `rate` (see `open_loop`): latency quantiles and histogram, and
        the worker's CPU per request meanwhile."""
        mix = [list(one) for one in self.app.mix]
        out = subprocess.run(
            ["taskset", "-c", str(CLIENT_CORE), sys.executable, "-m", "benchmarks.open_loop",
             "--port", str(self.port), "--rate", f"{rate:.1f}", "--seconds", str(seconds),
             "--warmup", str(warmup), "--seed", str(seed), "--pid", str(self.worker),
             "--connections", "0" if self.app.server == "gunicorn" else str(self.app.connections),
             "--requests", json.dumps(mix)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout  # fmt: skip
        figure = json.loads(out)
        if figure["errors"]:
            raise RuntimeError(f"open-loop load on port {self.port}: {figure['errors']}")
        self.requests += figure["requests"]
        return figure

    def thread_names(self) -> dict[int, str]:
        """tid -> Python thread name of the worker's live Python threads (asked for with a
        signal: see `benchmarks.served`); empty if it does not answer."""
        path = self.names_dir / f"{self.worker}.json"
        os.kill(self.worker, served.THREAD_NAMES)
        deadline = time.monotonic() + NAMES_TIMEOUT
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not path.exists():
            return {}
        return {int(tid): name for tid, name in json.loads(path.read_text()).items()}

    def stop(self) -> None:
        """SIGTERM (gunicorn stops its worker, the host flushes), SIGKILL if that takes
        longer than the launch's stop timeout."""
        if self.pyspy is not None:
            peers.detach_pyspy(self.pyspy)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


ENDED = -1  # the `threads` key of CPU spent by threads that ended within a window
RELAY = -2  # the `threads` key of the worker's relay process


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


def _only_child(pid: int) -> int:
    found = children(pid)
    if len(found) != 1:
        raise RuntimeError(f"expected one worker of {pid}, found {found}")
    return found[0]


def host_counts(profiler: ServerProcess) -> dict[str, dict[str, float]]:
    """service -> stored / dropped requests, from the profiling server's /metrics."""
    counts: dict[str, dict[str, float]] = {}
    body = httpx.get(f"{profiler.http}/metrics", timeout=30).text
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name in (
                "profiler_requests_stored_total",
                "profiler_host_dropped_requests_total",
            ):
                one = counts.setdefault(sample.labels["service"], {})
                one[sample.name] = one.get(sample.name, 0.0) + sample.value
    return counts


def shop_database(tmp: Path, env: dict) -> Path:
    """Builds the shop's database once; every setup gets a copy (checkouts write to it)."""
    path = tmp / "shop.sqlite3"
    subprocess.run(
        [sys.executable, "-c",
         "from profiling_target.shop.service import Shop; Shop.from_env().database.ensure()"],
        cwd=ROOT, env={**env, "PROFILING_TARGET_DB": str(path)}, check=True,
    )  # fmt: skip
    return path


def start_app(
    app: App,
    setup: Setup,
    server: str,
    env: dict,
    tmp: Path,
    shop: Path | None,
    launch: Launch = PLAIN,
    warm: Callable[[AppProcess], object] | None = None,
) -> AppProcess:
    """The app in `setup` (a shop on its own copy of the database), warmed up (by default
    `FIRST_LOAD` seconds of wrk: imports, templates, the sampler's rate estimate)."""
    if app.shop:
        assert shop is not None
        database = tmp / f"shop-{service(setup)}.sqlite3"
        shutil.copy(shop, database)
        env = {**env, "PROFILING_TARGET_DB": str(database)}
    started = AppProcess(app, setup, server, env, tmp, launch)
    try:
        if warm is None:
            started.load(FIRST_LOAD)
        else:
            warm(started)
    except BaseException:
        started.stop()
        raise
    return started


def _modelled_default(samples: dict) -> dict:
    """The default rate's figures per round from the off and 100% rows: off's CPU per request
    plus the sampled share (10/s over the request rate) of what recording a request adds
    (100% minus off), each relative to its own baseline (none in the same round, or beside
    it). This assumes a sampled request costs the same at any sampling rate."""

    def per_round(key: str) -> list[tuple[float, float]]:
        base = samples[key].get("base", samples[NONE])["cpu"]
        return list(zip(samples[key]["cpu"], base, strict=True))

    composed = [
        (
            overhead.at_default_rate(off, every, rate),
            overhead.at_default_rate(off / off_base, every / every_base, rate),
        )
        for (off, off_base), (every, every_base), rate in zip(
            per_round(OFF), per_round(EVERY), samples[DEFAULT]["rate"], strict=True
        )
    ]
    return {
        "cpu": overhead.summary([cpu for cpu, _ in composed], 6),
        "cpu_ratio": overhead.ratio_summary([1 / relative for _, relative in composed]),
    }


def _per_round(windows: list[dict]) -> dict:
    """A setup's CPU per request and request rate, one value per window."""
    return {"cpu": [w["cpu"] for w in windows], "rate": [w["rate"] for w in windows]}


def _at_once(first: AppProcess, second: AppProcess, seconds: int, warmup: int) -> tuple:
    """Both apps' windows under load at the same time, on the same core (`--paired`)."""
    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(first.window, seconds, warmup)
        two = pool.submit(second.window, seconds, warmup)
        return one.result(), two.result()


def _label(tid: int, comm: str, worker: int, names: dict[int, str]) -> str:
    """A thread's row in the breakdown: main, its Python name (numbers folded, so a pool's
    threads share a row), its OS name, ended, or the relay process."""
    if tid == ENDED:
        return "threads that ended within a window"
    if tid == RELAY:
        return "relay process (holds the host's gRPC stream)"
    if tid == worker:
        return "main"
    if tid in names:
        return re.sub(r"\d+", "N", names[tid])
    if comm.startswith(("python", "gunicorn")):  # a Python thread gone before the names
        return "Python threads that ended before the end of the run"
    return comm


def thread_breakdown(windows: list[dict], worker: int, names: dict[int, str]) -> dict:
    """CPU ms per request by thread row over all measured windows of a setup."""
    requests = sum(window["requests"] for window in windows)
    rows: dict[str, float] = {}
    for window in windows:
        for tid, (comm, seconds) in window["threads"].items():
            label = _label(int(tid), comm, worker, names)
            rows[label] = rows.get(label, 0.0) + seconds
    ordered = sorted(rows.items(), key=lambda item: -item[1])
    return {label: round(seconds * 1000 / requests, 5) for label, seconds in ordered}


def latency_figures(windows: dict[str, list[dict]]) -> dict:
    """Per setup: p99 and p50 ratios (this setup's / none's, per round: 1.05 is 5% slower),
    the p99 of all rounds pooled, CPU ratio at this rate, and how late the client issued."""
    base = windows[NONE]

    def per_round(ones: list[dict], value: Callable[[dict], float], inverse: bool) -> dict:
        pairs = zip(base, ones, strict=True)
        ratios = [value(b) / value(o) if inverse else value(o) / value(b) for b, o in pairs]
        return overhead.ratio_summary(ratios)

    out = {}
    for name, ones in windows.items():
        pooled: dict[int, int] = {}
        for one in ones:
            for b, n in one["histogram"].items():
                pooled[int(b)] = pooled.get(int(b), 0) + n
        out[name] = {
            "p99_us": overhead.summary([o["latency_us"]["p99"] for o in ones], 1),
            "p99_ratio": per_round(ones, lambda o: o["latency_us"]["p99"], False),
            "p50_ratio": per_round(ones, lambda o: o["latency_us"]["p50"], False),
            "pooled_us": open_loop.quantiles_of_histogram(pooled),
            "cpu_ratio": per_round(ones, lambda o: o["server_cpu_per_request"], True),
            "issue_lag_p99_us": overhead.summary([o["issue_lag_us"]["p99"] for o in ones], 1),
        }
    for figure in out.values():
        figure["pooled_p99_ratio"] = round(
            figure["pooled_us"]["p99"] / out[NONE]["pooled_us"]["p99"], 4
        )
    return out


def _server_modules(pid: int) -> list[str]:
    """Which of uvloop's loop and httptools' parser the worker has loaded."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [name for name in ("uvloop", "httptools") if f"/{name}/" in maps]


def run(
    app_key: str,
    rounds: int,
    seconds: int,
    warmup: int,
    keys: str = "",
    latency_rounds: int = 0,
    latency_seconds: float = 4.0,
    paired: bool = False,
) -> dict:
    app = APPS[app_key]
    if CLIENT_CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {CLIENT_CORE})
    started_load = os.getloadavg()
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="profiler-bench-app-", dir=scratch) as name:
        tmp = Path(name)
        env = dict(os.environ)
        shop = shop_database(tmp, env) if app.shop else None
        with ServerProcess(f"sqlite:///{tmp}/profiles.db", core=CLIENT_CORE) as profiler:
            apps: dict[str, AppProcess] = {}
            unavailable: dict[str, str] = {}
            try:
                for setup in overhead.choose(SETUPS, keys or DEFAULT_SETUPS):
                    try:
                        apps[setup.name] = start_app(app, setup, profiler.target, env, tmp, shop)
                        if setup.host is not None:
                            apps[setup.name].wait_for_relay(RELAY_TIMEOUT)
                    except RuntimeError as exc:
                        if setup.peer != "py-spy":
                            raise
                        unavailable[setup.name] = str(exc).splitlines()[0]
                measured = [s for s in SETUPS if s.name in apps]
                modules = _server_modules(apps[NONE].worker)
                print(
                    f"{app.key}: {len(measured)} setups, {rounds} rounds of {warmup} s + "
                    f"{seconds} s, {app.server} ({', '.join(modules) or 'its own loop'}), "
                    f"{app.connections} connections, include {app.include}"
                )
                bases: dict[str, list[dict]] = {}
                if paired:
                    windows, bases = overhead.interleave_pairs(
                        measured,
                        rounds,
                        lambda s: _at_once(apps[NONE], apps[s.name], seconds, warmup),
                    )
                    windows[NONE] = [w for ones in bases.values() for w in ones]
                    # a worker that shares its core: its full speed alone is 1 / CPU per request
                    full_speed = statistics.median(1 / w["cpu"] for w in windows[NONE])
                else:
                    windows = overhead.interleave_records(
                        measured, rounds, lambda s: apps[s.name].window(seconds, warmup)
                    )
                    full_speed = statistics.median(w["rate"] for w in windows[NONE])
                rate = full_speed * LATENCY_LOAD
                latency: dict[str, list[dict]] = {}
                if latency_rounds:
                    print(f"latency: {latency_rounds} rounds of {latency_seconds} s, {rate:.0f}/s")
                    latency = overhead.interleave_records(
                        measured,
                        latency_rounds,
                        lambda s, n: apps[s.name].latency_window(rate, latency_seconds, 1.0, n),
                        with_round=True,
                    )
                names = {key: one.thread_names() for key, one in apps.items()}
                workers = {key: one.worker for key, one in apps.items()}
            finally:
                for one in apps.values():
                    one.stop()
            time.sleep(1.0)  # the last acks
            counts = host_counts(profiler)
    samples = {key: _per_round(ones) for key, ones in windows.items()}
    for key, ones in bases.items():
        samples[key]["base"] = _per_round(ones)
    figures = overhead.ratios(samples)
    for key, ones in windows.items():
        breakdown = thread_breakdown(ones, workers[key], names[key])
        figures[key]["thread_cpu_ms_per_request"] = breakdown
        figures[key]["user_system_us_per_request"] = [
            round(statistics.median(w[part] for w in ones) * 1e6, 1) for part in ("user", "system")
        ]
        print(f"{key}: CPU ms/request by thread: {breakdown}")
    if {OFF, DEFAULT, EVERY} <= figures.keys():
        figures["host, default, modelled"] = _modelled_default(samples)
    if latency:
        for key, figure in latency_figures(latency).items():
            figures[key]["latency"] = figure
            figures[key]["p99_ratio"] = figure["p99_ratio"]
            figures[key]["cpu_ratio_at_latency_rate"] = figure["cpu_ratio"]
            print(
                f"{key}: pooled latency {figure['pooled_us']} us, client issue lag p99 "
                f"{figure['issue_lag_p99_us']['median']} us"
            )
    loaded = FIRST_LOAD + (seconds + warmup) * rounds + (latency_seconds + 1) * latency_rounds
    for setup in SETUPS:
        if setup.host is not None and setup.name in samples:
            one = counts.get(service(setup), {})
            stored = one.get("profiler_requests_stored_total", 0.0)
            figures[setup.name]["sampled_requests_stored"] = stored
            figures[setup.name]["sampled_per_loaded_second"] = round(stored / loaded, 2)
            figures[setup.name]["host_dropped_requests"] = one.get(
                "profiler_host_dropped_requests_total", 0.0
            )
            print(
                f"{setup.name}: {stored:.0f} requests sampled and stored "
                f"({stored / loaded:.1f}/s under load)"
            )
    data = {
        "app": app.key,
        "server": app.server,
        "server_modules": modules,
        "include": app.include,
        "connections": app.connections,
        "mix": app.mix,
        "rounds": rounds,
        "paired": paired,
        "window_seconds": seconds,
        "warmup_seconds": warmup,
        "latency_rounds": latency_rounds,
        "latency_seconds": latency_seconds,
        "latency_rate": round(rate, 1),
        "load_average_at_start": started_load,
        "samples": samples,
        "latency_windows": {
            key: [{k: v for k, v in w.items() if k != "histogram"} for w in ones]
            for key, ones in latency.items()
        },
    }
    extra = {f"p99 ratio at {rate:.0f}/s [range] (CI)": "p99_ratio"} if latency else {}
    if latency:
        extra[f"CPU ratio at {rate:.0f}/s"] = "cpu_ratio_at_latency_rate"
    return overhead.report(
        f"host-app-{app.key}", "request", "throughput ratio", figures, unavailable, data, extra
    )
