"""The server under test: a real `profiler-server` subprocess pinned to core 0, on a fresh
database, observed from outside (/proc for RSS and CPU, /metrics for its own counters)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, make_url, text

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SERVER_CORE = 0
CLIENT_CORE = 1
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
TICKS = os.sysconf("SC_CLK_TCK")
PY_SPY_THREAD = re.compile(r'^Thread (\d+) \(\w+\): "([^"]*)"', re.MULTILINE)
READY_LINE = re.compile(r"ingest on ([\d.]+):(\d+) \(gRPC\), HTTP on http://([\d.]+):(\d+)/")


@contextmanager
def fresh_database(kind: str) -> Iterator[str]:
    """An empty database for one run (a temp SQLite file, or a PostgreSQL database that is
    dropped afterwards), so runs never see each other's rows."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="profiler-bench-") as tmp:
            yield f"sqlite:///{tmp}/profiler.db"
        return
    if kind != "postgresql":
        raise ValueError(f"unknown database kind {kind!r}")
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"profiler_bench_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def stat_times(path: str) -> tuple[str, float, float]:
    """(comm, user seconds, system seconds) from a /proc/.../stat file (clock ticks)."""
    with open(path) as f:
        raw = f.read()
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return comm, int(fields[11]) / TICKS, int(fields[12]) / TICKS


def stat_cpu(path: str) -> tuple[str, float]:
    """(comm, user+system seconds) from a /proc/.../stat file."""
    comm, user, system = stat_times(path)
    return comm, user + system


def backends_cpu(url: str) -> dict[int, float]:
    """pid -> CPU seconds of the PostgreSQL backends serving the database of `url` (their
    process title names it; none for SQLite). They compete with the server and the client
    for the machine's two cores."""
    database = make_url(url)
    if database.get_backend_name() == "sqlite":
        return {}
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace")
            if title.startswith("postgres: ") and f" {database.database} " in title:
                out[int(pid)] = stat_cpu(f"/proc/{pid}/stat")[1]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two `backends_cpu` readings (processes that came and went too)."""
    return sum(v - before.get(k, 0.0) for k, v in after.items())


def thread_shares(before: dict, after: dict, wall: float) -> list[dict]:
    """The server's threads that used over 1% of `wall` between two `thread_cpu` readings:
    the kernel's own account, so a thread waiting for the GIL counts nothing."""
    rows = []
    for tid, (name, seconds) in after.items():
        used = seconds - before.get(tid, (name, 0.0))[1]
        if used > 0.01 * wall:
            rows.append({"tid": tid, "name": name, "cpu_s": round(used, 2)})
    return sorted(rows, key=lambda r: -r["cpu_s"])


class ServerProcess:
    """`taskset -c 0 python -m profiler_server` on OS-chosen loopback ports (read from its
    log). With `profile_to`, the server runs under cProfile (benchmarks/profiled_server.py);
    `module` runs another server taking the same options (benchmarks/grpc_floor.py)."""

    def __init__(
        self,
        db_url: str,
        profile_to: Path | None = None,
        core: int = SERVER_CORE,
        options: tuple[str, ...] = (),
        module: str = "profiler_server",
    ) -> None:
        self.db_url = db_url
        self.module = module
        self.options = options
        self.core = core
        self.profile_to = profile_to
        self.target = ""
        self.http = ""
        self.returncode: int | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="profiler-bench-server-")
        self.log_path = Path(self._dir.name) / "server.log"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self) -> None:
        if self.profile_to is None:
            module = ["-m", self.module]
        else:
            module = ["-m", "benchmarks.profiled_server", str(self.profile_to)]
        command = [
            "taskset",
            "-c",
            str(self.core),
            sys.executable,
            *module,
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--db",
            self.db_url,
            "--log-level",
            "info",
            *self.options,
        ]
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.target:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{self.log_tail()}")
            found = READY_LINE.search(self.log_path.read_text(errors="replace"))
            if found:
                self.target = f"{found[1]}:{found[2]}"
                self.http = f"http://{found[3]}:{found[4]}"
            else:
                time.sleep(0.05)
        while httpx.get(f"{self.http}/healthz", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: the server drains, flushes and exits 0 (and writes its profile)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        if self._proc is not None:
            self.returncode = self._proc.returncode
        self._dir.cleanup()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc status")

    def cpu_seconds(self) -> float:
        return stat_cpu(f"/proc/{self.pid}/stat")[1]

    def thread_cpu(self) -> dict[int, tuple[str, float]]:
        """tid -> (name, CPU seconds). The kernel names every Python thread `python`, so
        Python's own names are read with py-spy where it is installed; the main thread
        (tid == pid) runs the asyncio loop (gRPC reads, protobuf decode, HTTP)."""
        names = self._python_thread_names()
        out = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                name, seconds = stat_cpu(f"/proc/{self.pid}/task/{tid}/stat")
            except (FileNotFoundError, ProcessLookupError):
                continue
            out[int(tid)] = (names.get(int(tid), name), seconds)
        return out

    def _python_thread_names(self) -> dict[int, str]:
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if spy is None:
            return {self.pid: "main"}
        dump = subprocess.run(
            [spy, "dump", "--pid", str(self.pid)], capture_output=True, text=True, timeout=30
        ).stdout
        return {int(tid): name for tid, name in PY_SPY_THREAD.findall(dump)}

    def metrics(self) -> dict[str, float]:
        """The server's own counters and histogram sums from /metrics, by sample name."""
        body = httpx.get(f"{self.http}/metrics", timeout=30).text
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                key = sample.name
                if sample.labels.get("reason"):
                    key += f"{{reason={sample.labels['reason']}}}"
                if "le" not in sample.labels:
                    values[key] = values.get(key, 0.0) + sample.value
        return values
