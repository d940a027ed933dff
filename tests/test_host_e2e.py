"""The host as a user runs it: `profiler-host run` around real servers and scripts, streaming
to a real profiler-server over loopback, checked through the server's API."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually, sessions, stored_requests
from tests.processes import (
    GUNICORN,
    UVICORN,
    ServerProcess,
    free_port,
    host,
    serve_profiled,
    sqlite_server,
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with sqlite_server(tmp_path) as proc:
        yield proc


def functions_of(node: dict) -> list[str]:
    """Every function in the subtree, depth first."""
    found = [node["function"]]
    for child in node["children"]:
        found += functions_of(child)
    return found


def tree(server: ServerProcess, request_id: str) -> dict:
    return httpx.get(f"{server.http}/api/requests/{request_id}", timeout=30).json()


def run_script(
    server: ServerProcess, tmp_path: Path, service: str, source: str, *options: str
) -> None:
    """Runs `source` as a script under `profiler-host run OPTIONS`, streaming to `server`."""
    script = tmp_path / f"{service}.py"
    script.write_text(source)
    command = host(
        "--server", server.target, "--service", service, *options,
        "--", sys.executable, str(script),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def profile_script(server: ServerProcess, tmp_path: Path, service: str, source: str) -> dict:
    """Runs `source` as one whole-process request and returns its stored tree."""
    run_script(server, tmp_path, service, source, "--whole-process", "true")
    (stored,) = eventually(lambda: stored_requests(server.http, service=service), timeout=20)
    return tree(server, stored["id"])


def get_concurrently(url: str, count: int) -> list[int]:
    """Status codes of `count` simultaneous GETs: busy workers force the others to serve."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: httpx.get(url, timeout=60).status_code, range(count)))


@pytest.mark.parametrize("preload", [False, True], ids=["workers-import", "preload"])
def test_gunicorn_flask_requests_arrive_as_call_trees(
    server: ServerProcess, tmp_path: Path, preload: bool
):
    command = [*GUNICORN, *(["--preload"] if preload else []), "profiling_target.wsgi:app"]
    app = serve_profiled(server, tmp_path, "shop", *command)
    try:
        for _ in range(10):
            assert httpx.get(f"{app.url}/products/1", timeout=30).status_code == 200
            assert httpx.get(f"{app.url}/orders/1", timeout=30).status_code == 200
        assert get_concurrently(f"{app.url}/slow?ms=300", 6) == [200] * 6
        route = "/products/<int:product_id>"
        # the two workers' batches commit apart: wait for more than the first of them
        eventually(lambda: len(stored_requests(server.http, route=route)) >= 5, timeout=30)
        products = stored_requests(server.http, route=route)
        slow = eventually(lambda: len(stored_requests(server.http, route="/slow")) == 6, timeout=30)
    finally:
        app.stop(grace=15)
    assert slow, "every /slow request sampled and stored"
    assert len(sessions(stored_requests(server.http, route="/slow"))) == 2  # one per worker
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


def test_uvicorn_workers_each_stream_their_own_session(server: ServerProcess, tmp_path: Path):
    command = [
        sys.executable, "-m", "uvicorn", "profiling_target.asgi:app", "--workers", "2",
        "--host", "127.0.0.1", "--port", "{port}",
    ]  # fmt: skip
    app = serve_profiled(server, tmp_path, "shop-async", *command)
    try:
        assert httpx.get(f"{app.url}/products/1", timeout=30).status_code == 200
        # which worker accepts a connection is the kernel's and the loop's choice (uvloop
        # accepts eagerly): rounds of loop-blocking requests until both have served some
        for sent in range(4, 25, 4):
            assert get_concurrently(f"{app.url}/block?ms=300", 4) == [200] * 4
            blocked = eventually(
                lambda n=sent: len(stored_requests(server.http, route="/block")) == n, timeout=30
            )
            assert blocked
            if len(sessions(stored_requests(server.http, route="/block"))) == 2:
                break
        product = eventually(
            lambda: stored_requests(server.http, route="/products/{product_id:int}"), timeout=30
        )
    finally:
        app.stop(grace=15)
    assert len(sessions(stored_requests(server.http, route="/block"))) == 2
    names = functions_of(tree(server, product[0]["id"])["lanes"][0]["root"])
    assert "profiling_target.asgi:product" in names


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


POOL_WORK = """
import multiprocessing
import sys

import profiler_host

def square(n):
    return n * n

def work(n):
    with profiler_host.profile_request("work", force=True):
        return sum(square(i) for i in range(n))
"""
POOL_SCRIPT = (
    POOL_WORK
    + """
if __name__ == "__main__":
    pool = multiprocessing.get_context("fork").Pool(2)
    print(sum(pool.map(work, [10, 20, 30, 40])))
    pool.close()  # workers leave through os._exit; terminate() would kill them unflushed
    pool.join()
"""
)


def test_multiprocessing_children_stream_their_own_sessions(server: ServerProcess, tmp_path: Path):
    """Forked pool workers record and stream on their own and flush as they leave through
    os._exit. The parent has sent nothing when it forks (the next test forks a parent that
    streams)."""
    script = tmp_path / "pool.py"
    script.write_text(POOL_SCRIPT)
    command = host(
        "--server", server.target, "--service", "pool", "--flush-timeout", "20s",
        "--", sys.executable, str(script),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sum(i * i for n in (10, 20, 30, 40) for i in range(n)))
    assert "did not store" not in done.stderr, done.stderr
    arrived = eventually(lambda: len(stored_requests(server.http, service="pool")) == 4, timeout=30)
    assert arrived, stored_requests(server.http, service="pool")
    requests = stored_requests(server.http, service="pool")
    assert {r["route"] for r in requests} == {"work"}
    assert 1 <= len(sessions(requests)) <= 2  # the pool's two workers share the four tasks
    squares = sorted(
        functions_of(tree(server, request["id"])["lanes"][0]["root"]).count("__main__:square")
        for request in requests
    )
    assert squares == [10, 20, 30, 40]


FORKS_WHILE_STREAMING = 5
STREAMING_POOL_SCRIPT = (
    POOL_WORK
    + """
if __name__ == "__main__":
    context = multiprocessing.get_context("fork")
    total = 0
    for round in range(ROUNDS):
        with profiler_host.profile_request("parent", force=True):
            square(round)  # the parent's stream is busy with it as the pool forks
        pool = context.Pool(2)
        total += sum(pool.map(work, [10, 20]))
        pool.close()
        pool.join()
    print(total, "grpc" in sys.modules)
""".replace("ROUNDS", str(FORKS_WHILE_STREAMING))
)


def test_a_process_that_streams_forks_children_that_stream_too(
    server: ServerProcess, tmp_path: Path
):
    """A fork while the parent's stream is busy: gRPC runs in the parent's relay process,
    never in the parent, so each child inherits no gRPC state, starts a relay of its own
    and stores what it recorded (a child forked while gRPC ran in the app hung or aborted
    now and then)."""
    script = tmp_path / "streaming_pool.py"
    script.write_text(STREAMING_POOL_SCRIPT)
    command = host(
        "--server", server.target, "--service", "streaming-pool", "--flush-timeout", "20s",
        "--flush-interval", "10ms", "--", sys.executable, str(script),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    squares = sum(i * i for n in (10, 20) for i in range(n)) * FORKS_WHILE_STREAMING
    assert done.stdout.split() == [str(squares), "False"]  # gRPC never loaded in the app
    assert "did not store" not in done.stderr, done.stderr
    expected = 3 * FORKS_WHILE_STREAMING
    arrived = eventually(
        lambda: len(stored_requests(server.http, service="streaming-pool")) == expected,
        timeout=60,
    )
    assert arrived, stored_requests(server.http, service="streaming-pool")
    requests = stored_requests(server.http, service="streaming-pool")
    routes = sorted(r["route"] for r in requests)
    assert routes == ["parent"] * FORKS_WHILE_STREAMING + ["work"] * 2 * FORKS_WHILE_STREAMING
    assert len(sessions(requests)) >= 1 + FORKS_WHILE_STREAMING  # each pool's workers


@pytest.mark.parametrize("command", [[*GUNICORN, "profiling_target.wsgi:app"], UVICORN])
def test_forced_requests_and_the_event_cap(
    server: ServerProcess, tmp_path: Path, command: list[str]
):
    """WSGI under gunicorn, and ASGI under uvicorn, where the C dispatch reads the header
    names (uvicorn hands them over lowercased) and keeps the others on its own path."""
    wrapped = ["--sample-rate", "0", "--force-secret", "s3cret", "--max-request-events", "100"]
    app = serve_profiled(server, tmp_path, "forced", *command, options=wrapped)
    try:
        for header in ({}, {"X-Profiler-Force": "wrong"}, {"X-Profiler-Forcd": "s3cret"}):
            assert httpx.get(f"{app.url}/products/1", headers=header, timeout=30).is_success
        forced = {"X-Profiler-Force": "s3cret"}
        assert httpx.get(f"{app.url}/report", headers=forced, timeout=30).is_success
        stored = eventually(lambda: stored_requests(server.http, service="forced"), timeout=30)
        assert httpx.get(f"{app.url}/health", timeout=30).is_success
    finally:
        app.stop(grace=15)
    assert [r["route"] for r in stored] == ["/report"]  # sampling off: only the forced one
    assert stored[0]["truncated"] is True
    # 100 events, counted as call ids: a call's enter and exit take one, and so does each
    # resume of a generator with its suspend (the report's generators resume a few times)
    assert 30 <= stored[0]["calls"] <= 50


CHAINED = """
import os
os.environ["USER_SITECUSTOMIZE_RAN"] = "yes"
"""

TRACED = """
import os
import sys
import profiler_host

def work():
    return sum(range(10))

print(os.environ.get("USER_SITECUSTOMIZE_RAN"))
sys.settrace(lambda *args: None)
with profiler_host.profile_request("traced"):
    work()
sys.settrace(None)
if hasattr(sys, "monitoring"):  # a sys.monitoring tool (3.12+), as coverage's sysmon core
    sys.monitoring.use_tool_id(sys.monitoring.COVERAGE_ID, "coverage-like")
    with profiler_host.profile_request("monitored"):
        work()
    sys.monitoring.free_tool_id(sys.monitoring.COVERAGE_ID)
with profiler_host.profile_request("untraced"):
    work()
"""


def test_user_sitecustomize_runs_and_tracers_are_not_sampled(server: ServerProcess, tmp_path: Path):
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(CHAINED)
    script = tmp_path / "traced.py"
    script.write_text(TRACED)
    env = {**os.environ, "PYTHONPATH": str(user_site)}
    command = host(
        "--server", server.target, "--service", "traced", "--sample-rate", "1000",
        "--", sys.executable, str(script),
    )  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "yes"
    stored = eventually(lambda: stored_requests(server.http, service="traced"), timeout=20)
    assert [r["route"] for r in stored] == ["untraced"]
    root = tree(server, stored[0]["id"])["lanes"][0]["root"]
    assert functions_of(root)[1:] == ["__main__:work"]


YIELD_FROM_THROUGH_A_PLAIN_CALL = """
def inner():
    yield 1
    yield 2

def outer():
    yield from inner()

def take_one(gen):
    return next(gen)

gen = outer()
take_one(gen)
take_one(gen)
list(gen)
"""


def test_yield_from_resumed_by_a_plain_function_keeps_its_tree(
    server: ServerProcess, tmp_path: Path
):
    request = profile_script(server, tmp_path, "yf", YIELD_FROM_THROUGH_A_PLAIN_CALL)
    assert request["truncated"] is False
    root = request["lanes"][0]["root"]
    first, second = root["children"]  # the two take_one calls; the generator began in the first
    assert functions_of(first) == ["__main__:take_one", "__main__:outer", "__main__:inner"]
    assert functions_of(second) == ["__main__:take_one"]
    outer = first["children"][0]
    assert outer["outcome"] == "return" and outer["suspensions"] == 2
    assert outer["end_ns"] > second["end_ns"]  # open until list() drained it


PROPAGATION_SCRIPT = """
import asyncio
import threading

import profiler_host

own = threading.Thread.start.__code__
patched = lambda: threading.Thread.start.__code__ is not own  # patched in its code


async def child():
    await asyncio.sleep(0)


async def handler():
    await asyncio.create_task(child())


assert not patched(), "patched before any request was sampled"
asyncio.run(handler())  # not sampled: nothing to carry
with profiler_host.profile_request("job", force=True):
    asyncio.run(handler())
    during = patched()
assert not patched(), "patched after the sampled request ended"
print("patched" if during else "originals")
"""


@pytest.mark.parametrize("propagate", ["true", "false"])
def test_propagation_patches_wait_for_a_sampled_request_and_can_be_turned_off(
    server: ServerProcess, tmp_path: Path, propagate: str
):
    """A process runs asyncio and threading unpatched but while a sampled request is in
    flight (so one that sampled once is no slower afterwards): the patches go out as it
    ends; `--propagate false` keeps them so, and a task then records in the lane that
    created it (the context it inherits) instead of a lane of its own."""
    script = tmp_path / "tasks.py"
    script.write_text(PROPAGATION_SCRIPT)
    command = host(
        "--server", server.target, "--service", "tasks", "--sample-rate", "0",
        "--propagate", propagate, "--flush-timeout", "30s",  # a loaded machine's exit too
        "--", sys.executable, str(script),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("patched" if propagate == "true" else "originals")
    (stored,) = eventually(lambda: stored_requests(server.http, service="tasks"), timeout=20)
    lanes = tree(server, stored["id"])["lanes"]
    names = [name for lane in lanes for name in functions_of(lane["root"])]
    assert names.count("__main__:handler") == 1
    assert names.count("__main__:child") == 1
    kinds = {lane["kind"] for lane in lanes}  # asyncio.run's own tasks are lanes too
    assert kinds == ({"main", "task"} if propagate == "true" else {"main"})
