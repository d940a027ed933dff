"""Every request counted, sampled or not: hosts report counts per route and status class
with a duration histogram, the server keeps them per minute and answers `/api/routes` and
`profiler_requests_total` from them."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from profiler_core.latency import BUCKETS, FACTOR, bucket
from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_host.functions import FunctionRegistry
from profiler_host.transport import Transport, TransportSettings
from profiler_server.loadgen import HostStream, hello
from tests.helpers import eventually, metric_value, stored_requests
from tests.processes import GUNICORN, UVICORN, serve_profiled

SLOW_MS = 40
APPS = {
    "flask": ([*GUNICORN, "profiling_target.wsgi:app"], "/products/<int:product_id>", "/slow"),
    "starlette": (UVICORN, "/products/{product_id:int}", "/slow"),
}


def _routes(server, service: str, since: float | None = None) -> dict[str, dict]:
    params = {"service": service} if since is None else {"service": service, "since": str(since)}
    answer = server.get("/api/routes", **params).json()
    return {r["route"]: r for r in answer["routes"]}


@pytest.mark.parametrize("app_name", list(APPS))
def test_every_request_is_counted_sampled_or_not(server, tmp_path: Path, app_name: str):
    command, product_route, slow_route = APPS[app_name]
    service = f"counted-{app_name}"
    # the first request of each route sampled, then hardly any
    options = ("--sample-rate", "0.1", "--route-interval", "1h")
    app = serve_profiled(server, tmp_path, service, *command, options=options)
    sent = {product_route: 0, slow_route: 0, "(unmatched)": 0}
    slow_latencies = []
    # a host stamps its counts when it reports them (every few seconds), a sampled request
    # is stored by its start: near a minute's end they fall in different minutes
    since = time.time() - 120

    def complete() -> dict | None:
        # counts and sampled requests travel separately: wait for both
        routes = _routes(server, service, since)
        done = all(
            routes.get(r, {}).get("requests") == n and routes[r]["sampled"] >= 1
            for r, n in sent.items()
        )
        return routes if done else None

    try:
        with httpx.Client(base_url=app.url, timeout=30) as client:
            for i in range(60):
                assert client.get(f"/products/{i % 5 + 1}").status_code == 200
                sent[product_route] += 1
            for _ in range(8):
                started = time.perf_counter()
                assert client.get("/slow", params={"ms": SLOW_MS}).status_code == 200
                slow_latencies.append(time.perf_counter() - started)
                sent[slow_route] += 1
            for i in range(7):
                assert client.get(f"/no/such/page/{i}").status_code == 404
                sent["(unmatched)"] += 1
        # the counts go out every few seconds while the app runs (uvicorn ends on SIGTERM
        # without running exit handlers, so what a host counts last may never be sent)
        routes = eventually(complete, timeout=30)
    finally:
        app.stop(grace=15)
    assert routes, f"counts {_routes(server, service, since)} != sent {sent}"
    for route, count in sent.items():
        row = routes[route]
        assert row["errors"] == 0
        assert 1 <= row["sampled"] < count  # a few sampled, all counted
        assert row["sampled_share"] == row["sampled"] / count
        assert row["rate_per_s"] > 0
    sampled = stored_requests(server.http, service=service)
    routes = _routes(server, service, since)  # the app has stopped: every sampled request is stored
    assert sum(routes[r]["sampled"] for r in sent) == len(
        [s for s in sampled if s["route"] in sent]
    )
    slow = routes[slow_route]
    # each duration is at least SLOW_MS and at most what the client waited
    low, high = SLOW_MS / 1e3, max(slow_latencies)
    for q in ("p50_ms", "p95_ms", "p99_ms"):
        assert low / FACTOR <= slow[q] / 1e3 <= high * FACTOR, (q, slow[q], low, high)
    assert low <= slow["mean_ms"] / 1e3 <= high
    for route, count in sent.items():
        status_class = "4xx" if route == "(unmatched)" else "2xx"
        labels = {"service": service, "route": route}
        assert metric_value(server.http, "profiler_requests_total", **labels) == count
        assert (
            metric_value(
                server.http, "profiler_requests_total", status_class=status_class, **labels
            )
            == count
        )
        assert (
            metric_value(server.http, "profiler_all_request_duration_seconds_count", **labels)
            == count
        )


def test_a_host_that_samples_nothing_sends_its_counts_and_flushes_them_at_stop(server):
    """The first count starts the transport thread; stop() sends what is left at once."""
    transport = Transport(TransportSettings(server.target, "unsampled"), FunctionRegistry(), list)
    for status in (200, 200, 503):
        transport.counts.add("/only/counted", "GET", status, 3_000_000)
    assert transport.stop(timeout=20)
    (row,) = _routes(server, "unsampled").values()
    assert (row["requests"], row["errors"], row["sampled"]) == (3, 1, 0)


def _entry(route: str, status_class: int, durations_ns: list[int]) -> ingest_pb2.RouteCount:
    buckets = [0] * BUCKETS
    for d in durations_ns:
        buckets[bucket(d)] += 1
    return ingest_pb2.RouteCount(
        route=route,
        method="GET",
        status_class=status_class,
        count=len(durations_ns),
        duration_ns_sum=sum(durations_ns),
        buckets=buckets,
    )


def test_reported_counts_are_stored_once_and_bad_entries_rejected(server):
    good = [
        _entry("/a", 2, [10_000_000] * 90),
        _entry("/a", 5, [200_000_000] * 10),
        _entry("/b", 4, [1_000_000] * 3),
        _entry("/n\x00l", 2, [1]),  # made storable: U+FFFD, as in a sampled request's route
        _entry("/" + "x" * 600, 2, [1]),  # longer than a stored route: cut, ending in …
    ]
    bad = [
        ingest_pb2.RouteCount(route="/c", method="GET", status_class=2, count=2, buckets=[2]),
        _entry("/c", 9, [1]),  # no such status class
    ]
    wrong_sum = _entry("/c", 2, [1, 1])
    wrong_sum.count = 3
    stream = HostStream(server.target)
    stream.send_hello(hello("counted"))
    builder = BatchBuilder()
    builder.route_counts(
        ingest_pb2.RouteCounts(wall_ns=time.time_ns(), routes=[*good, *bad, wrong_sum])
    )
    batch = builder.build(1)
    stream.send_batch(batch)
    assert stream.wait_acked({1})
    stream.send_batch(batch)  # resent after a reconnect: stored once
    assert stream.wait_acked({1})
    stream.close()

    routes = _routes(server, "counted")
    assert set(routes) == {"/a", "/b", "/n\ufffdl", "/" + "x" * 498 + "…"}
    a = routes["/a"]
    assert (a["requests"], a["errors"], a["error_rate"]) == (100, 10, 0.1)
    assert 10 / FACTOR <= a["p50_ms"] <= 10 * FACTOR
    assert 200 / FACTOR <= a["p99_ms"] <= 200 * FACTOR
    assert a["sampled"] == 0 and a["sampled_share"] == 0
    assert routes["/b"]["requests"] == 3 and routes["/b"]["errors"] == 0
    assert metric_value(server.http, "profiler_requests_total", route="/a") == 100
    assert metric_value(server.http, "profiler_requests_total", status_class="5xx") == 10
    rejected = metric_value(server.http, "profiler_ingest_rejected_total", reason="bad_route_count")
    assert rejected == 3
    for repaired in ("unstorable_text", "long_name"):
        assert metric_value(server.http, "profiler_ingest_rejected_total", reason=repaired) == 1


def test_a_range_without_counts_answers_no_routes(server):
    answer = server.get("/api/routes", service="nobody", since="2020-01-01T00:00:00Z").json()
    assert answer["routes"] == []
    assert server.get("/api/routes", limit="0").status_code == 400
