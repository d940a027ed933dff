"""Async code measured whole: the Starlette app under uvicorn and `profiler-host run`, its
requests' trees checked against known sleeps, busy loops, fan-outs and thread hand-overs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually, stored_requests
from tests.processes import HttpProcess, ServerProcess
from tests.test_host_e2e import functions_of, host, serve_profiled, tree

UVICORN = [
    sys.executable, "-m", "uvicorn", "profiling_target.asgi:app",
    "--host", "127.0.0.1", "--port", "{port}",
]  # fmt: skip
MS = 1_000_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, HttpProcess]]:
    tmp = tmp_path_factory.mktemp("async")
    server = ServerProcess(f"sqlite:///{tmp / 'profiles.db'}", tmp / "server.log")
    try:
        app = serve_profiled(server, tmp, "async", *UVICORN)
        try:
            yield server, app
        finally:
            app.stop(grace=15)
    finally:
        server.stop(grace=10)


def nodes(node: dict) -> Iterator[dict]:
    yield node
    for child in node["children"]:
        yield from nodes(child)


def only(request: dict, function: str) -> dict:
    (found,) = [
        n for lane in request["lanes"] for n in nodes(lane["root"]) if n["function"] == function
    ]
    return found


def fetch(stack: tuple[ServerProcess, HttpProcess], path: str, route: str) -> dict:
    """GETs `path` once and returns the stored tree of that request."""
    server, app = stack
    before = {r["id"] for r in stored_requests(server.http, route=route)}
    assert httpx.get(app.url + path, timeout=30).status_code == 200
    new = eventually(
        lambda: [r for r in stored_requests(server.http, route=route) if r["id"] not in before],
        timeout=30,
    )
    assert len(new) == 1
    return tree(server, new[0]["id"])


def test_an_awaited_sleep_is_wall_time_not_active_time(stack):
    request = fetch(stack, "/slow?ms=120", "/slow")
    sleeper = only(request, "profiling_target.delays:call_slow_upstream_async")
    wall = sleeper["end_ns"] - sleeper["start_ns"]
    assert 120 * MS <= wall < 400 * MS
    assert sleeper["suspensions"] >= 1
    assert sleeper["active_ns"] < 20 * MS  # on the loop only to start and finish the sleep
    assert sleeper["await_ns"] + sleeper["ready_ns"] >= 110 * MS
    handler = only(request, "profiling_target.asgi:slow")
    assert sleeper in handler["children"]
    assert handler["end_ns"] - handler["start_ns"] >= wall


def test_a_busy_loop_is_active_time(stack):
    request = fetch(stack, "/block?ms=80", "/block")
    busy = only(request, "profiling_target.delays:crunch_numbers")
    assert 80 * MS <= busy["end_ns"] - busy["start_ns"] < 300 * MS
    assert busy["self_ns"] >= 70 * MS
    handler = only(request, "profiling_target.asgi:block")
    assert handler["suspensions"] == 0  # it never gave the loop away
    assert handler["active_ns"] >= 80 * MS


def test_fan_out_tasks_and_threads_are_lanes_under_their_spawning_call(stack):
    request = fetch(stack, "/report?orders=20", "/report")
    lanes = {lane["id"]: lane for lane in request["lanes"]}
    tasks = [lane for lane in lanes.values() if lane["kind"] == "task"]
    assert len(tasks) >= 3  # the TaskGroup's three loads
    ids_in_main = {n["id"] for n in nodes(lanes["0"]["root"])}
    for task in tasks:
        assert task["parent_lane"] == "0"
        assert task["parent_node"] in ids_in_main and task["parent_node"] != 0
    product = fetch(stack, "/products/3", "/products/{product_id:int}")
    workers = [lane for lane in product["lanes"] if lane["kind"] in ("executor", "thread")]
    assert workers, [lane["kind"] for lane in product["lanes"]]
    assert all(functions_of(lane["root"])[1:] for lane in workers)  # each ran recorded calls


def test_concurrent_requests_do_not_bleed_into_each_other(stack):
    server, app = stack
    count = 60
    before = {r["id"] for r in stored_requests(server.http, route="/slow")}
    with ThreadPoolExecutor(count) as pool:
        statuses = list(
            pool.map(
                lambda n: httpx.get(f"{app.url}/slow?ms={50 + n}", timeout=60).status_code,
                range(count),
            )
        )
    assert statuses == [200] * count

    def new() -> list[dict]:
        return [r for r in stored_requests(server.http, route="/slow") if r["id"] not in before]

    stored = eventually(lambda: len(new()) >= count // 2, timeout=30) and new()
    assert len(stored) >= count // 2  # 1000/s allows all, but the first window learns the rate
    for summary in stored:
        request = tree(server, summary["id"])
        names = [n["function"] for lane in request["lanes"] for n in nodes(lane["root"])]
        assert names.count("profiling_target.asgi:slow") == 1
        assert names.count("profiling_target.delays:call_slow_upstream_async") == 1
        assert names.count("profiling_target.params:delay_ms") == 1


READY_SCRIPT = """
import asyncio
import time

def hog_the_loop(seconds):
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass

async def waiter(event):
    await event.wait()

async def setter(event):
    await asyncio.sleep(0.05)
    event.set()  # the waiter is runnable from here on...
    hog_the_loop(0.2)  # ...but the loop is busy here

async def main():
    event = asyncio.Event()
    await asyncio.gather(waiter(event), setter(event))

asyncio.run(main())
"""


def test_waiting_for_a_busy_loop_is_ready_time_not_await_time(stack, tmp_path: Path):
    """The waiter awaits an event for 50 ms, then is ready for 200 ms while another task
    hogs the loop: the two waits are told apart."""
    server, _ = stack
    script = tmp_path / "ready.py"
    script.write_text(READY_SCRIPT)
    command = host(
        "--server", server.target, "--service", "ready", "--whole-process", "true",
        "--", sys.executable, str(script),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    stored = eventually(lambda: stored_requests(server.http, service="ready"), timeout=20)
    request = tree(server, stored[0]["id"])
    waiter = only(request, "__main__:waiter")
    assert 40 * MS <= waiter["await_ns"] < 150 * MS
    assert 180 * MS <= waiter["ready_ns"] < 400 * MS
    assert waiter["active_ns"] < 20 * MS
    hog = only(request, "__main__:hog_the_loop")
    assert hog["self_ns"] >= 190 * MS
    setter = only(request, "__main__:setter")
    assert setter["max_slice_ns"] >= 190 * MS  # the slice that held the loop
