"""Every request counted on the host, and the bucket percentiles both sides read."""

from __future__ import annotations

import threading

from profiler_core.latency import BOUNDS_NS, BUCKETS, FACTOR, bucket, percentile
from profiler_host.request_counts import MAX_ROUTES, MAX_WAITING, OTHER, RequestCounts


def test_buckets_hold_their_bounds():
    assert bucket(0) == 0
    assert bucket(BOUNDS_NS[0]) == 0
    assert bucket(BOUNDS_NS[0] + 1) == 1
    assert bucket(BOUNDS_NS[-1] + 1) == BUCKETS - 1


def test_percentile_within_a_bucket_of_the_truth():
    durations = [1_000_000 * (i + 1) for i in range(100)]  # 1..100 ms
    counts = [0] * BUCKETS
    for d in durations:
        counts[bucket(d)] += 1
    for q in (0.5, 0.95, 0.99):
        truth = sorted(durations)[int(q * len(durations)) - 1] / 1e9
        got = percentile(counts, q)
        assert got is not None
        assert truth / FACTOR <= got <= truth * FACTOR
    assert percentile([0] * BUCKETS, 0.5) is None


def test_counts_per_route_method_and_status_class_then_start_again():
    woken = []
    counts = RequestCounts(lambda: woken.append(1))
    for status in (200, 201, 404, 500, 503, 0):
        counts.add("/a", "GET", status, 2_000_000)
    counts.add("/b", "POST", 200, 5_000_000)
    assert woken == [1]  # once per report, not per request
    message = counts.take()
    assert message is not None and message.wall_ns > 0
    rows = {(r.route, r.method, r.status_class): r for r in message.routes}
    assert {k: r.count for k, r in rows.items()} == {
        ("/a", "GET", 2): 2,
        ("/a", "GET", 4): 1,
        ("/a", "GET", 5): 2,
        ("/a", "GET", 0): 1,
        ("/b", "POST", 2): 1,
    }
    b = rows[("/b", "POST", 2)]
    assert b.duration_ns_sum == 5_000_000
    assert list(b.buckets) == [1 if i == bucket(5_000_000) else 0 for i in range(BUCKETS)]
    assert counts.take() is None and not counts.pending


def test_routes_past_the_limit_count_as_other():
    counts = RequestCounts()
    for i in range(MAX_ROUTES + 50):
        counts.add(f"/r{i}", "GET", 200, 1)
    counts.add("/" + "x" * 600, "GET", 200, 1)
    counts.add("/r0", "A-VERY-LONG-HTTP-METHOD", 200, 1)
    message = counts.take()
    assert message is not None
    routes = {(r.route, r.method): r.count for r in message.routes}
    assert routes[(OTHER, "GET")] == 51
    assert routes[("/r0", OTHER)] == 1
    assert len({r for r, _ in routes}) == MAX_ROUTES + 1


def test_threads_lose_no_count():
    counts = RequestCounts()
    taken = []

    def serve():
        for _ in range(2000):
            counts.add("/t", "GET", 200, 1000)

    def report():
        for _ in range(50):
            message = counts.take()
            if message is not None:
                taken.extend(r.count for r in message.routes)

    threads = [threading.Thread(target=serve) for _ in range(4)] + [threading.Thread(target=report)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report()
    assert sum(taken) == 8000


def test_requests_past_the_waiting_bound_are_lost_and_counted():
    counts = RequestCounts()
    for _ in range(MAX_WAITING + 7):
        counts.add("/w", "GET", 200, 1)
    assert counts.lost == 7
    message = counts.take()
    assert message is not None and [r.count for r in message.routes] == [MAX_WAITING]
