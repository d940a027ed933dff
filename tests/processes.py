"""A profiler-server in its own process, for what only a process can show: SIGTERM, kill -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, db: str, log: Path, *extra: str) -> None:
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.log = log
        args = [
            sys.executable, "-m", "profiler_server", "--db", db,
            "--listen", f"127.0.0.1:{self.grpc_port}", "--http", f"127.0.0.1:{self.http_port}",
            *extra,
        ]  # fmt: skip
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, env=os.environ.copy())
        try:
            self._wait_healthy()
        except RuntimeError:
            self.stop()  # never leave a server behind
            raise

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(self.http + "/healthz", timeout=1).status_code == 200:
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

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()
