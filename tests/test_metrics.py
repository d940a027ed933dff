"""/metrics as a user reads it: hosts stream known requests to a real server, we scrape
GET /metrics, parse it with prometheus_client's own parser and compare with what the server
stored (the JSON API: flame graph, functions, requests, trees)."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from profiler_core.latency import BUCKETS
from profiler_core.model import EventKind
from profiler_core.stacks import ELISION, MAX_LABEL_BYTES, SEPARATOR, label_value
from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.api import params, spec
from profiler_server.assembly import problems as P
from profiler_server.assembly.flatten import OUTSIDE_NAME
from profiler_server.assembly.totals import AWAITING, CALLS, READYING, SELF, WIDTH, Totals
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch
from profiler_server.metrics import health
from profiler_server.metrics.profiles import OTHER, ProfileMetrics, TopK
from profiler_server.storage.retention import delete_expired
from profiler_server.storage.writer import StoredRequests
from tests.helpers import eventually

ENTER = int(EventKind.ENTER)
EXIT = int(EventKind.EXIT)
NS = 1e-9
STACK_SELF = "profiler_stack_self_seconds_total"
STACK_CALLS = "profiler_stack_calls_total"


# --- helpers ---------------------------------------------------------------------------------
def approx(value: float) -> Any:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


class Scrape:
    """One GET /metrics, parsed by prometheus_client's parser."""

    def __init__(self, server) -> None:
        response = server.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        self.text = response.text
        self.families = list(text_string_to_metric_families(self.text))
        self.samples: list[Sample] = [s for f in self.families for s in f.samples]

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def total(self, name: str, **labels: str) -> float:
        return sum(s.value for s in self.select(name, **labels))

    def by(self, label: str, name: str, **labels: str) -> dict[str, float]:
        """Values of `name` keyed by one label (summed over the others)."""
        out: dict[str, float] = defaultdict(float)
        for s in self.select(name, **labels):
            out[s.labels[label]] += s.value
        return dict(out)

    def monotonic(self) -> dict[tuple, float]:
        """Every sample that must never decrease: counters and histogram parts."""
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in self.families
            if f.type in ("counter", "histogram")
            for s in f.samples
        }


class Host:
    """One host session over a real gRPC stream; each send waits for its ack (stored)."""

    def __init__(self, server, service: str) -> None:
        self.stream = HostStream(server.target)
        self.hello = hello(service)
        self.stream.send_hello(self.hello)
        self.seq = 0
        self.events = 0
        self.bytes = len(ingest_pb2.HostMessage(hello=self.hello).SerializeToString())
        self.batches: list[ingest_pb2.Batch] = []

    def send(self, builder: BatchBuilder) -> ingest_pb2.Batch:
        self.seq += 1
        batch = builder.build(self.seq)
        self.events += builder.event_count
        self.resend(batch)
        self.batches.append(batch)
        return batch

    def resend(self, batch: ingest_pb2.Batch) -> None:
        self.bytes += len(ingest_pb2.HostMessage(batch=batch).SerializeToString())
        self.stream.send_batch(batch)
        assert self.stream.wait_acked({batch.seq}, timeout=30)
        assert batch.seq in self.stream.stored

    def close(self) -> None:
        self.stream.close()


def define(builder: BatchBuilder, functions: dict[int, str]) -> None:
    for fid, name in functions.items():
        module, _, qualname = name.partition(":")
        builder.function(fid, module, qualname, "app.py", fid)


def flat_request(builder: BatchBuilder, rid: int, route: str, calls: list[tuple[int, int]]) -> None:
    """A request whose root calls `calls` = [(fid, self ns)] one after the other."""
    t0 = time.monotonic_ns()
    kinds, fids, ids, times = bytearray(), [], [], []
    t = t0
    for call, (fid, self_ns) in enumerate(calls, 1):
        kinds += bytes([ENTER, EXIT])
        fids += [fid, fid]
        ids += [call, call]
        times += [t + 1_000, t + 1_000 + self_ns]
        t += 1_000 + self_ns
    builder.start(rid, route, "GET", t0)
    builder.run(rid, 0, kinds, fids, ids, times)
    builder.end(rid, t + 1_000, 200)


def chain_request(builder: BatchBuilder, rid: int, route: str, chain: list[int]) -> None:
    """A request of one call chain: chain[0] calls chain[1] ... calls chain[-1]."""
    t0 = time.monotonic_ns()
    order = chain + chain[::-1]
    kinds = bytes([ENTER] * len(chain) + [EXIT] * len(chain))
    calls = list(range(1, len(chain) + 1))
    calls += calls[::-1]
    times = [t0 + 1_000 * (i + 1) for i in range(len(order))]
    builder.start(rid, route, "GET", t0)
    builder.run(rid, 0, kinds, order, calls, times)
    builder.end(rid, times[-1] + 1_000, 200)


def flamegraph(server, **params: str) -> dict[str, tuple[int, int]]:
    """Running time (what profiler_stack_self_seconds counts) and calls per stack."""
    body = server.get("/api/flamegraph", format="json", **{"value": "running", **params}).json()
    return {s["stack"]: (s["value"], s["calls"]) for s in body["stacks"]}


def stored_requests(server, **params: str) -> list[dict]:
    return server.get("/api/requests", limit="1000", **params).json()["requests"]


def tree_totals(server, request_id: str) -> tuple[int, int]:
    """(self ns, calls) over a stored request's call tree: the lane roots' self time (on the
    `(outside profiled calls)` stacks) included, the roots not counted as calls."""
    body = server.get(f"/api/requests/{request_id}").json()
    self_ns = sum(lane["root"]["self_ns"] for lane in body["lanes"])
    calls = 0
    work = [child for lane in body["lanes"] for child in lane["root"]["children"]]
    while work:
        node = work.pop()
        self_ns += node["self_ns"]
        calls += 1
        work.extend(node["children"])
    return self_ns, calls


# --- unit: label values and top-k ------------------------------------------------------------
def test_label_value_keeps_short_signatures() -> None:
    sig = "app.views:index;app.db:query"
    assert label_value(sig) == sig
    exact = ";".join(["m:" + "f" * 100] * 19) + ";" + "m:" + "g" * (2048 - 19 * 103 - 2)
    assert len(exact) == MAX_LABEL_BYTES
    assert label_value(exact) == exact


def test_label_value_elides_the_middle_of_deep_stacks() -> None:
    frames = [f"app.mod{i:02d}:" + f"fn{i:02d}_".ljust(100, "x") for i in range(40)]
    sig = SEPARATOR.join(frames)
    assert len(sig) > 2 * MAX_LABEL_BYTES
    value = label_value(sig)
    assert len(value) <= MAX_LABEL_BYTES
    parts = value.split(SEPARATOR)
    cut = parts.index(ELISION)
    head, tail = parts[:cut], parts[cut + 1 :]
    # the root (where the request entered) and the leaf (where time is spent) survive,
    # as a contiguous prefix and suffix of the frames
    assert head == frames[: len(head)] and head[0] == frames[0]
    assert tail == frames[len(frames) - len(tail) :] and tail[-1] == frames[-1]
    assert len(head) + len(tail) < len(frames)
    assert len(tail) >= len(head) >= len(tail) - 1


def test_label_value_is_bounded_for_every_length() -> None:
    for depth in range(1, 60):
        for width in (1, 7, 50, 101, 700, 3000):
            sig = SEPARATOR.join(f"m{i}:" + "q" * width for i in range(depth))
            for limit in (64, 1000, MAX_LABEL_BYTES):
                value = label_value(sig, limit)
                assert len(value) <= limit, (depth, width, limit)
                assert value == sig or ELISION in value
    leaf = "m:" + "z" * 5000  # one frame longer than the limit: its end is kept
    value = label_value(leaf)
    assert len(value) <= MAX_LABEL_BYTES and value.endswith("z" * 100)


def test_stack_labels_are_bounded_in_utf8_bytes() -> None:
    """Prometheus' label_value_length_limit and Mimir count bytes, not characters."""
    frames = [f"модуль:функция_{i:02d}_" + "я" * 90 for i in range(40)]
    for depth in (10, 19, 40):
        sig = SEPARATOR.join(frames[:depth])
        assert len(sig) > 1024 and len(sig.encode()) > MAX_LABEL_BYTES
        value = label_value(sig)
        assert len(value.encode()) <= MAX_LABEL_BYTES
        assert value.startswith(frames[0]) and value.endswith(frames[depth - 1])
    long_leaf = "m:" + "ж" * 3000
    assert len(label_value(long_leaf).encode()) <= MAX_LABEL_BYTES
    ascii_leaf = "m:" + "z" * 3000  # ELISION is 3 bytes
    assert len(label_value(ascii_leaf).encode()) <= MAX_LABEL_BYTES


def test_top_k_fills_every_place_and_membership_is_sticky() -> None:
    top = TopK(3)
    assert top.admit("A", 100) is None and top.admit("B", 90) is None  # candidates
    top.promote()
    assert top.members == {"A", "B"}
    # a place is left: later candidates must get it (stale candidates A and B used to
    # take it again at every promote, keeping membership below k forever)
    assert top.admit("A", 1000) is True
    assert top.admit("C", 1) is None and top.admit("D", 2) is None
    top.promote()
    assert top.members == {"A", "B", "D"}
    # full: membership never changes, however heavy a newcomer is
    assert top.admit("C", 10**12) is False
    top.promote()
    assert top.members == {"A", "B", "D"}


def test_top_k_candidates_are_bounded() -> None:
    top = TopK(2)
    for i in range(1000):
        top.admit(f"s{i}", i)
        top.prune()
        assert len(top.candidates) <= 20
    top.promote()
    assert top.members == {"s999", "s998"}


def test_profile_collector_describes_without_collecting() -> None:
    """auto_describe registries call collect() at registration unless describe() exists."""
    calls: list[str] = []

    class Spy(ProfileMetrics):
        def collect(self):
            calls.append("collect")
            return super().collect()

    registry = CollectorRegistry(auto_describe=True)
    Spy(registry, top_k=3, max_functions=3, max_routes=3)
    assert calls == []
    names = {m.name for m in registry.collect()}
    assert {"profiler_stack_self_seconds", "profiler_request_duration_seconds"} <= names
    assert calls == ["collect"]


def test_stack_waits_are_series_of_their_own_within_the_same_top_k() -> None:
    """A stack that mostly awaits ranks by its wall time, and its waits are its own series
    by state; the stack that lost its place goes to `(other)` in every series."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = ProfileMetrics(registry, top_k=1, max_functions=10, max_routes=10)
    row = {"service": "shop", "route": "/slow", "duration_ns": 2_000}
    values = np.zeros((WIDTH, 2), dtype=np.int64)
    values[CALLS] = 1
    values[SELF] = (500, 10)  # stack 1 runs 500 ns; stack 2 runs 10, awaits 900, ready 90
    values[AWAITING] = (0, 900)
    values[READYING] = (0, 90)
    owner = np.zeros(2, dtype=np.int64)
    stacks = Totals(owner, np.array([1, 2]), values)
    names = {1: "app:busy", 2: "app:sleepy"}
    none = Totals(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), values[:, :0])
    metrics.record(StoredRequests([row], [b""], stacks, none, {}, names.get))
    samples = [s for family in registry.collect() for s in family.samples]

    def series(name: str) -> dict[tuple[str, ...], float]:
        return {
            (s.labels["stack"], *([s.labels["state"]] if "state" in s.labels else [])): s.value
            for s in samples
            if s.name == name
        }

    assert series(STACK_SELF) == {("app:sleepy",): approx(10e-9), (OTHER,): approx(500e-9)}
    assert series("profiler_stack_wait_seconds_total") == {
        ("app:sleepy", "awaiting"): approx(900e-9),
        ("app:sleepy", "ready"): approx(90e-9),
    }


def test_route_service_and_function_labels_are_bounded() -> None:
    """Routes (a raw path when the framework has no template), services and function names
    come from hosts; each label value stays within the limit, in UTF-8 bytes."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = ProfileMetrics(registry, top_k=10, max_functions=10, max_routes=10)
    long_route = "/r" + "r" * 3000
    service = "s" + "ß" * 1500
    function = "m:" + "ф" * 1500
    row = {"service": service, "route": long_route, "duration_ns": 1_000_000}
    totals = [1, 500, 400, 500, 0, 0, 500, 500, 0, 0]  # totals.py columns
    one = np.zeros(1, dtype=np.int64)
    stored = StoredRequests(
        [row],
        [b""],
        Totals(one, one + 1, np.array([totals], dtype=np.int64).T),
        Totals(one, one + 7, np.array([totals], dtype=np.int64).T),
        {1: (0, 7)},
        {1: function}.get,
        {7: function},
    )
    metrics.record(stored)
    samples = [s for family in registry.collect() for s in family.samples]
    values = {k: v for s in samples for k, v in s.labels.items() if k != "le"}
    assert {"service", "route", "stack", "function"} <= values.keys()
    for s in samples:
        for value in s.labels.values():
            assert len(value.encode()) <= MAX_LABEL_BYTES, (s.name, value[:40])
    assert values["route"].startswith("/rrrr") and values["route"].endswith(ELISION)
    assert values["service"].startswith("sßß") and values["function"].startswith("m:фф")
    total = sum(s.value for s in samples if s.name == STACK_SELF)
    assert total == approx(400 * NS)


# --- end to end --------------------------------------------------------------------------------
def test_metrics_are_the_stored_totals(server) -> None:
    shape = CallShape(calls=60, depth=6, functions=12)
    host = Host(server, "shop")
    builder = BatchBuilder()
    synthetic_batch(builder, shape, range(1, 6), route="/items/{id}")
    host.send(builder)
    builder = BatchBuilder()
    synthetic_batch(builder, shape, range(6, 9), route="/users/{id}", define_functions=False)
    host.send(builder)
    scrape = Scrape(server)

    # no `_created` series (they would double every counter and histogram)
    assert not [s.name for s in scrape.samples if s.name.endswith("_created")]
    assert "_created" not in scrape.text

    # stacks: each stack its own series (fewer than --top-k), self time and calls exactly
    # the stored flame graph, per route; sums over stacks are the true totals
    requests = stored_requests(server, service="shop")
    assert len(requests) == 8
    all_self = all_calls = 0
    for route, count in (("/items/{id}", 5), ("/users/{id}", 3)):
        stored = flamegraph(server, service="shop", route=route)
        assert stored
        self_series = scrape.by("stack", STACK_SELF, service="shop", route=route)
        calls_series = scrape.by("stack", STACK_CALLS, service="shop", route=route)
        assert OTHER not in self_series
        assert set(self_series) == set(stored)
        for stack, (self_ns, calls) in stored.items():
            assert self_series[stack] == approx(self_ns * NS)
            assert calls_series[stack] == calls
        route_self = sum(v[0] for v in stored.values())
        assert sum(self_series.values()) == approx(route_self * NS)
        assert sum(calls_series.values()) == count * shape.calls
        all_self += route_self
        all_calls += sum(v[1] for v in stored.values())
    assert scrape.total(STACK_SELF, service="shop") == approx(all_self * NS)
    assert scrape.total(STACK_CALLS) == all_calls == 8 * shape.calls
    # ... and the same as summing every stored call tree (a path that skips the aggregates)
    trees = [tree_totals(server, r["id"]) for r in requests]
    assert sum(t[0] for t in trees) == all_self
    assert sum(t[1] for t in trees) == all_calls == sum(r["calls"] for r in requests)

    # functions: calls, inclusive, self, active, longest call = /api/functions
    stored_fns = {f["function"]: f for f in server.get("/api/functions").json()["functions"]}
    assert len(stored_fns) == shape.functions
    metric = {
        key: scrape.by("function", f"profiler_function_{key}", service="shop")
        for key in ("calls_total", "seconds_total", "self_seconds_total", "active_seconds_total")
    }
    longest = scrape.by("function", "profiler_function_max_seconds", service="shop")
    assert set(metric["calls_total"]) == set(stored_fns)
    for name, f in stored_fns.items():
        assert metric["calls_total"][name] == f["calls"] > 0
        assert metric["seconds_total"][name] == approx(f["total_ns"] * NS)
        assert metric["self_seconds_total"][name] == approx(f["self_ns"] * NS)
        assert metric["active_seconds_total"][name] == approx(f["active_ns"] * NS)
        assert longest[name] == approx(f["max_ns"] * NS)
        assert f["max_ns"] > 0
    assert sum(metric["calls_total"].values()) == all_calls
    # functions' self time is the stacks' but the time outside profiled calls (no function's)
    outside = sum(
        n
        for route in ("/items/{id}", "/users/{id}")
        for stack, (n, _) in flamegraph(server, service="shop", route=route).items()
        if stack.endswith(OUTSIDE_NAME)
    )
    assert 0 < outside < all_self
    assert sum(metric["self_seconds_total"].values()) == approx((all_self - outside) * NS)

    # request durations: one observation per stored request, per route
    for route, count in (("/items/{id}", 5), ("/users/{id}", 3)):
        labels = {"service": "shop", "route": route}
        durations = [r["duration_ms"] / 1000 for r in requests if r["route"] == route]
        assert scrape.total("profiler_request_duration_seconds_count", **labels) == count
        assert scrape.total("profiler_request_duration_seconds_sum", **labels) == pytest.approx(
            sum(durations), rel=1e-6
        )
        inf = scrape.select("profiler_request_duration_seconds_bucket", le="+Inf", **labels)
        assert [s.value for s in inf] == [count]
    host.close()


def test_health_metrics_move(server) -> None:
    before = Scrape(server)
    assert before.total("profiler_ingest_open_streams") == 0
    assert before.total("profiler_ingest_events_total") == 0
    host = Host(server, "shop")
    shape = CallShape(calls=30, depth=4, functions=6)
    for rids in (range(1, 4), range(4, 6)):
        builder = BatchBuilder()
        synthetic_batch(builder, shape, rids, define_functions=rids.start == 1)
        host.send(builder)
    host.resend(host.batches[0])  # a resent batch: acked, stored once, counted as duplicate
    other = HostStream(server.target)
    other_hello = hello("billing")
    other.send_hello(other_hello)
    other.send_raw(b"\xff\xff\xff")  # not a HostMessage
    garbage = 3 + len(ingest_pb2.HostMessage(hello=other_hello).SerializeToString())

    def settled() -> Scrape | None:
        s = Scrape(server)
        rejected = s.total("profiler_ingest_rejected_total", reason="garbage")
        return s if rejected and s.total("profiler_ingest_ack_lag_seconds_count") >= 3 else None

    scrape = eventually(settled)
    assert scrape, "rejected garbage / ack lag never showed up"
    assert scrape.total("profiler_ingest_events_total") == host.events > 0
    assert scrape.total("profiler_ingest_batches_total") == 3
    assert scrape.total("profiler_ingest_bytes_total") == host.bytes + garbage
    assert scrape.total("profiler_ingest_rejected_total", reason="duplicate_batch") == 1
    assert scrape.total("profiler_ingest_rejected_total", reason="garbage") == 1
    assert scrape.total("profiler_requests_stored_total", service="shop") == 5
    assert len(stored_requests(server, service="shop")) == 5  # the resend stored nothing
    assert scrape.total("profiler_ingest_open_streams") == 2
    assert scrape.total("profiler_storage_write_seconds_count") > 0
    assert scrape.total("profiler_storage_write_seconds_sum") > 0
    assert scrape.total("profiler_ingest_ack_lag_seconds_count") >= 3
    assert scrape.total("profiler_ingest_ack_lag_seconds_sum") > 0
    assert scrape.select("profiler_ingest_backlog_messages")
    assert scrape.total("profiler_ingest_open_requests") == 0
    units = {f.name: f.type for f in scrape.families if f.name.startswith("profiler_")}
    assert units["profiler_storage_write_seconds"] == "histogram"
    assert units["profiler_ingest_ack_lag_seconds"] == "histogram"

    host.close()
    other.close()
    closed = eventually(lambda: Scrape(server).total("profiler_ingest_open_streams") == 0)
    assert closed, "open streams gauge did not go back to 0"


def test_top_k_bounds_stack_series_with_sticky_membership(start_server, db_url) -> None:
    server = start_server(db_url, top_k=3)
    names = {i: f"app.views:handler_{chr(96 + i)}" for i in range(1, 10)}  # a .. i
    weight = {1: 60_000, 2: 50_000, 3: 40_000, 4: 30_000, 5: 20_000, 6: 10_000}
    shop = Host(server, "shop")
    builder = BatchBuilder()
    define(builder, names)
    flat_request(builder, 1, "/a", [(fid, weight[fid]) for fid in range(1, 7)])
    shop.send(builder)

    def stacks(scrape: Scrape, service: str) -> dict[str, float]:
        return scrape.by("stack", STACK_SELF, service=service)

    first = Scrape(server)
    series = stacks(first, "shop")
    heaviest = {names[1], names[2], names[3]}
    # 7 stacks: 3 members + the rest, the 1 µs gaps around the 6 calls (outside profiled
    # calls) among them
    assert set(series) == heaviest | {OTHER}
    assert series[OTHER] == approx((30_000 + 20_000 + 10_000 + 7 * 1_000) * NS)
    assert sum(series.values()) == approx((sum(weight.values()) + 7 * 1_000) * NS)
    assert first.by("stack", STACK_CALLS, service="shop")[OTHER] == 3

    # later, non-members get far heavier (and a new stack appears): membership stays
    builder = BatchBuilder()
    flat_request(builder, 2, "/a", [(6, 1_000_000_000), (7, 2_000_000_000), (1, 5_000)])
    shop.send(builder)
    # a second service has its own top-k
    billing = Host(server, "billing")
    builder = BatchBuilder()
    define(builder, names)
    flat_request(builder, 1, "/pay", [(7, 9_000), (8, 8_000), (9, 7_000), (1, 1_000)])
    billing.send(builder)

    for _ in range(3):  # every later scrape: the same members
        later = Scrape(server)
        now = stacks(later, "shop")
        assert set(now) == heaviest | {OTHER}
        assert now[names[1]] == approx((60_000 + 5_000) * NS)
        assert now[names[2]] == series[names[2]] and now[names[3]] == series[names[3]]
        assert now[OTHER] == approx(series[OTHER] + 3.0 + 4 * 1_000 * NS)
        stored = flamegraph(server, service="shop")
        assert len(stored) == 8
        assert sum(now.values()) == approx(sum(v[0] for v in stored.values()) * NS)
        assert sum(later.by("stack", STACK_CALLS, service="shop").values()) == 9
        assert set(stacks(later, "billing")) == {names[7], names[8], names[9], OTHER}
        assert stacks(later, "billing")[OTHER] == approx((1_000 + 5 * 1_000) * NS)
    labels = {s.labels["stack"] for s in later.select(STACK_SELF)}
    assert len(labels - {OTHER}) <= 3 * 2  # bounded: k per service
    shop.close()
    billing.close()


def test_counters_never_decrease_even_when_retention_deletes_rows(server) -> None:
    shape = CallShape(calls=40, depth=5, functions=8)
    host = Host(server, "shop")
    builder = BatchBuilder()
    synthetic_batch(builder, shape, range(1, 5))
    host.send(builder)
    first = Scrape(server)
    first_total = first.total(STACK_SELF)
    assert first_total > 0
    host.close()

    # retention wipes every row (a cutoff a year ahead), as if everything had expired
    deleted = 0
    for _ in range(100):
        n = delete_expired(
            server.server.engine,
            cutoff_ns=time.time_ns() + 365 * 86400 * 10**9,
            dedup_cutoff=time.time() + 3600,
        )
        deleted += n
        if n == 0:
            break
    assert deleted > 0
    assert stored_requests(server) == []
    assert flamegraph(server) == {}
    assert server.get("/api/functions").json()["functions"] == []

    after = Scrape(server)
    previous = first.monotonic()
    now = after.monotonic()
    assert previous.keys() <= now.keys()
    assert all(now[key] >= value for key, value in previous.items())
    assert after.total(STACK_SELF) == approx(first_total)  # from memory, not from rows

    # new traffic adds on top of what the database no longer holds
    host = Host(server, "shop")
    builder = BatchBuilder()
    synthetic_batch(builder, shape, range(1, 3))
    host.send(builder)
    third = Scrape(server)
    latest = third.monotonic()
    assert all(latest[key] >= value for key, value in now.items())
    new_self = sum(v[0] for v in flamegraph(server).values())
    assert third.total(STACK_SELF) == approx(first_total + new_self * NS)
    assert third.total("profiler_request_duration_seconds_count") == 6
    host.close()


def test_label_values_are_bounded(server) -> None:
    depth = 40
    ascii_names = {i: f"deep.mod:{'f' * 95}_{i:03d}" for i in range(1, depth + 1)}  # 100 chars
    cyrillic = {100 + i: f"модуль:функция_{i:02d}_" + "я" * 80 for i in range(1, depth + 1)}
    host = Host(server, "deep")
    builder = BatchBuilder()
    define(builder, ascii_names | cyrillic)
    chain_request(builder, 1, "/deep", list(ascii_names))
    chain_request(builder, 2, "/deep", [*list(ascii_names)[:20], 1, 2, 3])
    chain_request(builder, 3, "/deep", list(cyrillic))
    host.send(builder)
    scrape = Scrape(server)

    too_long = [
        (s.name, k, len(v.encode()))
        for s in scrape.samples
        for k, v in s.labels.items()
        if len(v.encode()) > MAX_LABEL_BYTES
    ]
    assert too_long == []
    series = scrape.by("stack", STACK_SELF, service="deep")
    root = ascii_names[1] + SEPARATOR
    deepest = [s for s in series if s.startswith(root) and s.endswith(ascii_names[depth])]
    assert len(deepest) == 1
    assert SEPARATOR + ELISION + SEPARATOR in deepest[0]
    assert len(deepest[0]) > MAX_LABEL_BYTES // 2  # elided, not emptied
    deep_cyrillic = [s for s in series if s.endswith(cyrillic[100 + depth])]
    assert len(deep_cyrillic) == 1 and deep_cyrillic[0].startswith(cyrillic[101])
    # the API keeps whole signatures; sums over the bounded labels are still the totals
    stored = flamegraph(server, service="deep")
    assert max(len(stack) for stack in stored) > 2 * MAX_LABEL_BYTES
    assert sum(series.values()) == approx(sum(v[0] for v in stored.values()) * NS)
    assert scrape.total(STACK_CALLS, service="deep") == depth + 23 + depth
    host.close()


def test_every_reason_counter_is_a_series_at_zero_from_the_start(server) -> None:
    scrape = Scrape(server)
    rejected = scrape.by("reason", "profiler_ingest_rejected_total")
    assert rejected == dict.fromkeys(P.REASONS, 0.0)
    for listener, reasons in health.DENIED_REASONS.items():
        found = scrape.by("reason", "profiler_access_denied_total", listener=listener)
        assert found == dict.fromkeys(reasons, 0.0)
    params = {p.name: p for e in spec.ENDPOINTS for p in e.params}
    for name, param in params.items():
        found = scrape.by("reason", "profiler_api_rejected_total", parameter=name)
        assert found == dict.fromkeys(param.REASONS, 0.0), name
    # no float noise: a number as a label value is written as short as it reads
    for sample in scrape.samples:
        for value in sample.labels.values():
            assert not re.search(r"\.[0-9]*(0{5}|9{5})[0-9]", value), sample


def test_reason_lists_name_every_reason_the_code_gives() -> None:
    """The series made at start cover every literal reason in the code that counts them."""
    root = Path(__file__).resolve().parent.parent / "profiler_server"
    http = (root / "access" / "http.py").read_text()
    assert set(re.findall(r'_refuse\(\s*send,\s*\d+,\s*"(\w+)"', http)) == set(
        health.DENIED_REASONS["http"]
    )
    grpc = (root / "ingest" / "service.py").read_text()
    lines = [line for line in grpc.splitlines() if "denied.labels" in line or "reason = " in line]
    assert set(re.findall(r'"(\w+)"', "\n".join(lines))) == set(health.DENIED_REASONS["grpc"])
    given = re.findall(r'\.bad\(\s*"(\w+)"', (root / "api" / "params.py").read_text())
    declared = {
        r for p in vars(params).values() if isinstance(p, type) for r in getattr(p, "REASONS", ())
    }
    assert set(given) == declared


def test_routes_over_the_limit_are_other_in_the_sampled_and_the_counted_series() -> None:
    """One membership: a route admitted by the sampled series is a label of the counts of
    every request too, and a route over the limit is `(other)` in both."""
    registry = CollectorRegistry()
    metrics = ProfileMetrics(registry, top_k=10, max_functions=10, max_routes=1)
    assert metrics.routes("shop", "/a") == "/a"  # as a sampled request's route
    buckets = [0] * BUCKETS
    buckets[3] = 1
    metrics.requests.record(
        [(1, "shop", route, "GET", 2, 1, 1_000_000, *buckets) for route in ("/b", "/a")]
    )

    def counted(route: str) -> float | None:
        labels = {"service": "shop", "route": route, "status_class": "2xx"}
        return registry.get_sample_value("profiler_requests_total", labels)

    assert (counted("/a"), counted("(other)"), counted("/b")) == (1.0, 1.0, None)
