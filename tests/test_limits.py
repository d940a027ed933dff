"""The story: a host sends more than the server keeps (functions, open requests, sessions on
one stream, services); the server holds its documented limit, counts what it cut, and the
data within the limits is stored as usual."""

from __future__ import annotations

import time

import grpc
import pytest

from profiler_core.wire.builder import BatchBuilder
from profiler_server.assembly import problems as P
from profiler_server.assembly.finished import FinishedIds
from profiler_server.loadgen import HostStream, hello
from profiler_server.metrics.services import CANDIDATES, OTHER, ServiceLabels
from tests.helpers import eventually, metric_value, stored_requests

REJECTED = "profiler_ingest_rejected_total"


@pytest.fixture
def start(tmp_path, start_server):
    """A server on a fresh SQLite file with the given settings."""
    return lambda **overrides: start_server(f"sqlite:///{tmp_path / 'p.db'}", **overrides)


def whole_request(builder: BatchBuilder, rid: int, functions: list[int]) -> None:
    """Request `rid`: each function calls the next."""
    t0 = time.monotonic_ns()
    n = len(functions)
    builder.start(rid, f"/r{rid}", "GET", t0)
    builder.run(
        rid,
        0,
        bytes([0] * n + [1] * n),
        functions + functions[::-1],
        list(range(1, n + 1)) + list(range(n, 0, -1)),
        [t0 + 10 * i for i in range(1, 2 * n + 1)],
    )
    builder.end(rid, t0 + 10 * (2 * n + 1), 200)


def counted(server, reason: str) -> float:
    return metric_value(server.http, REJECTED, reason=reason)


def open_requests(server) -> float:
    return metric_value(server.http, "profiler_ingest_open_requests")


def test_every_rejection_reason_is_a_series_from_the_start(start) -> None:
    server = start()
    text = server.get("/metrics").text
    for reason in P.REASONS:
        assert f'{REJECTED}{{reason="{reason}"}} 0.0' in text


def test_functions_beyond_the_session_limit_are_unknown(start) -> None:
    server = start(max_session_functions=2)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    builder = BatchBuilder()
    for fid in (1, 2, 3):
        builder.function(fid, "app", f"f{fid}")
    whole_request(builder, 1, [1, 2, 3])
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1}) and stream.stored == {1}

    (stored,) = eventually(lambda: stored_requests(server.http, service="shop"))
    root = server.get(f"/api/requests/{stored['id']}").json()["lanes"][0]["root"]
    f1 = root["children"][0]
    f2 = f1["children"][0]
    assert (f1["function"], f2["function"]) == ("app:f1", "app:f2")
    assert f2["children"][0]["function"] == "(unknown function 3)"
    assert counted(server, P.FUNCTION_LIMIT) == 1
    stream.close()


def test_undefined_function_ids_beyond_the_sessions_names_are_one_frame(start) -> None:
    """Names are kept for the defined functions and as many undefined ids again (2 x 2
    here); further undefined ids are one `(more unknown functions)` frame, counted."""
    server = start(max_session_functions=2)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    builder = BatchBuilder()
    for fid in (1, 2):
        builder.function(fid, "app", f"f{fid}")
    whole_request(builder, 1, [1, 2, 10, 11, 12, 13, 14])
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1}) and stream.stored == {1}

    (stored,) = eventually(lambda: stored_requests(server.http, service="shop"))
    node = server.get(f"/api/requests/{stored['id']}").json()["lanes"][0]["root"]
    chain = []
    while node["children"]:
        node = node["children"][0]
        chain.append(node["function"])
    more = "(more unknown functions)"
    assert (
        chain == ["app:f1", "app:f2", "(unknown function 10)", "(unknown function 11)"] + [more] * 3
    )
    assert counted(server, P.UNKNOWN_FUNCTION_LIMIT) == 3
    (session,) = server.server.pipeline.sessions.values()
    assert len(session.interner.names) == 4
    stream.close()


def test_lanes_and_their_names_count_toward_the_open_events_limit(start) -> None:
    server = start(max_open_events=1_000)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    lanes = BatchBuilder()
    t0 = time.monotonic_ns()
    lanes.start(1, "/lanes", "GET", t0)
    for lane in range(1, 41):  # 40 x (8 + 500 // 25) = 1,120 events' worth, without events
        lanes.lane(1, lane, 2, "n" * 500)
    stream.send_batch(lanes.build(1))
    assert stream.wait_acked({1})

    (stored,) = eventually(lambda: stored_requests(server.http, service="shop"), timeout=10)
    assert stored["truncated"] and stored["route"] == "/lanes"
    assert counted(server, P.MEMORY_LIMIT) == 1
    stream.close()


def test_open_requests_beyond_the_session_limit_store_the_oldest_truncated(start) -> None:
    server = start(max_open_requests=2)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    starts = BatchBuilder()
    t0 = time.monotonic_ns()
    for rid in (1, 2, 3):
        starts.start(rid, f"/r{rid}", "GET", t0 + rid)  # starts without events
    stream.send_batch(starts.build(1))
    assert stream.wait_acked({1})

    (evicted,) = eventually(lambda: stored_requests(server.http, service="shop"))
    assert evicted["route"] == "/r1" and evicted["truncated"]
    assert counted(server, P.OPEN_REQUEST_LIMIT) == 1
    assert eventually(lambda: open_requests(server) == 2, timeout=5)
    late = BatchBuilder()
    late.end(1, t0 + 100, 200)  # the evicted request's end comes after all
    late.end(2, t0 + 100, 200)
    stream.send_batch(late.build(2))
    assert stream.wait_acked({2})
    assert eventually(lambda: len(stored_requests(server.http, service="shop")) == 2)
    assert counted(server, P.EVENTS_AFTER_END) == 1
    assert eventually(lambda: open_requests(server) == 1, timeout=5)
    stream.close()


def test_request_starts_without_events_count_toward_the_open_events_limit(start) -> None:
    server = start(max_open_events=100)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    starts = BatchBuilder()
    t0 = time.monotonic_ns()
    for rid in range(1, 6):
        starts.start(rid, f"/r{rid}", "GET", t0 + rid)
    stream.send_batch(starts.build(1))
    assert stream.wait_acked({1})

    # five held, 32 events' worth each (160), over 100: the oldest are stored truncated
    # until at most 90 are left
    stored = eventually(lambda: len(stored_requests(server.http, service="shop")) == 3)
    assert stored
    assert {r["route"] for r in stored_requests(server.http, service="shop")} == {
        "/r1",
        "/r2",
        "/r3",
    }
    assert counted(server, P.MEMORY_LIMIT) == 3
    assert eventually(lambda: open_requests(server) == 2, timeout=5)
    stream.close()


def test_a_second_hello_on_one_stream_ends_it_and_orphans_nothing(start) -> None:
    server = start()
    stream = HostStream(server.target)
    stream.send_hello(hello("first"))
    opened = BatchBuilder()
    opened.start(1, "/open", "GET", time.monotonic_ns())
    stream.send_batch(opened.build(1))
    assert stream.wait_acked({1})
    stream.send_hello(hello("second"))
    assert stream.done.wait(10)
    assert stream.error is not None
    assert stream.error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "one Hello per stream" in stream.error.details()
    assert counted(server, P.SECOND_HELLO) == 1

    # the first session ends with its stream: its open request is stored truncated once
    # --stream-timeout (1 s in tests) has passed, and the server holds no session after
    (stored,) = eventually(lambda: stored_requests(server.http, service="first"), timeout=10)
    assert stored["truncated"]
    assert eventually(lambda: not server.server.pipeline.sessions, timeout=10)
    assert stored_requests(server.http, service="second") == []


def test_services_beyond_the_limit_are_one_other_series(start) -> None:
    server = start(max_services=2)
    for n, service in enumerate(("a", "b", "c", "d")):
        stream = HostStream(server.target)
        stream.send_hello(hello(service))
        builder = BatchBuilder()
        builder.function(1, "app", "f")
        whole_request(builder, 1, [1])
        stream.send_batch(builder.build(1))
        assert stream.wait_acked({1}) and stream.stored == {1}
        stream.close()
        assert eventually(lambda n=n: len(stored_requests(server.http)) == n + 1)

    def services(name: str) -> dict[str, float]:
        found: dict[str, float] = {}
        for s in ("a", "b", "c", "d", "(other)"):
            value = metric_value(server.http, name, service=s)
            if value:
                found[s] = value
        return found

    assert services("profiler_requests_stored_total") == {"a": 1, "b": 1, "(other)": 2}
    assert services("profiler_request_duration_seconds_count") == {"a": 1, "b": 1, "(other)": 2}
    assert services("profiler_function_calls_total") == {"a": 1, "b": 1, "(other)": 2}


def test_services_in_metrics_are_the_top_n_by_requests_without_swapping_back_and_forth() -> None:
    labels = ServiceLabels(2)
    labels.count("a", 10)
    labels.count("b", 12)
    assert (labels("a"), labels("b")) == ("a", "b")
    labels.count("c", 15)  # more than a, but not twice as many: no swap
    assert labels("c") == OTHER
    labels.count("c", 5)  # twice a's: c takes the place of the member with the fewest
    assert (labels("a"), labels("b"), labels("c")) == (OTHER, "b", "c")
    labels.count("a", 5)  # a has more than b again, but not twice as many: it stays out
    assert labels("a") == OTHER


def test_counting_services_holds_a_bounded_table_and_still_finds_a_big_one() -> None:
    labels = ServiceLabels(3)
    for n in range(10_000):
        labels.count(f"one-off {n}", 1)
        labels(f"one-off {n}")
    assert len(labels._counts) <= CANDIDATES * 3
    labels.count("big", 1_000)
    assert labels("big") == "big"


def test_finished_request_ids_take_a_watermark_not_an_entry_each() -> None:
    finished = FinishedIds(limit=10)
    for rid in (2, 1, 3, 5):
        finished.add(rid)
    assert (finished.watermark, finished.above) == (3, {5})
    assert [rid in finished for rid in range(1, 7)] == [True, True, True, False, True, False]
    for rid in range(1, 100_001):
        finished.add(rid)
    assert (finished.watermark, finished.above) == (100_000, set())
    # gaps (ids never finished) keep ids above the watermark, at most `limit` of them
    for rid in range(100_002, 100_200, 2):
        finished.add(rid)
        assert len(finished.above) <= 10
    assert 100_198 in finished and 100_199 not in finished
