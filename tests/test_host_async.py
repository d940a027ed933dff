"""Async code measured whole: the Starlette app under uvicorn and `profiler-host run`, its
requests' trees checked against known sleeps, busy loops, fan-outs and thread hand-overs."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually, stored_requests
from tests.processes import UVICORN, HttpProcess, ServerProcess
from tests.test_host_e2e import functions_of, profile_script, run_script, serve_profiled, tree

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
    # uvloop (uvicorn's choice when installed) keeps timers in whole milliseconds: a sleep
    # can end up to 1 ms before its delay
    assert 119 * MS <= wall < 400 * MS
    assert sleeper["suspensions"] >= 1
    assert sleeper["active_ns"] < 20 * MS  # on the loop only to start and finish the sleep
    assert sleeper["await_ns"] + sleeper["ready_ns"] >= 110 * MS
    handler = only(request, "profiling_target.asgi:slow")
    assert sleeper in handler["children"]
    assert handler["end_ns"] - handler["start_ns"] >= wall


def lane_times(request: dict) -> dict[str, tuple[int, int]]:
    """Per lane: (running + awaiting + ready of its calls and root, the lane's duration)."""
    states = ("self_ns", "self_await_ns", "self_ready_ns")
    return {
        lane["id"]: (
            sum(n[state] for n in nodes(lane["root"]) for state in states),
            lane["root"]["end_ns"] - lane["root"]["start_ns"],
        )
        for lane in request["lanes"]
    }


def assert_adds_up(request: dict) -> None:
    for lane, (charged, duration) in lane_times(request).items():
        assert charged == duration, (lane, charged, duration)
    duration = round(request["duration_ms"] * 1e6)
    assert abs(lane_times(request)["0"][1] - duration) <= 1  # the main lane is the request


def test_a_slow_async_requests_wait_is_charged_to_the_coroutine_that_awaits(stack):
    server, _ = stack
    request = fetch(stack, "/slow?ms=120", "/slow")
    assert_adds_up(request)
    sleeper = only(request, "profiling_target.delays:call_slow_upstream_async")
    assert sleeper["self_await_ns"] + sleeper["self_ready_ns"] >= 110 * MS
    handler = only(request, "profiling_target.asgi:slow")
    assert handler["self_await_ns"] == 0  # the innermost profiled coroutine waits, not its callers

    def stacks(value: str) -> dict[str, int]:
        body = httpx.get(
            f"{server.http}/api/flamegraph",
            params={"route": "/slow", "format": "json", "value": value},
            timeout=30,
        ).json()
        assert body["value"] == value
        return {s["stack"]: s["value"] for s in body["stacks"]}

    wall, running, awaiting, ready = map(stacks, ("wall", "running", "awaiting", "ready"))
    for name, total in wall.items():
        assert total == running.get(name, 0) + awaiting.get(name, 0) + ready.get(name, 0)
    (slept,) = [n for n in awaiting if n.endswith("delays:call_slow_upstream_async")]
    assert awaiting[slept] >= 110 * MS > running[slept]
    assert wall[slept] >= 110 * MS


def test_fan_out_lanes_each_add_up(stack):
    assert_adds_up(fetch(stack, "/report?orders=20", "/report"))  # a TaskGroup's tasks
    assert_adds_up(fetch(stack, "/products/3", "/products/{product_id:int}"))  # pool threads


def test_a_busy_loop_is_active_time(stack):
    request = fetch(stack, "/block?ms=80", "/block")
    busy = only(request, "profiling_target.delays:crunch_numbers")
    assert 80 * MS <= busy["end_ns"] - busy["start_ns"] < 300 * MS
    assert busy["self_ns"] >= 70 * MS
    handler = only(request, "profiling_target.asgi:block")
    assert handler["suspensions"] == 0  # it never gave the loop away
    assert handler["active_ns"] >= 80 * MS


def test_fan_out_tasks_and_threads_are_lanes_under_their_spawning_call(stack):
    """Under uvicorn's default loop selection, which takes uvloop when it is installed (as
    `uvicorn[standard]` does): its tasks get lanes through the loop's task factory."""
    assert importlib.util.find_spec("uvloop") is not None, "uvicorn would run asyncio's loop"
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
    request = profile_script(stack[0], tmp_path, "ready", READY_SCRIPT)
    waiter = only(request, "__main__:waiter")
    assert 40 * MS <= waiter["await_ns"] < 150 * MS
    assert 180 * MS <= waiter["ready_ns"] < 400 * MS
    assert waiter["active_ns"] < 20 * MS
    hog = only(request, "__main__:hog_the_loop")
    assert hog["self_ns"] >= 190 * MS
    setter = only(request, "__main__:setter")
    assert setter["max_slice_ns"] >= 190 * MS  # the slice that held the loop
    # the flame graph's states: the waiter's stack awaits, then is ready; every lane adds up
    assert 40 * MS <= waiter["self_await_ns"] < 150 * MS
    assert 180 * MS <= waiter["self_ready_ns"] < 400 * MS
    for lane, (charged, duration) in lane_times(request).items():
        assert charged == duration, lane


ENDINGS_SCRIPT = """
import asyncio

async def sleeper(seconds):
    await asyncio.sleep(seconds)

async def failer():
    await asyncio.sleep(0.01)
    raise ValueError("failed")

async def ticks():
    while True:
        yield 1
        await asyncio.sleep(0)

async def cancelled_task():
    task = asyncio.create_task(sleeper(10))
    await asyncio.sleep(0.02)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass

async def timed_out():
    try:
        async with asyncio.timeout(0.02):
            await sleeper(10)
    except TimeoutError:
        pass

async def wait_for_timed_out():
    try:
        await asyncio.wait_for(sleeper(10), 0.02)
    except TimeoutError:
        pass

async def group_failed():
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(sleeper(10))
            group.create_task(failer())
    except* ValueError:
        pass

async def gather_failed():
    try:
        await asyncio.gather(failer(), sleeper(0.03))
    except ValueError:
        await asyncio.sleep(0.05)  # the other sleeper goes on (gather does not cancel it)

async def abandoned_generator():
    async for _ in ticks():
        break  # left suspended: the loop's asyncgen hooks close it at shutdown

async def main():
    await cancelled_task()
    await timed_out()
    await wait_for_timed_out()
    await group_failed()
    await gather_failed()
    await abandoned_generator()

asyncio.run(main())
"""


def test_every_way_a_coroutine_ends_closes_its_node_once(stack, tmp_path: Path):
    """Cancellation, timeouts, TaskGroup and gather failures and an async generator closed
    by the loop: each node ends once, when it did, with the outcome it had."""
    request = profile_script(stack[0], tmp_path, "endings", ENDINGS_SCRIPT)
    assert request["truncated"] is False
    every = [n for lane in request["lanes"] for n in nodes(lane["root"])]
    by_name: dict[str, list[dict]] = {}
    for node in every:
        module, _, name = node["function"].partition(":")
        if module == "__main__":  # not the lanes' own root nodes
            by_name.setdefault(name, []).append(node)
    outcomes = {name: sorted(n["outcome"] for n in found) for name, found in by_name.items()}
    assert outcomes["sleeper"] == ["cancelled"] * 4 + ["return"]
    assert outcomes["failer"] == ["exception", "exception"]
    assert outcomes["ticks"] == ["cancelled"]
    (main,) = by_name["main"]
    callers = ["cancelled_task", "timed_out", "wait_for_timed_out", "group_failed"]
    callers += ["gather_failed", "abandoned_generator"]
    assert [child["function"] for child in main["children"]] == [f"__main__:{c}" for c in callers]
    for name in callers[:4]:
        (caller,) = by_name[name]
        assert caller["outcome"] == "return"
        assert 8 * MS <= caller["end_ns"] - caller["start_ns"] < 2_000 * MS, name  # 10-20 ms
    for node in every:
        assert node["start_ns"] <= node["end_ns"] <= request["duration_ms"] * MS + 1
    long_sleeps = [n for n in by_name["sleeper"] if n["outcome"] == "cancelled"]
    assert all(n["end_ns"] - n["start_ns"] < 2_000 * MS for n in long_sleeps)  # not 10 s


INTERLEAVED_SCRIPT = """
import asyncio
import profiler_host

def leaf(n):
    return n

async def work(n):
    for i in range(n % 7 + 1):
        leaf(n)
        await asyncio.sleep(0.001 * (i % 3))
    return n

async def handle(n):
    if n % 2:  # unsampled: runs the same code between the sampled ones
        return await work(n)
    with profiler_host.profile_request(f"r{n}", force=True):
        return await work(n)

async def main():
    done = await asyncio.gather(*(handle(n) for n in range(200)))
    assert done == list(range(200))

asyncio.run(main())
"""


def test_concurrent_sampled_requests_hold_exactly_their_own_calls(stack, tmp_path: Path):
    """100 sampled requests at once on one loop, unsampled ones running the same code in
    between: each stored tree holds its own calls and nobody else's."""
    server = stack[0]
    run_script(server, tmp_path, "interleaved", INTERLEAVED_SCRIPT, "--include", "__main__")
    stored = eventually(
        lambda: (
            (found := stored_requests(server.http, service="interleaved", limit="1000"))
            and len(found) >= 100
            and found
        ),
        timeout=30,
    )
    assert sorted(int(r["route"][1:]) for r in stored) == list(range(0, 200, 2))
    for summary in stored:
        n = int(summary["route"][1:])
        request = tree(server, summary["id"])
        names = [node["function"] for lane in request["lanes"] for node in nodes(lane["root"])]
        assert names[1:] == ["__main__:work"] + ["__main__:leaf"] * (n % 7 + 1), n
        assert summary["truncated"] is False
