"""The story: one host sends bad or partial input while another host streams good requests.

The server must not crash, must store the good requests intact, must repair or reject the
bad input as documented, and must count every case in
`profiler_ingest_rejected_total{reason=...}`.
"""

from __future__ import annotations

import time
import uuid

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from profiler_core.model import EventKind
from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.assembly import problems as P
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch
from tests.helpers import eventually

ENTER, EXIT = EventKind.ENTER, EventKind.EXIT
F, G = 1, 2  # the bad host's functions: app:f, app:g
GOOD_SHAPE = CallShape(calls=20, depth=4, functions=5)


# --- reading what a user would see ---------------------------------------------------------------


def samples(server, name: str) -> list:
    text = server.get("/metrics").text
    families = text_string_to_metric_families(text)
    return [s for family in families for s in family.samples if s.name == name]


def rejected(server) -> dict[str, float]:
    """profiler_ingest_rejected_total by reason (only reasons counted at least once)."""
    found = samples(server, "profiler_ingest_rejected_total")
    return {s.labels["reason"]: s.value for s in found if s.value}


def open_requests(server) -> float:
    (sample,) = samples(server, "profiler_ingest_open_requests")
    return sample.value


def listed(server, service: str) -> list[dict]:
    return server.get("/api/requests", service=service, order="start").json()["requests"]


def detail(server, request_id: str) -> dict:
    response = server.get(f"/api/requests/{request_id}")
    assert response.status_code == 200, response.text
    return response.json()


def nodes(node: dict) -> list[dict]:
    """A node and all its descendants, pre-order."""
    out = [node]
    for child in node["children"]:
        out.extend(nodes(child))
    return out


def main_calls(request: dict) -> list[dict]:
    """The call nodes of the main lane (its synthetic root left out)."""
    return nodes(request["lanes"][0]["root"])[1:]


def shape(node: dict) -> tuple:
    """(function, children...) with the times left out."""
    return (node["function"], *(shape(c) for c in node["children"]))


# --- the two hosts ------------------------------------------------------------------------------


class GoodHost:
    """A well-behaved host streaming complete requests next to the bad input."""

    def __init__(self, server) -> None:
        self.server = server
        self.stream = HostStream(server.target)
        self.stream.send_hello(hello("good"))
        self.seq = 0
        self.sent = 0

    def send(self, count: int = 3) -> None:
        builder = BatchBuilder()
        ids = range(self.sent + 1, self.sent + count + 1)
        synthetic_batch(builder, GOOD_SHAPE, ids, define_functions=self.seq == 0)
        self.seq += 1
        self.sent += count
        self.stream.send_batch(builder.build(self.seq))
        assert self.stream.wait_acked({self.seq}), "the good host's batch was not acked"
        assert self.seq in self.stream.stored

    def assert_intact(self) -> None:
        """Every request sent is stored once, complete, with consistent times."""
        requests = listed(self.server, "good")
        assert len(requests) == self.sent
        for summary in requests:
            assert not summary["truncated"]
            assert summary["calls"] == GOOD_SHAPE.calls
            assert summary["route"] == "/items/{id}" and summary["status"] == 200
            root = detail(self.server, summary["id"])["lanes"][0]["root"]
            tree = nodes(root)
            assert len(tree) == GOOD_SHAPE.calls + 1
            assert {n["outcome"] for n in tree} == {"return"}
            # self times partition the request: nothing lost, nothing counted twice
            assert sum(n["self_ns"] for n in tree) == root["end_ns"] - root["start_ns"]
            assert root["end_ns"] == round(summary["duration_ms"] * 1e6)

    def close(self) -> None:
        self.stream.close()
        assert self.stream.error is None, self.stream.error


@pytest.fixture
def good(server) -> GoodHost:
    host = GoodHost(server)
    host.send()
    return host


class BadHost:
    """A host session sending hand-written batches (the bad input)."""

    def __init__(self, server, session: uuid.UUID | None = None) -> None:
        self.session = session or uuid.uuid4()
        self.stream = HostStream(server.target)
        self.stream.send_hello(hello("bad", self.session))
        self.t0 = time.monotonic_ns()

    def key(self, request_id: int) -> str:
        return f"{self.session}-{request_id}"

    def send(self, batch: ingest_pb2.Batch) -> None:
        self.stream.send_batch(batch)
        assert self.stream.wait_acked({batch.seq}), f"batch {batch.seq} was not acked"


def new_batch(define: bool = True) -> BatchBuilder:
    builder = BatchBuilder()
    if define:
        builder.function(F, "app", "f")
        builder.function(G, "app", "g")
    return builder


def events(
    builder: BatchBuilder, request_id: int, t0: int, *items: tuple[EventKind, int, int, int]
) -> None:
    """Adds (kind, function, call, time offset) events on the request's main lane."""
    builder.run(
        request_id,
        0,
        bytes(int(kind) for kind, _, _, _ in items),
        [fid for _, fid, _, _ in items],
        [call for _, _, call, _ in items],
        [t0 + dt for _, _, _, dt in items],
    )


def whole_good_request(builder: BatchBuilder, request_id: int, t0: int) -> None:
    """f calls g: the request the bad host gets right, next to its bad ones."""
    builder.start(request_id, "/fine", "GET", t0)
    events(builder, request_id, t0, (ENTER, F, 1, 10), (ENTER, G, 2, 20), (EXIT, G, 2, 30))
    events(builder, request_id, t0, (EXIT, F, 1, 40))
    builder.end(request_id, t0 + 50, 200)


def assert_fine_request(server, bad: BadHost, request_id: int) -> None:
    request = detail(server, bad.key(request_id))
    assert not request["truncated"]
    f, g = main_calls(request)
    assert (f["function"], f["start_ns"], f["end_ns"], f["self_ns"]) == ("app:f", 10, 40, 20)
    assert (g["function"], g["start_ns"], g["end_ns"], g["self_ns"]) == ("app:g", 20, 30, 10)


# --- broken call sequences: repaired, stored, counted ---------------------------------------------


def test_exit_without_enter_is_skipped(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/broken", "GET", bad.t0)
    events(builder, 1, bad.t0, (EXIT, G, 7, 5), (ENTER, F, 1, 10), (EXIT, F, 1, 40))
    builder.end(1, bad.t0 + 50, 500)
    whole_good_request(builder, 2, bad.t0)
    bad.send(builder.build(1))
    good.send()

    request = detail(server, bad.key(1))
    (f,) = main_calls(request)
    assert (f["function"], f["start_ns"], f["end_ns"], f["outcome"]) == ("app:f", 10, 40, "return")
    assert request["status"] == 500 and not request["truncated"]
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server) == {P.EXIT_WITHOUT_ENTER: 1}
    good.close()


def test_exit_of_another_function_than_the_open_call(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/broken", "GET", bad.t0)
    events(builder, 1, bad.t0, (ENTER, F, 1, 10), (ENTER, G, 2, 20), (EXIT, F, 2, 30))
    events(builder, 1, bad.t0, (EXIT, F, 1, 40))
    builder.end(1, bad.t0 + 50)
    whole_good_request(builder, 2, bad.t0)
    bad.send(builder.build(1))
    good.send()

    f, g = main_calls(detail(server, bad.key(1)))
    assert (g["function"], g["end_ns"], g["outcome"]) == ("app:g", 30, "return")
    assert (f["end_ns"], f["self_ns"]) == (40, 20)
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server) == {P.EXIT_MISMATCH: 1}
    good.close()


def test_unknown_function_id_is_stored_under_a_placeholder_name(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/broken", "GET", bad.t0)
    events(builder, 1, bad.t0, (ENTER, F, 1, 10), (ENTER, 77, 2, 20), (EXIT, 77, 2, 30))
    events(builder, 1, bad.t0, (EXIT, F, 1, 40))
    builder.end(1, bad.t0 + 50)
    whole_good_request(builder, 2, bad.t0)
    bad.send(builder.build(1))
    good.send()

    request = detail(server, bad.key(1))
    assert shape(request["lanes"][0]["root"])[1:] == (("app:f", ("(unknown function 77)",)),)
    assert not request["truncated"]
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server) == {P.UNKNOWN_FUNCTION: 1}
    good.close()


def test_missing_exits_are_closed_at_the_requests_end_and_marked_truncated(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/broken", "GET", bad.t0)
    events(builder, 1, bad.t0, (ENTER, F, 1, 10), (ENTER, G, 2, 20))
    builder.end(1, bad.t0 + 100)
    whole_good_request(builder, 2, bad.t0)
    bad.send(builder.build(1))
    good.send()

    [summary] = [r for r in listed(server, "bad") if r["id"] == bad.key(1)]
    assert summary["truncated"]
    f, g = main_calls(detail(server, bad.key(1)))
    assert [(n["function"], n["end_ns"], n["outcome"]) for n in (f, g)] == [
        ("app:f", 100, "truncated"),
        ("app:g", 100, "truncated"),
    ]
    assert (f["self_ns"], g["self_ns"]) == (10, 80)
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server) == {P.MISSING_EXIT: 2}
    good.close()


def test_events_after_the_requests_end_are_dropped(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/late", "GET", bad.t0)
    events(builder, 1, bad.t0, (ENTER, F, 1, 10), (EXIT, F, 1, 40), (ENTER, G, 2, 60))
    builder.end(1, bad.t0 + 50)
    bad.send(builder.build(1))
    assert len(eventually(lambda: listed(server, "bad"), timeout=10)) == 1

    # the request is stored; a later batch still has events for it
    builder = new_batch(define=False)
    events(builder, 1, bad.t0, (EXIT, G, 2, 70), (ENTER, F, 3, 80), (EXIT, F, 3, 90))
    whole_good_request(builder, 2, bad.t0)
    bad.send(builder.build(2))
    good.send()

    assert bad.stream.stored == {1, 2}
    request = detail(server, bad.key(1))
    assert shape(request["lanes"][0]["root"])[1:] == (("app:f",),)
    assert not request["truncated"]
    assert_fine_request(server, bad, 2)
    assert len(listed(server, "bad")) == 2
    good.assert_intact()
    assert rejected(server) == {P.EVENTS_AFTER_END: 1 + 3}
    good.close()


def test_a_request_without_its_start_record_starts_at_its_first_event(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    events(builder, 1, bad.t0, (ENTER, F, 1, 10), (EXIT, F, 1, 40))
    builder.end(1, bad.t0 + 50)
    bad.send(builder.build(1))
    good.send()

    request = detail(server, bad.key(1))
    assert request["route"] == "(none)"
    (f,) = main_calls(request)
    assert (f["start_ns"], f["end_ns"]) == (0, 30)
    assert request["duration_ms"] == pytest.approx(40 / 1e6)
    good.assert_intact()
    assert rejected(server) == {P.MISSING_START: 1}
    good.close()


# --- batches: duplicated, out of order, missing, malformed ------------------------------------


def split_request(bad: BadHost) -> tuple[ingest_pb2.Batch, ingest_pb2.Batch]:
    """Request 1 (f calls g) in two batches: seq 1 starts it, seq 2 ends it."""
    first = new_batch()
    first.start(1, "/split", "POST", bad.t0)
    events(first, 1, bad.t0, (ENTER, F, 1, 10), (ENTER, G, 2, 20))
    second = new_batch(define=False)
    events(second, 1, bad.t0, (EXIT, G, 2, 30), (EXIT, F, 1, 40))
    second.end(1, bad.t0 + 50, 201)
    return first.build(1), second.build(2)


def test_a_duplicated_batch_is_acked_and_stored_once(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    whole_good_request(builder, 2, bad.t0)
    batch = builder.build(1)
    bad.send(batch)
    bad.stream.stored.clear()
    bad.send(batch)  # the host missed the ack and sends it again
    assert bad.stream.stored == {1}
    good.send()

    # a host that reconnects (same session) and resends everything unacked
    bad.stream.close()
    again = BadHost(server, bad.session)
    again.send(batch)
    assert again.stream.stored == {1}
    good.send()

    assert [r["id"] for r in listed(server, "bad")] == [bad.key(2)]
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server) == {P.DUPLICATE_BATCH: 2}
    good.close()


def test_out_of_order_batches_are_assembled_in_sequence(server, good) -> None:
    bad = BadHost(server)
    first, second = split_request(bad)
    bad.send(second)  # seq 2 arrives first: acked, held until seq 1 comes
    good.send()
    assert listed(server, "bad") == []
    bad.send(first)
    good.send()

    request = detail(server, bad.key(1))
    assert (request["route"], request["method"], request["status"]) == ("/split", "POST", 201)
    assert not request["truncated"]
    f, g = main_calls(request)
    assert shape(request["lanes"][0]["root"])[1:] == (("app:f", ("app:g",)),)
    assert (f["start_ns"], f["end_ns"], f["self_ns"]) == (10, 40, 20)
    assert (g["start_ns"], g["end_ns"], g["self_ns"]) == (20, 30, 10)
    good.assert_intact()
    assert rejected(server) == {P.OUT_OF_ORDER_BATCH: 1}
    good.close()


def test_a_batch_that_never_comes_is_given_up_after_the_gap_timeout(server, good) -> None:
    bad = BadHost(server)
    lost = new_batch()  # seq 1 never arrives: it held the start and f's enter
    lost.start(1, "/split", "POST", bad.t0)
    events(lost, 1, bad.t0, (ENTER, F, 1, 10))
    second = new_batch()
    events(second, 1, bad.t0, (ENTER, G, 2, 20), (EXIT, G, 2, 30), (EXIT, F, 1, 40))
    second.end(1, bad.t0 + 50, 201)
    bad.send(second.build(2))  # the server waits --gap-timeout (1 s in tests) for seq 1
    good.send()

    stored = eventually(lambda: listed(server, "bad"), timeout=10)
    assert [r["id"] for r in stored] == [bad.key(1)]
    request = detail(server, bad.key(1))
    assert shape(request["lanes"][0]["root"])[1:] == (("app:g",),)  # what did arrive
    (g,) = main_calls(request)
    assert (g["start_ns"], g["end_ns"]) == (0, 10)  # it starts at its first event
    assert request["status"] == 201
    good.send()
    good.assert_intact()
    assert rejected(server) == {P.GAP: 1, P.EXIT_WITHOUT_ENTER: 1, P.MISSING_START: 1}
    good.close()


def test_a_request_left_with_no_calls_is_stored_with_an_empty_tree(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/empty", "GET", bad.t0)
    events(builder, 1, bad.t0, (EXIT, F, 1, 10))  # its only event is unusable
    builder.end(1, bad.t0 + 50)
    bad.send(builder.build(1))
    good.send()

    assert bad.stream.error is None, bad.stream.error.details()
    assert bad.stream.stored == {1}
    request = detail(server, bad.key(1))
    assert main_calls(request) == [] and request["calls"] == 0
    good.assert_intact()
    assert rejected(server) == {P.EXIT_WITHOUT_ENTER: 1}
    good.close()


def test_a_batch_with_malformed_columns_is_acked_as_rejected(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    whole_good_request(builder, 1, bad.t0)
    malformed = builder.build(1)
    malformed.events.run_length[0] += 5  # the runs claim more events than the columns hold
    bad.send(malformed)
    assert (bad.stream.rejected, bad.stream.stored) == ({1}, set())

    unknown_kind = new_batch()
    whole_good_request(unknown_kind, 1, bad.t0)
    batch = unknown_kind.build(2)
    batch.events.kind = b"\x00\x09\x01\x01"  # 9 is no EventKind
    bad.send(batch)
    assert bad.stream.rejected == {1, 2}

    # the stream goes on: the host's next batch is stored
    fixed = new_batch()
    whole_good_request(fixed, 2, bad.t0)
    bad.send(fixed.build(3))
    assert bad.stream.stored == {3}
    good.send()

    stored = eventually(lambda: listed(server, "bad"), timeout=10)
    assert [r["id"] for r in stored] == [bad.key(2)]
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server).get(P.MALFORMED_BATCH) == 2
    good.close()


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda b: b.request_starts[0].__setattr__("start_ns", -5), id="negative"),
        pytest.param(lambda b: b.events.__setattr__("base_ns", 2**63 - 1), id="overflowing"),
        pytest.param(lambda b: b.__setattr__("seq", 2**64 - 1), id="huge-seq"),
    ],
)
def test_numbers_the_store_cannot_hold_reject_the_batch(server, good, spoil) -> None:
    bad = BadHost(server)
    builder = new_batch()
    whole_good_request(builder, 1, bad.t0)
    batch = builder.build(1)
    spoil(batch)
    bad.stream.send_batch(batch)
    assert bad.stream.wait_acked({batch.seq}), "the spoiled batch was never answered"
    assert bad.stream.rejected == {batch.seq}
    fixed = new_batch()
    whole_good_request(fixed, 2, bad.t0)
    bad.send(fixed.build(1 if batch.seq != 1 else 2))
    good.send()

    assert bad.stream.error is None
    assert eventually(lambda: [r["id"] for r in listed(server, "bad")] == [bad.key(2)], timeout=10)
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server).get(P.MALFORMED_BATCH) == 1
    good.close()


def test_strings_longer_than_the_store_keeps_are_cut(server, good) -> None:
    bad = BadHost(server)
    builder = new_batch()
    whole_good_request(builder, 1, bad.t0)
    batch = builder.build(1)
    batch.request_starts[0].route = "/" + "r" * 5000
    batch.request_starts[0].method = "M" * 100
    batch.functions[0].line = 2**32 - 1
    bad.send(batch)
    good.send()

    assert bad.stream.error is None and bad.stream.stored == {1}
    [summary] = listed(server, "bad")
    assert summary["route"] == "/" + "r" * 498 + "…"
    assert summary["method"] == "M" * 15 + "…"
    assert [n["function"] for n in main_calls(detail(server, bad.key(1)))] == ["app:f", "app:g"]
    good.assert_intact()
    assert rejected(server) == {P.LONG_NAME: 2}
    good.close()


def test_a_rejected_batch_does_not_hold_up_the_sessions_next_requests(db_url, start_server) -> None:
    server = start_server(db_url, gap_timeout=30.0)
    bad = BadHost(server)
    builder = new_batch()
    whole_good_request(builder, 1, bad.t0)
    malformed = builder.build(1)
    malformed.events.run_length[0] += 5
    bad.send(malformed)
    fixed = new_batch()
    whole_good_request(fixed, 2, bad.t0)
    bad.send(fixed.build(2))

    assert eventually(lambda: listed(server, "bad"), timeout=5)
    assert rejected(server) == {P.MALFORMED_BATCH: 1}
    bad.stream.close()


# --- whole messages and streams ------------------------------------------------------------------


def test_garbage_bytes_are_skipped_and_the_stream_goes_on(server, good) -> None:
    bad = BadHost(server)
    bad.stream.send_raw(b"\xff\xff\xff\xff\xff")  # not a protobuf message
    bad.stream.send_raw(b"\x18\x01")  # decodes, but holds neither a hello nor a batch
    builder = new_batch()
    whole_good_request(builder, 2, bad.t0)
    bad.send(builder.build(1))
    good.send()

    assert bad.stream.error is None and bad.stream.stored == {1}
    assert_fine_request(server, bad, 2)
    good.assert_intact()
    assert rejected(server) == {P.GARBAGE: 2}
    good.close()


def test_a_batch_before_hello_ends_that_stream_only(server, good) -> None:
    rude = HostStream(server.target)
    builder = new_batch()
    whole_good_request(builder, 1, time.monotonic_ns())
    rude.send_batch(builder.build(1))
    assert rude.done.wait(10)
    assert rude.error is not None
    assert rude.error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Hello" in rude.error.details()
    good.send()

    assert listed(server, "bad") == []
    good.assert_intact()
    assert rejected(server) == {P.NO_HELLO: 1}
    good.close()


def test_a_hello_with_overlong_descriptions_is_cut_and_accepted(server, good) -> None:
    verbose = hello("bad")
    verbose.hostname = "h" * 1000
    verbose.python_version = "3" * 100
    verbose.pid = 2**32 - 1
    stream = HostStream(server.target)
    stream.send_hello(verbose)
    builder = new_batch()
    whole_good_request(builder, 1, time.monotonic_ns())
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1}) and stream.stored == {1}
    good.send()
    assert len(listed(server, "bad")) == 1
    good.assert_intact()
    assert rejected(server) == {P.LONG_NAME: 2}
    stream.close()
    good.close()


def test_a_hello_without_session_id_or_service_is_refused(server, good) -> None:
    broken_hellos = [
        hello(""),
        ingest_pb2.Hello(session_id=b"short", service="bad"),
        hello("s" * 201),
        ingest_pb2.Hello(session_id=uuid.uuid4().bytes, service="bad", monotonic_ns=-1),
    ]
    for broken in broken_hellos:
        stream = HostStream(server.target)
        stream.send_hello(broken)
        assert stream.done.wait(10)
        assert stream.error is not None
        assert stream.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Hello" in stream.error.details()
    good.send()
    good.assert_intact()
    assert rejected(server) == {P.BAD_HELLO: 4}
    good.close()


def oversized_batch(size: int, t0: int) -> ingest_pb2.Batch:
    builder = new_batch()
    builder.function(3, "app", "x" * size)
    whole_good_request(builder, 9, t0)
    return builder.build(2)


@pytest.mark.parametrize("size", [5_000, 14_000], ids=["just-over", "well-over"])
def test_an_oversized_message_ends_its_stream_with_a_clear_status(
    db_url, start_server, size
) -> None:
    server = start_server(db_url, max_message_bytes=4096)
    good = GoodHost(server)
    good.send()
    bad = BadHost(server)
    bad.stream.send_batch(oversized_batch(size, bad.t0))
    assert bad.stream.done.wait(10)
    assert bad.stream.error is not None
    assert bad.stream.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "exceeds the server's limit of 4096 bytes" in bad.stream.error.details()
    assert bad.stream.stored == set()
    good.send()

    assert listed(server, "bad") == []
    good.assert_intact()
    assert rejected(server) == {P.OVERSIZED: 1}
    good.close()


def test_a_message_beyond_grpcs_own_limit_ends_its_stream_too(db_url, start_server) -> None:
    # gRPC itself refuses messages over 4x --max-message-bytes, before the server sees them
    server = start_server(db_url, max_message_bytes=4096)
    good = GoodHost(server)
    good.send()
    bad = BadHost(server)
    bad.stream.send_batch(oversized_batch(40_000, bad.t0))
    assert bad.stream.done.wait(10)
    assert bad.stream.error is not None
    assert bad.stream.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in bad.stream.error.details()
    good.send()
    assert listed(server, "bad") == []
    good.assert_intact()
    good.close()


def test_a_stream_ended_for_an_oversized_message_mid_request_is_a_dead_stream(
    db_url, start_server
) -> None:
    server = start_server(db_url, max_message_bytes=4096)
    good = GoodHost(server)
    good.send()
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/open", "GET", bad.t0)
    events(builder, 1, bad.t0, (ENTER, F, 1, 10))
    bad.send(builder.build(1))
    assert eventually(lambda: open_requests(server) == 1, timeout=5)
    bad.stream.send_batch(oversized_batch(5_000, bad.t0))
    assert bad.stream.done.wait(10)
    assert bad.stream.error is not None

    # the host does not come back within --stream-timeout: the request is stored truncated
    [summary] = eventually(lambda: listed(server, "bad"), timeout=10)
    assert summary["id"] == bad.key(1) and summary["truncated"]
    assert eventually(lambda: open_requests(server) == 0, timeout=5)
    good.send()
    good.assert_intact()
    assert rejected(server) == {P.OVERSIZED: 1, P.STREAM_DIED: 1, P.MISSING_EXIT: 1}
    good.close()


def test_a_stream_killed_mid_request_stores_it_truncated_after_the_stream_timeout(
    server, good
) -> None:
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/slow", "GET", bad.t0)
    events(builder, 1, bad.t0, (ENTER, F, 1, 10), (ENTER, G, 2, 20), (EXIT, G, 2, 30))
    events(builder, 1, bad.t0, (ENTER, G, 3, 40))
    bad.send(builder.build(1))
    assert eventually(lambda: open_requests(server) == 1, timeout=5)  # held in memory until its end

    bad.stream.kill()  # the host process died mid-request
    killed = time.monotonic()
    good.send()
    stored = eventually(lambda: listed(server, "bad"), timeout=10)
    assert time.monotonic() - killed >= 0.9  # it waited --stream-timeout (1 s) for a reconnect

    [summary] = stored
    assert summary["id"] == bad.key(1) and summary["truncated"]
    request = detail(server, bad.key(1))
    f, g1, g2 = main_calls(request)
    assert shape(request["lanes"][0]["root"])[1:] == (("app:f", ("app:g",), ("app:g",)),)
    assert (g1["end_ns"], g1["outcome"]) == (30, "return")
    # closed where its events stop, marked truncated
    assert [(n["end_ns"], n["outcome"]) for n in (f, g2)] == [(40, "truncated")] * 2
    assert eventually(lambda: open_requests(server) == 0, timeout=5)
    good.send()
    good.assert_intact()
    assert rejected(server) == {P.STREAM_DIED: 1, P.MISSING_EXIT: 2}
    good.close()


def test_a_request_that_goes_quiet_is_stored_truncated_after_the_request_timeout(
    db_url, start_server
) -> None:
    server = start_server(db_url, request_timeout=1.0)
    good = GoodHost(server)
    good.send()
    bad = BadHost(server)
    builder = new_batch()
    builder.start(1, "/hangs", "GET", bad.t0)
    events(builder, 1, bad.t0, (ENTER, F, 1, 10))
    bad.send(builder.build(1))  # the stream stays up, but the request never ends

    [summary] = eventually(lambda: listed(server, "bad"), timeout=10)
    assert summary["truncated"]
    (f,) = main_calls(detail(server, bad.key(1)))
    assert (f["function"], f["outcome"]) == ("app:f", "truncated")
    assert eventually(lambda: open_requests(server) == 0, timeout=5)
    good.send()
    good.assert_intact()
    assert rejected(server) == {P.REQUEST_TIMEOUT: 1, P.MISSING_EXIT: 1}
    good.close()
    bad.stream.close()
