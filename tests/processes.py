"""Servers in their own processes: the profiler-server (SIGTERM, kill -9) and the sample apps."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

# CI runs each interpreter's suite beside the others. Each picks its ports from a range of its
# own below the kernel's ephemeral range (32768 up), so neither another suite nor an outgoing
# connection's local port nor a `bind(0)` anywhere can take a port between its pick and its bind;
# and a process never hands out one port twice (two picks in one test could otherwise agree).
_PORT_RANGES = {11: range(20000, 24000), 12: range(24000, 28000), 13: range(28000, 32000)}
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now and that this process has not handed out before."""
    ports = _PORT_RANGES.get(sys.version_info.minor, range(16000, 20000))
    for _ in range(1000):
        port = random.choice(ports)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {ports}")


class HttpProcess:
    """A child process serving HTTP on loopback, polled until `ready_path` answers 200."""

    def __init__(
        self,
        args: list[str],
        log: Path,
        port: int,
        ready_path: str,
        env: dict | None = None,
        ready_timeout: float = 30,
    ) -> None:
        self.port = port
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, env=env or os.environ.copy())
        try:
            self._wait_ready(ready_path, ready_timeout)
        except RuntimeError:
            self.stop()  # never leave a server behind
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, path: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(self.url + path, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not healthy: {self.log.read_text()}")

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, grace: float = 0) -> None:
        """Ends the process if it still runs: SIGTERM and `grace` seconds to exit, then SIGKILL.

        A grace period matters for servers with worker processes (gunicorn): killing the
        master alone would leave its workers running.
        """
        if self.proc.poll() is not None:
            return
        if grace:
            try:
                self.terminate(grace)
                return
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class ServerProcess(HttpProcess):
    """A profiler-server on free loopback ports."""

    def __init__(self, db: str, log: Path, *extra: str, grpc_port: int | None = None) -> None:
        self.grpc_port = grpc_port or free_port()
        self.http_port = free_port()
        args = [
            sys.executable, "-m", "profiler_server", "--db", db,
            "--listen", f"127.0.0.1:{self.grpc_port}", "--http", f"127.0.0.1:{self.http_port}",
            *extra,
        ]  # fmt: skip
        super().__init__(args, log, self.http_port, "/healthz")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return self.url


@contextmanager
def sqlite_server(where: Path) -> Iterator[ServerProcess]:
    """A profiler-server on a fresh SQLite file in `where`, drained and stopped after."""
    proc = ServerProcess(f"sqlite:///{where / 'profiles.db'}", where / "server.log")
    try:
        yield proc
    finally:
        proc.stop(grace=10)


GUNICORN = [sys.executable, "-m", "gunicorn", "-w", "2", "-b", "127.0.0.1:{port}"]
UVICORN = [
    sys.executable, "-m", "uvicorn", "profiling_target.asgi:app",
    "--host", "127.0.0.1", "--port", "{port}",
]  # fmt: skip


def host(*args: str) -> list[str]:
    """`profiler-host run ARGS` (options, then `--`, then the command)."""
    return [sys.executable, "-m", "profiler_host", "run", *args]


def serve_profiled(
    server: ServerProcess | str,
    tmp_path: Path,
    service: str,
    *command: str,
    options: Sequence[str] = ("--sample-rate", "1000"),
) -> HttpProcess:
    """An app server under `profiler-host run` on a free port (`{port}` in the command),
    profiling to `server` (or to a gRPC address where no server listens yet)."""
    port = free_port()
    env = {**os.environ, "PROFILING_TARGET_DB": str(tmp_path / "shop.sqlite3")}
    args = [arg.format(port=port) for arg in command]
    target = server if isinstance(server, str) else server.target
    wrapped = host("--server", target, "--service", service, *options)
    return HttpProcess([*wrapped, "--", *args], tmp_path / "app.log", port, "/health", env=env)
