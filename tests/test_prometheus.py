"""A real Prometheus scrapes a real server: what users query there (sums over stacks, per
route, per function) equals what the server stored, the scrape never fails (not even with
label_value_length_limit: 2048 and deep non-ASCII stacks), and no counter ever resets (not
even when retention deletes every row).

Both backends (a run costs ~10 s): the stored totals it compares with come from each.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from profiler_core.model import EventKind
from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch
from profiler_server.storage.retention import delete_expired
from tests.prometheus_server import running_prometheus

ENTER = int(EventKind.ENTER)
EXIT = int(EventKind.EXIT)
TOP_K = 5
DEEP = 30  # frames of ~100 Cyrillic characters: ~6 KB of UTF-8 per full stack


def deep_request(builder: BatchBuilder, rid: int) -> None:
    """One call chain DEEP frames deep, names 2 bytes per character. Frame i has i ms of self
    time (the leaf 2*DEEP), far above the synthetic stacks: the deepest are the top-k."""
    for i in range(1, DEEP + 1):
        builder.function(100 + i, "модуль", f"функция_{i:02d}_" + "я" * 90, "app.py", i)
    t0 = time.monotonic_ns()
    ms = 1_000_000
    enters = [t0 + ms * sum(range(i)) // 2 for i in range(1, DEEP + 1)]  # gaps of (i-1)/2 ms
    leaf_exit = enters[-1] + 2 * DEEP * ms
    exits = [leaf_exit + ms * (sum(range(DEEP)) - sum(range(i))) // 2 for i in range(DEEP, 0, -1)]
    chain = [100 + i for i in range(1, DEEP + 1)]
    calls = list(range(1, DEEP + 1))
    kinds = bytes([ENTER] * DEEP + [EXIT] * DEEP)
    builder.start(rid, "/deep", "GET", t0)
    builder.run(rid, 0, kinds, chain + chain[::-1], calls + calls[::-1], enters + exits)
    builder.end(rid, exits[-1] + ms, 200)


def stored(server) -> tuple[dict[str, float], int, dict[str, int], int]:
    """What the server stored: self seconds per route, calls, calls per function, requests."""
    per_route: dict[str, float] = {}
    calls = 0
    for route in ("/items/{id}", "/users/{id}", "/deep"):
        body = server.get("/api/flamegraph", format="json", route=route, value="running").json()
        per_route[route] = sum(s["value"] for s in body["stacks"]) * 1e-9
        calls += sum(s["calls"] for s in body["stacks"])
    functions = {
        f["function"]: f["calls"] for f in server.get("/api/functions").json()["functions"]
    }
    requests = len(server.get("/api/requests", limit="1000").json()["requests"])
    return per_route, calls, functions, requests


def wipe(server) -> None:
    """Retention with a cutoff a year ahead: every stored row goes."""
    for _ in range(100):
        n = delete_expired(
            server.server.engine,
            cutoff_ns=time.time_ns() + 365 * 86400 * 10**9,
            dedup_cutoff=time.time() + 3600,
        )
        if n == 0:
            break
    assert server.get("/api/requests").json()["requests"] == []


def test_prometheus_sums_are_the_stored_totals(start_server, db_url, tmp_path) -> None:
    server = start_server(db_url, top_k=TOP_K)
    shape = CallShape(calls=50, depth=6, functions=12)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))

    expected_route: dict[str, float] = defaultdict(float)
    expected_functions: dict[str, int] = defaultdict(int)
    expected_calls = expected_requests = 0
    with running_prometheus([f"127.0.0.1:{server.server.http_port}"], tmp_path / "prom") as prom:
        for round_ in range(1, 4):
            builder = BatchBuilder()
            base = round_ * 100
            synthetic_batch(builder, shape, range(base, base + 3), route="/items/{id}")
            synthetic_batch(
                builder, shape, range(base + 10, base + 12), "/users/{id}", "GET", False
            )
            if round_ == 1:
                deep_request(builder, base + 50)
            stream.send_batch(builder.build(round_))
            assert stream.wait_acked({round_}, timeout=30) and round_ in stream.stored
            per_route, calls, functions, requests = stored(server)
            target_calls = expected_calls + calls

            # Prometheus has scraped everything once its sum reaches what was stored
            seen = prom.wait_for(
                lambda n=target_calls: prom.scalar("sum(profiler_stack_calls_total)") == n
            )
            assert seen, (
                f"round {round_}: Prometheus has {prom.query('sum(profiler_stack_calls_total)')}, "
                f"stored {target_calls}; targets {prom.targets()}\n{prom.log_text()}"
            )

            # what users query, against the stored totals (plus what retention deleted)
            self_total = prom.query("profiler_stack_self_seconds_total")
            assert self_total and all(r["metric"]["service"] == "shop" for r in self_total)
            summed = sum(float(r["value"][1]) for r in self_total)
            assert summed == pytest.approx(
                sum(expected_route.values()) + sum(per_route.values()), rel=1e-6
            )
            by_route = {
                r["metric"]["route"]: float(r["value"][1])
                for r in prom.query("sum by (route) (profiler_stack_self_seconds_total)")
            }
            assert by_route.keys() == {"/items/{id}", "/users/{id}", "/deep"}
            for route, seconds in by_route.items():
                assert seconds == pytest.approx(expected_route[route] + per_route[route], rel=1e-6)
            by_function = {
                r["metric"]["function"]: float(r["value"][1])
                for r in prom.query("sum by (function) (profiler_function_calls_total)")
            }
            for function, count in functions.items():
                assert by_function[function] == expected_functions[function] + count
            assert prom.scalar("sum(profiler_request_duration_seconds_count)") == (
                expected_requests + requests
            )
            # bounded: at most TOP_K stacks of their own, the rest in "(other)"
            stacks = prom.query(
                'count by (stack) (profiler_stack_self_seconds_total{service="shop"})'
            )
            labels = {r["metric"]["stack"] for r in stacks}
            assert len(labels - {"(other)"}) == TOP_K and "(other)" in labels

            if round_ == 2:  # retention deletes every row; the counters carry on
                for route, seconds in per_route.items():
                    expected_route[route] += seconds
                for function, count in functions.items():
                    expected_functions[function] += count
                expected_calls += calls
                expected_requests += requests
                wipe(server)

        # the scrape itself: healthy, never rejected (label limits), no counter ever reset
        assert prom.scalar('up{job="profiler"}') == 1
        assert prom.scalar('min_over_time(up{job="profiler"}[5m])') == 1
        (target,) = prom.targets()
        assert target["health"] == "up" and target["lastError"] == "", target
        assert prom.query('{__name__=~"profiler_.*_created"}') == []
        monotonic = prom.query(
            'group by (__name__) ({__name__=~"profiler_.+(_total|_count|_sum|_bucket)"})'
        )
        names = {r["metric"]["__name__"] for r in monotonic}
        assert {"profiler_stack_self_seconds_total", "profiler_function_calls_total"} <= names
        for name in names:
            assert prom.scalar(f"sum(resets({name}[5m]))") == 0, name
        assert prom.scalar('sum(profiler_ingest_batches_total{job="profiler"})') == 3
        assert prom.scalar("max_over_time(scrape_samples_scraped[5m])") > 0
        longest = max(len(s.encode()) for s in labels)
        assert 1000 < longest <= 2048  # the deep stack is exported, elided within the limit
    stream.close()
