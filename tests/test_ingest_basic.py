"""The story: a host streams requests, the server acks them once stored, a user reads them."""

from __future__ import annotations

import gc
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from profiler_core.wire.builder import BatchBuilder
from profiler_server.app import GC_YOUNG_THRESHOLD, SWITCH_INTERVAL
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch
from profiler_server.pipeline import GROUP_MAX
from tests.helpers import eventually, metric_value


def test_streamed_requests_are_stored_and_readable(server) -> None:
    shape = CallShape(calls=50, depth=5, functions=10)
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    builder = BatchBuilder()
    synthetic_batch(builder, shape, range(1, 4))
    stream.send_batch(builder.build(1))
    assert stream.wait_acked({1})
    assert stream.stored == {1}

    listed = server.get("/api/requests", service="shop").json()["requests"]
    assert len(listed) == 3
    assert all(r["calls"] == 50 and r["route"] == "/items/{id}" for r in listed)
    one = server.get(f"/api/requests/{listed[0]['id']}").json()
    root = one["lanes"][0]["root"]
    assert one["lanes"][0]["kind"] == "main"

    def count(node: dict) -> int:
        return 1 + sum(count(c) for c in node["children"])

    assert count(root) == 51
    stream.close()


def test_the_route_at_the_end_replaces_the_start_one(server) -> None:
    """A request streamed before its framework matched the route: the start carries the
    raw path, the end the template, and the template is stored."""
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    first = BatchBuilder()
    first.start(1, "/orders/25", "GET", 1_000)
    stream.send_batch(first.build(1))
    then = BatchBuilder()
    then.end(1, 2_000, 200, route="/orders/<int:order_id>")
    stream.send_batch(then.build(2))
    assert stream.wait_acked({1, 2})
    stream.close()
    (stored,) = server.get("/api/requests", service="shop").json()["requests"]
    assert stored["route"] == "/orders/<int:order_id>"


def test_a_started_server_tunes_the_gc_and_the_gil_for_its_threads(server) -> None:
    # the server's process: what it built at start frozen, young objects scanned less
    # often, the GIL handed over sooner
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD > 700
    assert sys.getswitchinterval() == SWITCH_INTERVAL < 0.005


def test_streams_wait_for_room_in_a_full_queue_without_polling(server, monkeypatch) -> None:
    """Storage stalls (its write lock held): the storer, then the worker, then the queue
    fill, and the streams wait in line for the worker to take from it. The queue is asked
    a few times in all (streams retrying on a timer would ask it hundreds of times while
    storage is held up), then everything is stored, once, when storage moves again."""
    pipeline = server.server.pipeline
    refused: list[object] = []
    submit = pipeline.submit

    def counted(item: object) -> bool:
        taken = submit(item)
        if not taken:
            refused.append(item)
        return taken

    monkeypatch.setattr(pipeline, "submit", counted)
    shape = CallShape(calls=1, depth=1, functions=1)
    per_stream = (pipeline.queue.maxsize + 4 * GROUP_MAX) // 2
    streams = [HostStream(server.target) for _ in range(3)]
    with pipeline.write_lock:
        for stream in streams:
            stream.send_hello(hello("shop"))
            for seq in range(1, per_stream + 1):
                builder = BatchBuilder()
                synthetic_batch(builder, shape, [seq], define_functions=seq == 1)
                stream.send_batch(builder.build(seq))
        eventually(lambda: refused)
        time.sleep(0.5)  # what streams retrying on a timer would fill with retries
        # each time the queue fills, the first stream to find it full asks three times and
        # each other one twice; it fills again after each group the worker takes, which
        # stops at three (one storing, one waiting for the storer, one in hand)
        assert 0 < len(refused) <= 4 * (len(streams) * 2 + 1)
    for stream in streams:
        assert stream.wait_acked(set(range(1, per_stream + 1)), timeout=60)
        assert stream.rejected == set()
    # one request a batch, each stored once
    assert metric_value(server.http, "profiler_requests_stored_total") == 3 * per_stream


def test_grpc_health_service_reports_serving(server) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "request_profiler.v1.Ingest"):
            answer = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_host_drop_reports_are_counted_with_bounded_reasons(server) -> None:
    stream = HostStream(server.target)
    stream.send_hello(hello("shop"))
    first = BatchBuilder()
    first.drops({"buffer_full": 3}, {"event_cap": 7})
    stream.send_batch(first.build(1))
    assert stream.wait_acked({1})
    then = BatchBuilder()  # 40 more reasons: only 31 more get a series of their own
    then.drops({f"reason-{i}-" + "x" * 100: 1 for i in range(40)}, {})
    stream.send_batch(then.build(2))
    assert stream.wait_acked({2})
    stream.close()
    text = server.get("/metrics").text
    samples = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "profiler_host_dropped_requests_total"
    ]
    by_reason = {s.labels["reason"]: s.value for s in samples}
    assert by_reason["buffer_full"] == 3
    assert len(by_reason) == 33 and by_reason["(other)"] == 40 + 1 - 32
    assert all(len(r.encode()) <= 64 for r in by_reason)
    events = metric_value(server.http, "profiler_host_dropped_events_total", reason="event_cap")
    assert events == 7


def test_replies_from_the_worker_thread_all_arrive_in_order() -> None:
    """The worker posts acks from its own thread; the loop delivers every one, each
    stream's in the order posted, waking once per burst rather than once per reply."""
    import asyncio
    import threading

    from profiler_server.ingest.service import Mailbox, StreamHandle

    async def main() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        mailbox = Mailbox(loop)
        wakes = 0
        deliver = mailbox._deliver

        def counted() -> None:
            nonlocal wakes
            wakes += 1
            deliver()

        mailbox._deliver = counted  # type: ignore[method-assign]
        handles = [StreamHandle(mailbox) for _ in range(4)]

        def worker() -> None:
            for n in range(20_000):
                handles[n % 4].send(n)  # type: ignore[arg-type]

        thread = threading.Thread(target=worker)
        thread.start()
        got: list[list[int]] = [[] for _ in handles]
        for handle, out in zip(handles, got, strict=True):
            while len(out) < 5_000:
                out.append(await handle.next())  # type: ignore[arg-type]
        thread.join()
        return got, wakes

    got, wakes = asyncio.run(main())
    assert got == [list(range(k, 20_000, 4)) for k in range(4)]
    assert wakes < 20_000
