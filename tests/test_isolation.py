"""The story: one host sends what a database cannot hold; every other host's data is
stored, nothing of theirs waits, fails or is aborted, and the bad part is counted."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import grpc
import httpx
import pytest

from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.assembly import problems as P
from profiler_server.assembly import session as session_module
from profiler_server.assembly.text import storable
from profiler_server.loadgen import HostStream, hello
from profiler_server.pipeline import Inbound, Pipeline
from tests.helpers import FakeStream, eventually, metric_value, stored_requests, worker
from tests.processes import GUNICORN, ServerProcess, serve_profiled

NUL_TEXT = "a\x00b\ud800c"


def test_storable_replaces_what_no_backend_holds_and_cuts_long_names() -> None:
    problems: Counter = Counter()
    assert storable(NUL_TEXT, 100, problems) == "a\ufffdb\ufffdc"
    assert storable("x" * 10, 5, problems) == "xxxx…"
    assert storable("fine", 4, problems) == "fine"
    assert problems == {P.UNSTORABLE_TEXT: 1, P.LONG_NAME: 1}


def request_batch(seq: int, route: str, name: str = "f", lane: str = "") -> ingest_pb2.Batch:
    """One whole request (f called once), defining f as `app:{name}`."""
    builder = BatchBuilder()
    builder.function(1, "app", name, f"app/{name}.py", 3)
    t0 = time.monotonic_ns()
    builder.start(seq, route, "GET", t0)
    builder.run(seq, 0, bytes([0, 1]), [1, 1], [1, 1], [t0 + 10, t0 + 20])
    if lane:  # a thread the request started, where f runs again
        builder.run(seq, 1, bytes([0, 1]), [1, 1], [2, 2], [t0 + 12, t0 + 18])
    builder.end(seq, t0 + 30, 404)
    batch = builder.build(seq)
    if lane:
        batch.lanes.add(
            request_id=seq, lane_id=1, kind=ingest_pb2.THREAD, name=lane, start_ns=t0 + 11
        )
    return batch


def rejected(http: str) -> dict[str, float]:
    found = {r: metric_value(http, "profiler_ingest_rejected_total", reason=r) for r in P.REASONS}
    return {reason: value for reason, value in found.items() if value}


def test_text_no_backend_holds_is_stored_the_same_on_each(server) -> None:
    bad = HostStream(server.target)
    bad_hello = hello("svc\x00x")
    bad_hello.hostname = "host\x00"
    bad.send_hello(bad_hello)
    batch = request_batch(1, "/x\x00y", name="g\x00h", lane="lane\x00")
    batch.functions[0].module = "app\x00"
    bad.send_batch(batch)
    assert bad.wait_acked({1}) and bad.stored == {1}, bad.error

    (stored,) = eventually(lambda: stored_requests(server.http, service="svc\ufffdx"))
    assert stored["route"] == "/x\ufffdy"
    tree = server.get(f"/api/requests/{stored['id']}").json()
    main, lane = tree["lanes"]
    assert lane["name"] == "lane\ufffd"
    assert [c["function"] for c in main["root"]["children"]] == ["app\ufffd:g\ufffdh"]
    # route, service, hostname, module, qualname, file, lane
    assert rejected(server.http) == {P.UNSTORABLE_TEXT: 7}
    bad.close()


def test_names_longer_than_the_limit_are_cut_with_a_marker(db_url, start_server) -> None:
    server = start_server(db_url, max_name_length=20)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    stream.send_batch(request_batch(1, "/" + "r" * 100, name="n" * 100, lane="l" * 100))
    assert stream.wait_acked({1}) and stream.stored == {1}

    (stored,) = eventually(lambda: stored_requests(server.http, service="shop"))
    assert stored["route"] == "/" + "r" * 18 + "…"
    main, lane = server.get(f"/api/requests/{stored['id']}").json()["lanes"]
    assert lane["name"] == "l" * 19 + "…"
    assert main["root"]["children"][0]["function"] == "app:" + "n" * 19 + "…"
    assert rejected(server.http) == {P.LONG_NAME: 4}  # route, qualname, file, lane
    stream.close()


# --- a batch the store refuses ------------------------------------------------------------------


@pytest.fixture
def pipeline(pg_url) -> Iterator[Pipeline]:
    with worker(pg_url) as made:
        yield made


def test_a_batch_the_store_refuses_is_rejected_alone(pipeline, monkeypatch) -> None:
    """With the text repair off, a NUL reaches PostgreSQL and fails the transaction that
    holds it: the worker finds that batch, rejects it, and stores everything else."""
    monkeypatch.setattr(session_module, "storable", lambda text, limit, problems: text)
    streams = [FakeStream() for _ in range(3)]
    hellos = [hello(f"host{i}") for i in range(3)]
    items = [Inbound(s, hello=h) for s, h in zip(streams, hellos, strict=True)]
    items += [
        Inbound(streams[0], batch=request_batch(1, "/fine")),
        Inbound(streams[1], batch=request_batch(1, "/x\x00y")),
        Inbound(streams[2], batch=request_batch(1, "/fine")),
        Inbound(streams[1], batch=request_batch(2, "/after")),
        Inbound(streams[2], batch=request_batch(2, "/fine")),
    ]
    pipeline._process(items)  # one group: one transaction, at first

    assert [s.aborted for s in streams] == [[], [], []]
    assert (streams[0].seqs("stored"), streams[0].seqs("rejected")) == ({1}, set())
    assert (streams[1].seqs("stored"), streams[1].seqs("rejected")) == ({2}, {1})
    assert (streams[2].seqs("stored"), streams[2].seqs("rejected")) == ({1, 2}, set())
    assert pipeline.health.rejected.labels(P.UNSTORABLE_BATCH)._value.get() == 1
    with pipeline.engine.connect() as conn:
        routes = conn.exec_driver_sql("SELECT session_id, route FROM requests").all()
    sid = [str(uuid.UUID(bytes=h.session_id)) for h in hellos]
    assert sorted(routes) == sorted(
        [(sid[0], "/fine"), (sid[1], "/after"), (sid[2], "/fine"), (sid[2], "/fine")]
    )
    # the session goes on: its next batch is stored, nothing waits for the rejected one
    pipeline._process([Inbound(streams[1], batch=request_batch(3, "/next"))])
    assert streams[1].seqs("stored") == {2, 3}


def request_part(seq: int, request_id: int, part: str) -> ingest_pb2.Batch:
    """Half of request `request_id` calling app:f: its start and enter, or its exit and end."""
    builder = BatchBuilder()
    t0 = 1_000_000
    if part == "start":
        builder.function(1, "app", "f", "app/f.py", 3)
        builder.start(request_id, "/split", "GET", t0)
        builder.run(request_id, 0, bytes([0]), [1], [1], [t0 + 10])
    else:
        builder.run(request_id, 0, bytes([1]), [1], [1], [t0 + 20])
        builder.end(request_id, t0 + 30, 200)
    return builder.build(seq)


def test_groups_assembled_on_one_the_store_refuses_are_redone_with_it(pipeline, monkeypatch):
    """The storer writes a group while the worker assembles the next on the state the first
    left in memory. When the first fails, both are redone from the database's state: the
    refused batch is rejected alone, and a request begun in the first and ended in the
    second is stored whole, once."""
    monkeypatch.setattr(session_module, "storable", lambda text, limit, problems: text)
    pipeline.storer.start()
    try:
        streams = [FakeStream() for _ in range(2)]
        hellos = [hello(f"host{i}") for i in range(2)]
        pipeline._process([Inbound(s, hello=h) for s, h in zip(streams, hellos, strict=True)])
        pipeline.catch_up()
        with pipeline.write_lock:  # the storer waits on the first group below
            pipeline._process(
                [
                    Inbound(streams[0], batch=request_part(1, 7, "start")),
                    Inbound(streams[1], batch=request_batch(1, "/x\x00y")),
                ]
            )
            pipeline._process(
                [
                    Inbound(streams[0], batch=request_part(2, 7, "end")),
                    Inbound(streams[1], batch=request_batch(2, "/after")),
                ]
            )
        pipeline.catch_up()
    finally:
        pipeline.storer.stop(10)

    assert [s.aborted for s in streams] == [[], []]
    assert (streams[0].seqs("stored"), streams[0].seqs("rejected")) == ({1, 2}, set())
    assert (streams[1].seqs("stored"), streams[1].seqs("rejected")) == ({2}, {1})
    assert pipeline.health.rejected.labels(P.UNSTORABLE_BATCH)._value.get() == 1
    with pipeline.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT session_id, route, events FROM requests").all()
    sid = [str(uuid.UUID(bytes=h.session_id)) for h in hellos]
    assert sorted(rows) == sorted([(sid[0], "/split", 2), (sid[1], "/after", 2)])
    assert not pipeline.sessions[sid[0]].pending


def test_housekeeping_does_not_wait_for_the_storer_and_is_redone_after_a_failed_group(
    pg_url, monkeypatch
) -> None:
    """Housekeeping's group goes to the storer behind a group still being stored (the
    worker does not wait for it). That group fails: both come back, the sessions are put
    back as stored, and the next tick times out the open request again: stored once."""
    monkeypatch.setattr(session_module, "storable", lambda text, limit, problems: text)
    now = [1_000.0]
    with worker(pg_url, request_timeout=1.0) as pipeline:
        pipeline.clock = lambda: now[0]
        pipeline.storer.start()
        try:
            streams = [FakeStream() for _ in range(2)]
            hellos = [hello(f"host{i}") for i in range(2)]
            items = [Inbound(s, hello=h) for s, h in zip(streams, hellos, strict=True)]
            pipeline._process(items)
            start = request_part(1, 7, "start")  # spooled whole: the reset replays it
            raw = ingest_pb2.HostMessage(batch=start).SerializeToString()
            pipeline._process([Inbound(streams[0], batch=start, raw=raw)])
            pipeline._housekeep()  # the first tick reaps (it reads storage): not the next ones
            pipeline.catch_up()
            now[0] += 2
            with pipeline.write_lock:  # the storer waits on the failing group
                pipeline._process([Inbound(streams[1], batch=request_batch(1, "/x\x00y"))])
                ticked = threading.Thread(target=pipeline._housekeep)
                ticked.start()
                ticked.join(30)
                assert not ticked.is_alive()  # it did not wait for the group before it
            pipeline.catch_up()
            now[0] += 2
            pipeline._housekeep()
            pipeline.catch_up()
        finally:
            pipeline.storer.stop(10)
        with pipeline.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT route, truncated FROM requests").all()
        timeouts = pipeline.health.rejected.labels(P.REQUEST_TIMEOUT)._value.get()

    assert (streams[1].seqs("stored"), streams[1].seqs("rejected")) == (set(), {1})
    assert rows == [("/split", True)]
    assert timeouts >= 1


# --- the whole story: a profiled app, a URL with a NUL, PostgreSQL, another host --------------


class SteadyHost(threading.Thread):
    """A host streaming one small batch after another until told to stop."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.stream = HostStream(target)
        self.stream.send_hello(hello("steady"))
        self.sent = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set() and self.sent < 2_000:
            self.sent += 1
            self.stream.send_batch(request_batch(self.sent, "/steady"))
            if not self.stream.wait_acked({self.sent}):
                return

    def finish(self) -> None:
        self.halt.set()
        self.join(30)
        self.stream.close()


def test_a_nul_in_a_url_stores_on_postgresql_next_to_another_host(tmp_path, pg_url) -> None:
    server = ServerProcess(pg_url, tmp_path / "server.log")
    steady = None
    try:
        steady = SteadyHost(server.target)
        steady.start()
        app = serve_profiled(
            server,
            tmp_path,
            "plain",
            *GUNICORN,
            "tests.plain_wsgi:app",
            options=("--sample-rate", "1000", "--include", "tests.plain_wsgi"),
        )
        try:
            for _ in range(3):
                assert httpx.get(f"{app.url}/x%00y", timeout=30).status_code == 404
                assert httpx.get(f"{app.url}/ok", timeout=30).status_code == 200
            nul = eventually(
                lambda: len(stored_requests(server.http, route="/x\ufffdy")) == 3, timeout=30
            )
            fine = eventually(
                lambda: len(stored_requests(server.http, route="/ok")) == 3,
                timeout=30,
            )
        finally:
            app.stop(grace=15)
        steady.finish()
        assert steady.stream.error is None, steady.stream.error
        assert steady.stream.rejected == set()
        assert steady.stream.stored == set(range(1, steady.sent + 1))
        assert steady.sent > 1
        stored = eventually(
            lambda: (
                metric_value(server.http, "profiler_requests_stored_total", service="steady")
                == steady.sent
            )
        )
        assert stored, "every request of the other host is stored"
        assert nul, "each request to /x%00y is stored"
        assert all(r["status"] == 404 for r in stored_requests(server.http, route="/x\ufffdy"))
        assert fine
        assert metric_value(server.http, "profiler_ingest_rejected_total", reason="unstorable_text")
        assert not metric_value(
            server.http, "profiler_ingest_rejected_total", reason=P.UNSTORABLE_BATCH
        )
    finally:
        if steady is not None and steady.is_alive():
            steady.finish()
        server.stop(grace=10)


@pytest.mark.parametrize("table", ["requests", "sessions"])
def test_a_database_that_refuses_everything_ends_the_streams_for_a_resend(pipeline, table) -> None:
    """Not the message's fault (a table is gone): nothing is rejected, the hosts resend."""
    streams = [FakeStream(), FakeStream()]
    pipeline._process([Inbound(streams[0], hello=hello("host"))])
    with pipeline.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")
    items = [
        Inbound(streams[0], batch=request_batch(1, "/fine")),
        Inbound(streams[1], hello=hello("other")),
    ]
    pipeline._process(items)

    assert [s.acks for s in streams] == [[], []]
    assert [[code for code, _ in s.aborted] for s in streams] == [[grpc.StatusCode.UNAVAILABLE]] * 2
    assert pipeline.health.rejected.labels(P.UNSTORABLE_BATCH)._value.get() == 0


def spoiled(message: ingest_pb2.HostMessage, good: bytes, bad: bytes) -> bytes:
    """`message` serialized with the bytes `good` (as long as `bad`) replaced by `bad`."""
    raw = message.SerializeToString()
    assert len(good) == len(bad) and raw.count(good) == 1
    return raw.replace(good, bad)


def test_strings_that_are_not_utf8_are_repaired_the_same_on_each(server) -> None:
    stream = HostStream(server.target)
    stream.send_raw(spoiled(ingest_pb2.HostMessage(hello=hello("svcQ")), b"svcQ", b"svc\xff"))
    batch = ingest_pb2.HostMessage(batch=request_batch(1, "/xQQQy", name="gZZZh"))
    # a lone surrogate as UTF-8 would encode it; a byte that starts no character (in the
    # function's qualname and file)
    raw = spoiled(batch, b"/xQQQy", b"/x\xed\xa0\x80y").replace(b"gZZZh", b"g\xc0ZZh")
    stream.send_raw(raw)
    assert stream.wait_acked({1}) and stream.stored == {1}, stream.error

    (stored,) = eventually(lambda: stored_requests(server.http, service="svc\ufffd"))
    assert stored["route"] == "/x\ufffd\ufffd\ufffdy"
    (main,) = server.get(f"/api/requests/{stored['id']}").json()["lanes"]
    assert [c["function"] for c in main["root"]["children"]] == ["app:g\ufffdZZh"]
    # service; route, qualname, file (app/gZZZh.py holds the same bad byte)
    assert rejected(server.http) == {P.UNSTORABLE_TEXT: 1 + 3}
    stream.close()
