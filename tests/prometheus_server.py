"""A real Prometheus (Debian `prometheus`, 2.42) on loopback that scrapes test servers.

Started as a subprocess with its own config and TSDB directory under the test's tmp_path;
every wait is bounded, and the process is always terminated at the end.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.processes import free_port

READY_TIMEOUT = 30.0
# Mimir/Grafana Cloud's limit: a longer label value fails the whole scrape, so ours does too.
LABEL_VALUE_LENGTH_LIMIT = 2048


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    log: Path

    def _get(self, path: str, **params: str) -> Any:
        with httpx.Client(trust_env=False, timeout=10) as client:
            response = client.get(self.url + path, params=params)
        assert response.status_code == 200, (
            f"{response.status_code} {path} {params}: {response.text}"
        )
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query; returns `data.result`: [{"metric": {...}, "value": [t, v]}]."""
        data = self._get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def scalar(self, expr: str) -> float | None:
        """The value of a query that yields at most one series (None if it yields none)."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def targets(self) -> list[dict]:
        return self._get("/api/v1/targets")["activeTargets"]

    def wait_for(
        self, probe: Callable[[], Any], timeout: float = 30.0, interval: float = 0.25
    ) -> Any:
        """Polls probe() until it is truthy or the deadline passes; returns its last value."""
        deadline = time.monotonic() + timeout
        value = probe()
        while not value and time.monotonic() < deadline:
            self.check_alive()
            time.sleep(interval)
            value = probe()
        return value

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            pytest.fail(f"prometheus exited ({self.process.returncode}):\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def _config(targets: list[str], interval: str) -> dict:
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {
                "job_name": "profiler",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": targets}],
                "label_value_length_limit": LABEL_VALUE_LENGTH_LIMIT,
            }
        ],
    }


def _wait_ready(url: str, process: subprocess.Popen) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT
    with httpx.Client(trust_env=False, timeout=2) as client:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.get(url + "/-/ready").status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    return False


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextmanager
def running_prometheus(
    targets: list[str], workdir: Path, interval: str = "1s", config: str | None = None
) -> Iterator[Prometheus]:
    """Runs Prometheus scraping `targets` (HOST:PORT, loopback) every `interval`, or with
    `config` (a whole prometheus.yml) when given."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        pytest.fail("prometheus not installed (apt-get install --no-install-recommends prometheus)")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config or json.dumps(_config(targets, interval)))  # JSON is YAML
    log = workdir / "prometheus.log"
    for _attempt in range(3):  # the free port may be taken before Prometheus binds it
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            if _wait_ready(url, process):
                yield Prometheus(url, process, log)
                return
        finally:
            _stop(process)
    pytest.fail(f"prometheus did not become ready:\n{log.read_text(errors='replace')[-4000:]}")
