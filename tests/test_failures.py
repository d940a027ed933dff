"""When things break: the Flask app under gunicorn (2 workers) and `profiler-host run`, a
real profiler-server process on loopback, and the server or a worker going away mid-traffic.
The app always serves; what fits the host's buffer arrives once; the rest is counted."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx

from tests.helpers import eventually, metric_value, nodes, stored_requests
from tests.processes import GUNICORN, HttpProcess, ServerProcess, free_port, serve_profiled
from tests.test_host_e2e import tree

FLASK = [*GUNICORN, "profiling_target.wsgi:app"]
T = TypeVar("T")


def get_orders(app: HttpProcess, count: int, pause: float = 0) -> list[int]:
    """Status codes of `count` GETs of /orders/N, one after another."""
    statuses = []
    for n in range(1, count + 1):
        statuses.append(httpx.get(f"{app.url}/orders/{n}", timeout=30).status_code)
        time.sleep(pause)
    return statuses


def traffic_stored(server: ServerProcess, service: str) -> list[dict]:
    """The service's stored requests but the readiness probes (/health). By service, not by
    route: a request that spans a host flush is announced with its raw path (/orders/7)."""
    return [r for r in stored_requests(server.http, service=service) if r["route"] != "/health"]


def in_background(fn: Callable[[], T]) -> Future[T]:
    """Runs fn in a thread of its own (it must end by itself: every call in it is bounded)."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future


def database(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'profiles.db'}"


def errors(log: Path) -> list[str]:
    """ERROR lines the servers logged (a dead peer is routine, not an error)."""
    return [line for line in log.read_text().splitlines() if " ERROR " in line]


def test_profiles_recorded_while_the_server_is_down_arrive_once_it_is_up(tmp_path: Path):
    port = free_port()
    log = tmp_path / "server.log"
    app = serve_profiled(f"127.0.0.1:{port}", tmp_path, "outage", *FLASK)
    server = None
    try:
        assert get_orders(app, 30) == [200] * 30  # nobody listens: the app serves as usual
        server = ServerProcess(database(tmp_path), log, grpc_port=port)
        # the hosts retry with backoff (0.5 s, doubling): within seconds of the server coming up
        stored = eventually(lambda: len(traffic_stored(server, "outage")) == 30, timeout=40)
        assert stored, len(traffic_stored(server, "outage"))
        assert metric_value(server.http, "profiler_host_dropped_requests_total") == 0
    finally:
        app.stop(grace=15)
        if server is not None:
            server.stop(grace=10)
    assert errors(log) == []


def test_server_killed_and_restarted_mid_traffic_loses_only_what_was_counted(tmp_path: Path):
    """A 512 KiB buffer per worker holds part of the outage's requests; the others are
    dropped and counted, and the hosts tell the restarted server how many. Batches the
    killed server stored but could not ack are resent and stored once. (The budget admits a
    request by an upper estimate of its encoded size, about twice what it takes: 128 KiB
    admitted fewer of a worker's paced requests than finish in one flush interval, so
    requests were dropped before the kill.) Besides the paced traffic that spans the kill
    and the restart, a burst sent while the server is down overflows the buffers however
    slowly the machine serves."""
    log = tmp_path / "server.log"
    server = ServerProcess(database(tmp_path), log)
    options = ("--sample-rate", "1000", "--buffer", "512KiB")
    app = serve_profiled(server, tmp_path, "restart", *FLASK, options=options)
    paced, burst = 300, 400
    sent = paced + burst
    try:
        statuses = in_background(lambda: get_orders(app, paced, pause=0.02))
        time.sleep(1.5)
        assert metric_value(server.http, "profiler_host_dropped_requests_total") == 0
        before = len(traffic_stored(server, "restart"))
        server.kill()  # kill -9: nothing drained
        assert get_orders(app, burst) == [200] * burst
        server = ServerProcess(database(tmp_path), log, grpc_port=server.grpc_port)
        assert statuses.result(timeout=60) == [200] * paced

        def accounted() -> tuple[list[dict], float] | None:
            stored = traffic_stored(server, "restart")
            dropped = metric_value(server.http, "profiler_host_dropped_requests_total")
            return (stored, dropped) if len(stored) + dropped == sent else None

        settled = eventually(accounted, timeout=40)
        assert settled, (
            len(traffic_stored(server, "restart")),
            metric_value(server.http, "profiler_host_dropped_requests_total"),
        )
    finally:
        app.stop(grace=15)
        server.stop(grace=10)
    stored, dropped = settled
    assert len({r["id"] for r in stored}) == len(stored)  # each request once
    assert 0 < before < len(stored)  # stored before the kill and after the restart
    assert dropped > 0  # the outage overflowed the buffer: counted, not silently lost
    assert errors(log) == []


def worker_pids(master: int) -> list[int]:
    """The processes a gunicorn master forked (Linux: /proc/PID/task/PID/children)."""
    return [int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split()]


def test_killed_worker_leaves_its_open_requests_stored_truncated(tmp_path: Path):
    """kill -9 of both workers while each sleeps in a sampled /slow request: the server
    holds what was streamed and, once the stream is dead for --stream-timeout, stores it."""
    log = tmp_path / "server.log"
    server = ServerProcess(database(tmp_path), log, "--stream-timeout", "1s")
    app = serve_profiled(server, tmp_path, "killed", *FLASK)
    try:
        # the readiness probe is sampled too: until it is stored it counts as open
        settled = eventually(
            lambda: (
                stored_requests(server.http, route="/health")
                and metric_value(server.http, "profiler_ingest_open_requests") == 0
            ),
            timeout=20,
        )
        assert settled
        slow = [
            in_background(lambda: httpx.get(f"{app.url}/slow?ms=10000", timeout=60))
            for _ in range(2)
        ]
        # one per worker, inside call_slow_upstream; running requests stream as they record
        open_requests = eventually(
            lambda: metric_value(server.http, "profiler_ingest_open_requests") == 2, timeout=20
        )
        assert open_requests
        for pid in worker_pids(app.proc.pid):
            os.kill(pid, signal.SIGKILL)
        for response in slow:
            assert isinstance(response.exception(timeout=30), httpx.TransportError)
        stored = eventually(
            lambda: len(stored_requests(server.http, route="/slow")) == 2, timeout=20
        )
        assert stored, stored_requests(server.http)
        trees = [tree(server, r["id"]) for r in stored_requests(server.http, route="/slow")]
        died = metric_value(server.http, "profiler_ingest_rejected_total", reason="stream_died")
        assert httpx.get(f"{app.url}/health", timeout=30).status_code == 200  # new workers
    finally:
        app.stop(grace=15)
        server.stop(grace=10)
    assert died >= 2
    assert errors(log) == []
    for request in trees:
        assert request["truncated"] is True
        calls = nodes(request["lanes"][0]["root"])
        sleeping = [
            n for n in calls if n["function"] == "profiling_target.delays:call_slow_upstream"
        ]
        assert [n["outcome"] for n in sleeping] == ["truncated"]
