"""What profiling costs a real web app: CPU of its one worker process per request, and its
throughput, under the host and under other profilers, as ratios to the unprofiled app.

Every setup is its own app server (gunicorn with one sync worker, or uvicorn), pinned to
core 0, on its own copy of the shop database (in /dev/shm: no disk waits); all are started
first, then only one at a time is under load: wrk (one thread, two connections, the route
mix of `shop_mix.lua`) pinned to core 1 with the profiling server and py-spy. Each window is
a warm-up run (the host's sampler adapts to the arrival rate) and then the measured run; the
worker's CPU (utime + stime of all its threads, so the host's transport thread and the
peers' threads count) is read from /proc before and after, the latter once the host has
shipped what the window recorded. See `overhead` for rounds and ratios.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import overhead, peers
from benchmarks.overhead import NONE, Setup
from benchmarks.server import CLIENT_CORE, ROOT, SERVER_CORE, ServerProcess, stat_cpu

APPS = ("flask", "starlette")
OFF, DEFAULT, EVERY = "host, sampling off", "host, default (10/s)", "host, 100%"
SAMPLE_ALL = "1000000"  # sampled requests per second: far above any arrival rate, so all
SETUPS = [
    Setup("none", NONE),
    Setup("aa", "none (A/A)"),
    Setup("off", OFF, host=("--sample-rate", "0")),
    Setup("default", DEFAULT, host=()),
    Setup("all", EVERY, host=("--sample-rate", SAMPLE_ALL)),
    Setup("cprofile", "cProfile", peer="cprofile"),
    Setup("cprofile-threads", "cProfile, every thread", peer="cprofile-threads"),
    Setup("yappi", "yappi", peer="yappi"),
    Setup("pyinstrument", "pyinstrument", peer="pyinstrument"),
    Setup("pyspy", "py-spy --nonblocking (+ its own CPU)", peer="py-spy"),
]
MIX = Path(__file__).resolve().parent / "shop_mix.lua"
SETTLE = 0.5  # s after a window: the host ships what it recorded (flush interval 0.2 s)
FIRST_LOAD = 3  # s of load after start: imports, templates, the sampler's rate estimate
WRK_LINE = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b")
WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


@dataclass(frozen=True)
class Launch:
    """How an app server is started: pinned to `core`, `wrapper` before its interpreter (a
    tool that runs it, e.g. valgrind); a slow wrapper needs longer timeouts."""

    core: int = SERVER_CORE
    wrapper: tuple[str, ...] = ()
    start_timeout: float = 60.0
    stop_timeout: float = 20.0  # then SIGKILL
    worker_timeout: int = 30  # gunicorn's default (and its graceful timeout's)


PLAIN = Launch()


def _serve(app: str, port: int, timeout: int) -> list[str]:
    if app == "flask":
        return [
            "-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}", "--no-control-socket",
            "--timeout", str(timeout), "--graceful-timeout", str(timeout),
            "profiling_target.wsgi:app",
        ]  # fmt: skip
    return [
        "-m", "uvicorn", "profiling_target.asgi:app", "--host", "127.0.0.1",
        "--port", str(port), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


def service(setup: Setup) -> str:
    """The service name a host setup reports as (its stored requests are counted by it)."""
    return "bench-" + re.sub(r"[^a-z0-9]+", "-", setup.name.lower()).strip("-")


def _command(
    app: str, port: int, setup: Setup, server: str, launch: Launch
) -> tuple[list[str], dict]:
    python = [*launch.wrapper, sys.executable]
    serve = _serve(app, port, launch.worker_timeout)
    if setup.host is not None:
        return [
            sys.executable, "-m", "profiler_host", "run", "--server", server,
            "--service", service(setup), "--include", "profiling_target.*", *setup.host,
            "--", *python, *serve,
        ], {}  # fmt: skip
    if setup.peer in peers.IN_PROCESS:
        env = {peers.ENV: setup.peer}
        if app == "flask":
            return [*python, *serve, "-c", "python:benchmarks.peers"], env
        return [*python, "-m", "benchmarks.peers", *serve], env
    return [*python, *serve], {}


def wrk(port: int, seconds: int) -> tuple[int, float]:
    """(requests answered, seconds) of one bounded wrk run on core 1; any error response or
    timeout fails the benchmark."""
    out = subprocess.run(
        ["taskset", "-c", str(CLIENT_CORE), "wrk", "-t1", "-c2", f"-d{seconds}s",
         "--timeout", "10s", "-s", str(MIX), f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = WRK_LINE.search(out)
    if found is None or "Non-2xx" in out or re.search(r"timeout [1-9]", out):
        raise RuntimeError(f"wrk on port {port}:\n{out}")
    return int(found[1]), float(found[2]) * WRK_UNITS[found[3]]


class AppProcess:
    """One app server (one worker) in one setup, pinned to its launch's core."""

    def __init__(
        self, app: str, setup: Setup, server: str, env: dict, tmp: Path, launch: Launch = PLAIN
    ) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        command, extra_env = _command(app, self.port, setup, server, launch)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(launch.core), *command],
            cwd=ROOT,
            env={**env, **extra_env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.stop_timeout = launch.stop_timeout
        self.worker = 0
        self.requests = 0  # answered, warm-ups included
        self.pyspy: subprocess.Popen | None = None
        try:
            self._wait_ready(app, launch.start_timeout)
            if setup.peer == "py-spy":
                self.pyspy = peers.attach_pyspy(self.worker, CLIENT_CORE, tmp / f"{self.port}.txt")
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, app: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"app did not start:\n{self.log.read()[-3000:].decode()}")
            try:  # an answer, not just a connection: gunicorn binds before its worker forks
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    sock.sendall(
                        b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
                    )
                    if sock.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            time.sleep(0.1)
        self.worker = self.proc.pid if app == "starlette" else _only_child(self.proc.pid)

    def cpu_seconds(self) -> float:
        """The worker's CPU, plus py-spy's when it samples the worker from outside: the CPU
        the machine spends on serving and profiling."""
        worker = stat_cpu(f"/proc/{self.worker}/stat")[1]
        if self.pyspy is None:
            return worker
        return worker + stat_cpu(f"/proc/{self.pyspy.pid}/stat")[1]

    def load(self, seconds: int) -> tuple[int, float]:
        count, took = wrk(self.port, seconds)
        self.requests += count
        return count, took

    def window(self, seconds: int, warmup: int) -> tuple[float, float]:
        """(CPU seconds per request, requests per second) of one measured run."""
        self.load(warmup)
        before = self.cpu_seconds()
        count, took = self.load(seconds)
        time.sleep(SETTLE)
        return (self.cpu_seconds() - before) / count, count / took

    def thread_ms_per_request(self) -> dict[str, float]:
        """The worker's live threads' CPU over its whole life per request answered, by
        thread name (`main`; Python threads share the process's name, gRPC's have theirs):
        where a setup's extra CPU goes."""
        out: dict[str, float] = {}
        for tid in os.listdir(f"/proc/{self.worker}/task"):
            name, seconds = stat_cpu(f"/proc/{self.worker}/task/{tid}/stat")
            name = "main" if int(tid) == self.worker else name
            out[name] = out.get(name, 0.0) + seconds * 1000 / max(self.requests, 1)
        return {name: round(ms, 4) for name, ms in sorted(out.items())}

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


def _only_child(pid: int) -> int:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                children.append(int(entry))
    if len(children) != 1:
        raise RuntimeError(f"expected one worker of {pid}, found {children}")
    return children[0]


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
    app: str,
    setup: Setup,
    server: str,
    env: dict,
    tmp: Path,
    shop: Path,
    launch: Launch = PLAIN,
    warm: Callable[[AppProcess], object] | None = None,
) -> AppProcess:
    """The app in `setup` on its own copy of the shop database, warmed up (by default
    `FIRST_LOAD` seconds of wrk: imports, templates, the sampler's rate estimate)."""
    database = tmp / f"shop-{service(setup)}.sqlite3"
    shutil.copy(shop, database)
    started = AppProcess(
        app, setup, server, {**env, "PROFILING_TARGET_DB": str(database)}, tmp, launch
    )
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
    (100% minus off). The default row itself samples more than 10/s here (its rate estimate
    decays while other setups run) and its small cost hides in the window noise; this
    assumes a sampled request costs the same at any sampling rate."""
    cpu = [
        overhead.at_default_rate(off, every, rate)
        for off, every, rate in zip(
            samples[OFF]["cpu"], samples[EVERY]["cpu"], samples[DEFAULT]["rate"], strict=True
        )
    ]
    ratio = [none / one for none, one in zip(samples[NONE]["cpu"], cpu, strict=True)]
    return {"cpu": overhead.summary(cpu, 6), "cpu_ratio": overhead.ratio_summary(ratio)}


def run(app: str, rounds: int, seconds: int, warmup: int, keys: str = "") -> dict:
    if CLIENT_CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {CLIENT_CORE})
    started_load = os.getloadavg()
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="profiler-bench-app-", dir=scratch) as name:
        tmp = Path(name)
        env = dict(os.environ)
        shop = shop_database(tmp, env)
        with ServerProcess(f"sqlite:///{tmp}/profiles.db", core=CLIENT_CORE) as profiler:
            apps: dict[str, AppProcess] = {}
            unavailable: dict[str, str] = {}
            try:
                for setup in overhead.choose(SETUPS, keys):
                    try:
                        apps[setup.name] = start_app(app, setup, profiler.target, env, tmp, shop)
                    except RuntimeError as exc:
                        if setup.peer != "py-spy":
                            raise
                        unavailable[setup.name] = str(exc).splitlines()[0]
                measured = [s for s in SETUPS if s.name in apps]
                print(f"{app}: {len(measured)} setups, {rounds} rounds of {warmup} s + {seconds} s")
                samples = overhead.interleave(
                    measured, rounds, lambda s: apps[s.name].window(seconds, warmup)
                )
                threads = {name: one.thread_ms_per_request() for name, one in apps.items()}
            finally:
                for one in apps.values():
                    one.stop()
            time.sleep(1.0)  # the last acks
            counts = host_counts(profiler)
    figures = overhead.ratios(samples)
    for name, by_thread in threads.items():
        figures[name]["thread_cpu_ms_per_request"] = by_thread
        print(f"{name}: CPU ms/request by thread over the run: {by_thread}")
    if {OFF, DEFAULT, EVERY} <= figures.keys():
        figures["host, default, modelled"] = _modelled_default(samples)
    loaded = FIRST_LOAD + (seconds + warmup) * rounds
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
        "app": app,
        "rounds": rounds,
        "window_seconds": seconds,
        "warmup_seconds": warmup,
        "load_average_at_start": started_load,
        "samples": samples,
    }
    return overhead.report(
        f"host-app-{app}", "request", "throughput ratio", figures, unavailable, data
    )
