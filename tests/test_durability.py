"""Acks mean stored: resends are stored once, unfinished requests survive restarts, crashes
and moves to another server, and SIGTERM drains before exiting."""

from __future__ import annotations

import time
import uuid

import grpc
import httpx
from sqlalchemy import event

from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch, synthetic_run
from profiler_server.pipeline import Inbound
from tests.helpers import FakeStream, count_nodes, eventually, metric_value, stored_requests, worker
from tests.processes import ServerProcess

SHAPE = CallShape(calls=100, depth=6, functions=12)


def split_request(request_id: int) -> tuple[BatchBuilder, BatchBuilder]:
    """One request whose events and end arrive in a second batch."""
    t0 = time.monotonic_ns()
    kinds, functions, calls, times, end = synthetic_run(SHAPE, 1, t0, request_id)
    half = len(kinds) // 2
    first, second = BatchBuilder(), BatchBuilder()
    for fid in range(1, SHAPE.functions + 1):
        first.function(fid, "app.split", f"f{fid}", "split.py", fid)
    first.start(request_id, "/split", "GET", t0)
    first.run(request_id, 0, kinds[:half], functions[:half], calls[:half], times[:half])
    second.run(request_id, 0, kinds[half:], functions[half:], calls[half:], times[half:])
    second.end(request_id, end, 200)
    return first, second


def open_session(target: str, session: uuid.UUID) -> HostStream:
    stream = HostStream(target)
    stream.send_hello(hello("shop", session))
    return stream


def assert_whole(http: str) -> None:
    [request] = stored_requests(http, route="/split")
    assert not request["truncated"]
    assert request["calls"] == SHAPE.calls
    tree = httpx.get(f"{http}/api/requests/{request['id']}").json()
    assert count_nodes(tree["lanes"][0]["root"]) == SHAPE.calls + 1


def test_resent_batch_is_stored_once(server) -> None:
    session = uuid.uuid4()
    builder = BatchBuilder()
    synthetic_batch(builder, SHAPE, range(1, 6))
    batch = builder.build(1)
    first = open_session(server.target, session)
    first.send_batch(batch)
    assert first.wait_acked({1})
    first.kill()  # the ack may be lost with the connection: the host resends
    again = open_session(server.target, session)
    again.send_batch(batch)
    assert again.wait_acked({1}) and 1 in again.stored
    again.close()
    assert len(stored_requests(server.http)) == 5
    assert (
        metric_value(server.http, "profiler_ingest_rejected_total", reason="duplicate_batch") == 1
    )
    assert metric_value(server.http, "profiler_requests_stored_total") == 5


def test_unfinished_request_survives_a_server_restart(start_server, db_url) -> None:
    session = uuid.uuid4()
    first, second = split_request(1)
    server = start_server(db_url)
    stream = open_session(server.target, session)
    stream.send_batch(first.build(1))
    assert stream.wait_acked({1})
    server.stop()  # drains; the half request is only in the database now
    assert stream.done.wait(10)

    restarted = start_server(db_url)
    stream = open_session(restarted.target, session)
    stream.send_batch(second.build(2))
    assert stream.wait_acked({2})
    stream.close()
    assert_whole(restarted.http)


def test_host_moves_to_another_server_mid_request(start_server, pg_url) -> None:
    """Several servers share one PostgreSQL; a host may reconnect to any of them."""
    session = uuid.uuid4()
    first, second = split_request(7)
    one, two = start_server(pg_url), start_server(pg_url)
    stream = open_session(one.target, session)
    stream.send_batch(first.build(1))
    assert stream.wait_acked({1})
    stream.kill()
    stream = open_session(two.target, session)
    stream.send_batch(second.build(2))
    assert stream.wait_acked({2})
    stream.close()
    assert_whole(two.http)
    # Server one saw the stream die; after its timeout it must not store the request again.
    time.sleep(2.5)
    assert len(stored_requests(one.http, route="/split")) == 1


def test_crashed_server_is_recovered_from_the_database(tmp_path, db_url) -> None:
    session = uuid.uuid4()
    first, second = split_request(3)
    log = tmp_path / "server.log"
    crashed = ServerProcess(db_url, log)
    try:
        stream = open_session(crashed.target, session)
        stream.send_batch(first.build(1))
        assert stream.wait_acked({1})
        crashed.kill()  # kill -9: nothing drained, nothing flushed
        assert stream.done.wait(10)
    finally:
        crashed.stop()
    server = ServerProcess(db_url, log)
    try:
        stream = open_session(server.target, session)
        stream.send_batch(second.build(2))
        assert stream.wait_acked({2})
        stream.close()
        assert_whole(server.http)
    finally:
        server.stop()


def test_orphaned_session_is_stored_truncated_by_the_next_server(tmp_path, db_url) -> None:
    first, _ = split_request(5)
    log = tmp_path / "server.log"
    crashed = ServerProcess(db_url, log, "--stream-timeout", "1s")
    try:
        stream = open_session(crashed.target, uuid.uuid4())
        stream.send_batch(first.build(1))
        assert stream.wait_acked({1})
        crashed.kill()
    finally:
        crashed.stop()
    server = ServerProcess(db_url, log, "--stream-timeout", "1s")
    try:
        found = eventually(lambda: stored_requests(server.http, route="/split"), timeout=20)
        assert len(found) == 1 and found[0]["truncated"]
        assert found[0]["calls"] > 0
        reason = "stream_died"
        assert metric_value(server.http, "profiler_ingest_rejected_total", reason=reason) == 1
    finally:
        server.stop()


def test_sigterm_drains_acks_and_exits_zero(tmp_path, db_url) -> None:
    server = ServerProcess(db_url, tmp_path / "server.log")
    try:
        stream = open_session(server.target, uuid.uuid4())
        for seq in range(1, 41):
            builder = BatchBuilder()
            synthetic_batch(
                builder, SHAPE, range(seq * 10, seq * 10 + 10), define_functions=seq == 1
            )
            stream.send_batch(builder.build(seq))
        assert server.terminate() == 0
        assert stream.done.wait(10)
        acked = stream.stored
        assert acked, "nothing was acked before the drain"
    finally:
        server.stop()
    # Whatever was acked is stored; a new server shows exactly those requests.
    again = ServerProcess(db_url, tmp_path / "server.log")
    try:
        assert len(stored_requests(again.http, limit="1000")) == 10 * len(acked)
    finally:
        again.stop()


# --- shutdown with a backlog ---------------------------------------------------------------------


def queue_backlog(pipeline, streams: list[FakeStream], batches: int) -> None:
    """A Hello per stream, then `batches` one-request batches each, queued before start."""
    for stream in streams:
        assert pipeline.submit(Inbound(stream, hello=hello("shop")))
    t0 = time.monotonic_ns()
    for seq in range(1, batches + 1):
        for stream in streams:
            builder = BatchBuilder()
            builder.start(seq, "/backlog", "GET", t0 + seq)
            builder.end(seq, t0 + seq + 10, 200)
            assert pipeline.submit(Inbound(stream, batch=builder.build(seq)))


def test_shutdown_stops_at_its_timeout_and_says_what_it_did_not_store(tmp_path, caplog) -> None:
    with worker(f"sqlite:///{tmp_path / 'p.db'}") as pipeline:
        streams = [FakeStream() for _ in range(4)]
        queue_backlog(pipeline, streams, 250)  # 1,000 batches: four groups at least
        pipeline.start()
        pipeline.stop(timeout=0)

        stored = sum(len(s.seqs("stored")) for s in streams)
        assert stored < 1_000
        assert all(s.seqs("rejected") == set() for s in streams)
        (said,) = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
        assert said.startswith(f"shutdown: {1_000 - stored} batches")
        # each stream with a batch left over is ended, so that its host resends it
        for stream in streams:
            if len(stream.seqs("stored")) < 250:
                assert [code for code, _ in stream.aborted] == [grpc.StatusCode.UNAVAILABLE]
        with pipeline.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM requests").scalar() == stored


def test_shutdown_with_time_enough_stores_and_acks_the_whole_backlog(tmp_path, caplog) -> None:
    with worker(f"sqlite:///{tmp_path / 'p.db'}") as pipeline:
        streams = [FakeStream() for _ in range(2)]
        queue_backlog(pipeline, streams, 100)
        pipeline.start()
        pipeline.stop(timeout=600)

        assert [s.seqs("stored") for s in streams] == [set(range(1, 101))] * 2
        assert [s.aborted for s in streams] == [[], []]
        assert not [r for r in caplog.records if "not stored" in r.getMessage()]


def test_a_session_its_stream_left_is_stored_once_when_reaped_in_the_same_tick(
    tmp_path, caplog
) -> None:
    """A session whose stream ended is finished by the stream timeout; when the worker
    comes to it late (a backlog), its heartbeat is stale too and the reaper finds it in the
    database in the same housekeeping transaction. Its open request is stored once."""
    with worker(f"sqlite:///{tmp_path / 'p.db'}", stream_timeout=1.0) as pipeline:
        now = [100.0]
        pipeline.clock = lambda: now[0]
        stream = FakeStream()
        builder = BatchBuilder()
        builder.start(1, "/open", "GET", time.monotonic_ns())
        pipeline._process([Inbound(stream, hello=hello("left"))])
        batch = builder.build(1)
        raw = ingest_pb2.HostMessage(batch=batch).SerializeToString()  # spooled: it holds /open
        pipeline._process([Inbound(stream, batch=batch, raw=raw)])
        pipeline._process([Inbound(stream, closed=True)])
        time.sleep(2.0)  # the session's heartbeat is stale by then (wall clock)
        now[0] += 10.0  # and its stream timeout passed (the worker's clock)
        pipeline._housekeep()

        assert not [r for r in caplog.records if "housekeeping failed" in r.getMessage()]
        with pipeline.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT route, truncated FROM requests").all()
        assert [tuple(r) for r in rows] == [("/open", 1)]


def test_a_fleet_reconnecting_at_once_is_looked_up_once_a_group(tmp_path) -> None:
    """Hellos of sessions the worker does not hold are looked up in the store together: a
    group of 300 (one of them a session another server left with a request open) reads the
    sessions table twice, the batched lookup and the left one's restore, not 300 times."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    left = uuid.uuid4()
    with worker(db) as first:
        stream = FakeStream()
        builder = BatchBuilder()
        builder.start(1, "/open", "GET", time.monotonic_ns())
        first._process([Inbound(stream, hello=hello("fleet", left))])
        batch = builder.build(1)
        raw = ingest_pb2.HostMessage(batch=batch).SerializeToString()
        first._process([Inbound(stream, batch=batch, raw=raw)])
        assert stream.seqs("stored") == {1}
    with worker(db) as second:
        lookups: list[str] = []

        @event.listens_for(second.engine, "before_cursor_execute")
        def _count(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
            if statement.startswith("SELECT sessions.id"):
                lookups.append(statement)

        streams = [FakeStream() for _ in range(300)]
        ids = [left, *(uuid.uuid4() for _ in streams[1:])]
        second._process(
            [Inbound(s, hello=hello("fleet", sid)) for s, sid in zip(streams, ids, strict=True)]
        )
        assert len(lookups) == 2
        assert len(second.lifecycle.live) == 300
        assert [p.route for p in second.lifecycle.live[str(left)].pending.values()] == ["/open"]
