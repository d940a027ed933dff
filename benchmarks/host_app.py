"""What the host costs a real app: CPU of the app's worker process per request, plain and
under `profiler-host run` (sampling at the default 10/s, and off), as a ratio to plain.

The three setups run side by side, each one worker pinned to core 0 on the same shop
database; this process (the load, two connections in flight so the worker never idles)
and the profiling server are on core 1. Rounds visit the setups in a shuffled order; the
worker's CPU (utime + stime of every thread, so the host's transport thread counts too) is
read from /proc before and after each window.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import results
from benchmarks.server import CLIENT_CORE, ROOT, SERVER_CORE, ServerProcess, stat_cpu

APPS = ("flask", "starlette")
SETUPS = {"plain": None, "sampled": "10", "sampling off": "0"}
ROUTES = (b"GET /products/1", b"GET /orders/1", b"GET /products?page=1", b"POST /checkout")
CHECKOUT = b'{"customer_id": 1, "items": [{"product_id": 1, "quantity": 1}]}'
WARMUP = 300
SETTLE = 0.3  # seconds around a window: the transport ships what the window recorded
START_TIMEOUT = 60.0
REQUEST_TIMEOUT = 30.0


def _serve(app: str, port: int) -> list[str]:
    if app == "flask":
        return ["-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}", "profiling_target.wsgi:app"]
    return [
        "-m", "uvicorn", "profiling_target.asgi:app", "--host", "127.0.0.1",
        "--port", str(port), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


def _request(port: int, route: bytes) -> None:
    """One request on its own connection (a gunicorn sync worker closes it anyway)."""
    body = CHECKOUT if route.startswith(b"POST") else b""
    head = b"%s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n" % route
    head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT) as sock:
        sock.sendall(head + body)
        answer = sock.recv(65536)
        while sock.recv(65536):
            pass
    if answer[9:12] not in (b"200", b"201"):
        raise RuntimeError(f"{route.decode()}: {answer[:200]!r}")


def _load(port: int, count: int) -> float:
    """`count` requests over the route mix, two in flight; returns the seconds taken."""
    started = time.monotonic()
    pool = ThreadPoolExecutor(2)
    try:
        for _ in pool.map(lambda i: _request(port, ROUTES[i % len(ROUTES)]), range(count)):
            pass
    finally:
        pool.shutdown(cancel_futures=True)  # Ctrl-C or a failure: drop the queued rest
    return time.monotonic() - started


class AppProcess:
    """One app server (one worker) on core 0, optionally under `profiler-host run`."""

    def __init__(self, app: str, sample_rate: str | None, profiler: str, env: dict) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        command = [sys.executable, *_serve(app, self.port)]
        if sample_rate is not None:
            command = [
                sys.executable, "-m", "profiler_host", "run", "--server", profiler,
                "--service", "bench", "--include", "profiling_target.*",
                "--sample-rate", sample_rate, "--", *command,
            ]  # fmt: skip
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(SERVER_CORE), *command],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.worker = 0
        try:
            self._wait_ready(app)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, app: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"app did not start:\n{self.log.read()[-3000:].decode()}")
            try:
                _request(self.port, b"GET /health")
                break
            except OSError:
                time.sleep(0.1)
        self.worker = self.proc.pid if app == "starlette" else _only_child(self.proc.pid)

    def cpu_seconds(self) -> float:
        return stat_cpu(f"/proc/{self.worker}/stat")[1]

    def stop(self) -> None:
        """SIGTERM (gunicorn stops its worker, the host flushes), SIGKILL after 20 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
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


def _window(app: AppProcess, count: int) -> tuple[float, float]:
    """(CPU ms per request, requests per second) over `count` requests."""
    time.sleep(SETTLE)
    before = app.cpu_seconds()
    took = _load(app.port, count)
    time.sleep(SETTLE)
    return (app.cpu_seconds() - before) * 1000 / count, count / took


def _summary(values: list[float], digits: int) -> dict:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
    }


def run(app: str, rounds: int, requests: int, seed: int = 1) -> dict:
    if CLIENT_CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {CLIENT_CORE})
    rng = random.Random(seed)
    cpu: dict[str, list[float]] = {name: [] for name in SETUPS}
    rate: dict[str, list[float]] = {name: [] for name in SETUPS}
    with tempfile.TemporaryDirectory(prefix="profiler-bench-app-") as tmp:
        env = {**os.environ, "PROFILING_TARGET_DB": f"{tmp}/shop.sqlite3"}
        with ServerProcess(f"sqlite:///{tmp}/profiles.db", core=CLIENT_CORE) as profiler:
            stored_before = profiler.metrics().get("profiler_requests_stored_total", 0.0)
            apps: dict[str, AppProcess] = {}
            try:
                for name, sample_rate in SETUPS.items():
                    apps[name] = AppProcess(app, sample_rate, profiler.target, env)
                    _load(apps[name].port, WARMUP)
                for _ in range(rounds):
                    order = list(SETUPS)
                    rng.shuffle(order)
                    for name in order:
                        ms, per_second = _window(apps[name], requests)
                        cpu[name].append(ms)
                        rate[name].append(per_second)
            finally:
                for one in apps.values():
                    one.stop()
            stored = profiler.metrics().get("profiler_requests_stored_total", 0.0)
    out = {
        name: {
            "cpu_ms_per_request": _summary(cpu[name], 3),
            "requests_per_second": _summary(rate[name], 0),
            # plain CPU per request / this setup's, per round (1.0 = no cost)
            "ratio_to_plain": _summary(
                [p / c for p, c in zip(cpu["plain"], cpu[name], strict=True)], 4
            ),
        }
        for name in SETUPS
    }
    sampled = stored - stored_before
    rows = [
        (
            name,
            f"{f['cpu_ms_per_request']['median']:.3f}",
            f"{f['ratio_to_plain']['median']:.4f}",
            f"{f['ratio_to_plain']['min']:.4f}-{f['ratio_to_plain']['max']:.4f}",
            f"{f['requests_per_second']['median']:.0f}",
        )
        for name, f in out.items()
    ]
    print(results.table(("setup", "CPU ms/request", "ratio", "ratio range", "requests/s"), rows))
    print(f"\n{sampled:.0f} requests sampled and stored ({rounds} rounds of {requests})")
    data = {"app": app, "rounds": rounds, "requests_per_window": requests, "setups": out}
    path = results.save(f"host-app-{app}", {**data, "sampled_requests_stored": sampled})
    print(f"results: {path}")
    return out
