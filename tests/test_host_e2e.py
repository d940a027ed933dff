"""The host as a user runs it: `profiler-host run` around real servers and scripts, streaming
to a real profiler-server over loopback, checked through the server's API."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually, stored_requests
from tests.processes import HttpProcess, ServerProcess, free_port


def host(*args: str) -> list[str]:
    """`profiler-host run ARGS` (options, then `--`, then the command)."""
    return [sys.executable, "-m", "profiler_host", "run", *args]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(f"sqlite:///{tmp_path / 'profiles.db'}", tmp_path / "server.log")
    try:
        yield proc
    finally:
        proc.stop(grace=10)


def functions_of(node: dict) -> list[str]:
    """Every function in the subtree, depth first."""
    found = [node["function"]]
    for child in node["children"]:
        found += functions_of(child)
    return found


def tree(server: ServerProcess, request_id: str) -> dict:
    return httpx.get(f"{server.http}/api/requests/{request_id}", timeout=30).json()


def test_gunicorn_flask_requests_arrive_as_call_trees(server: ServerProcess, tmp_path: Path):
    port = free_port()
    env = {**os.environ, "PROFILING_TARGET_DB": str(tmp_path / "shop.sqlite3")}
    app = HttpProcess(
        host(
            "--server",
            server.target,
            "--service",
            "shop",
            "--sample-rate",
            "1000",
            "--",
            sys.executable,
            "-m",
            "gunicorn",
            "-w",
            "2",
            "-b",
            f"127.0.0.1:{port}",
            "profiling_target.wsgi:app",
        ),
        tmp_path / "app.log",
        port,
        "/health",
        env=env,
    )
    try:
        for _ in range(10):
            assert httpx.get(f"{app.url}/products/1", timeout=30).status_code == 200
            assert httpx.get(f"{app.url}/orders/1", timeout=30).status_code == 200
        products = eventually(
            lambda: stored_requests(
                server.http, service="shop", route="/products/<int:product_id>"
            ),
            timeout=30,
        )
    finally:
        app.stop(grace=15)
    assert len(products) >= 5  # the first of a route is always sampled, then 1000/s allows all
    one = tree(server, products[0]["id"])
    assert one["status"] == 200 and one["method"] == "GET"
    names = functions_of(one["lanes"][0]["root"])
    ours = [n for n in names if n.startswith("profiling_target.")]
    assert len(ours) > 50, names[:20]
    assert any(n.startswith("profiling_target.wsgi:") for n in ours)
    assert any(n.startswith("profiling_target.shop.") for n in ours)
    assert not any(n.startswith(("flask", "werkzeug", "jinja2", "profiler_")) for n in names)
    assert one["truncated"] is False


SCRIPT = """
import time

def leaf(i):
    return i * 2

def middle(n):
    return sum(leaf(i) for i in range(n))

def numbers(n):
    for i in range(n):
        yield middle(i)

def fails():
    raise ValueError("expected")

def main():
    total = sum(numbers(5))
    try:
        fails()
    except ValueError:
        pass
    time.sleep(0.05)
    print("total", total)

main()
"""


def run_job(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    """The script under `profiler-host run --whole-process true OPTIONS`; it must succeed."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    command = host("--whole-process", "true", *options, "--", sys.executable, str(script))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "total 20"
    return done


def test_script_whole_process_records_every_call(server: ServerProcess, tmp_path: Path):
    run_job(tmp_path, "--server", server.target, "--service", "job")
    requests = eventually(lambda: stored_requests(server.http, service="job"), timeout=20)
    assert len(requests) == 1
    root = tree(server, requests[0]["id"])["lanes"][0]["root"]
    (main,) = root["children"]
    assert main["function"] == "__main__:main"
    assert main["end_ns"] - main["start_ns"] >= 50_000_000  # it slept 50 ms
    children = [c["function"] for c in main["children"]]
    assert children == ["__main__:numbers", "__main__:fails"]
    numbers, fails = main["children"]
    assert [c["function"] for c in numbers["children"]] == ["__main__:middle"] * 5
    assert sum(len(m["children"]) for m in numbers["children"]) == 0 + 1 + 2 + 3 + 4
    assert numbers["suspensions"] == 5  # one per yield, the last one being the return
    assert fails["outcome"] == "exception"


def test_app_serves_normally_when_no_server_listens(tmp_path: Path):
    """A dead server costs nothing but dropped profiles: same answers, process exits fine."""
    done = run_job(tmp_path, "--server", f"127.0.0.1:{free_port()}", "--flush-timeout", "500ms")
    assert "did not store everything" in done.stderr


def test_bad_option_fails_before_running_the_command(tmp_path: Path):
    done = subprocess.run(
        host("--sample-rate", "lots", "--", sys.executable, "-c", "print('ran')"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "PROFILER_SAMPLE_RATE" in done.stderr and "ran" not in done.stdout
