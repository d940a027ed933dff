"""The host's transport against a real server: bounded buffering while the server is away,
whole requests dropped and counted, everything else stored once it comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from profiler_core.model import EventKind, LaneKind
from profiler_host.batching import Batcher
from profiler_host.functions import FunctionRegistry
from profiler_host.recording import Request
from profiler_host.transport import COUNTS_EVERY, Transport, TransportSettings
from profiler_host.transport import _wire_bytes as transport_wire_bytes
from tests.helpers import eventually, metric_value, sessions, stored_requests
from tests.processes import ServerProcess, free_port

CALLS = 50


def finished_request(request_id: int, fid: int) -> Request:
    """A request whose main lane entered and left `fid` CALLS times."""
    request = Request(request_id, f"/r/{request_id}", "GET", event_cap=10_000)
    t = request.start_ns
    for call in range(1, CALLS + 1):
        request.main.append((int(EventKind.ENTER), fid, call, t + 2 * call))
        request.main.append((int(EventKind.EXIT), fid, call, t + 2 * call + 1))
    request.finish(200)
    return request


def views_registry() -> tuple[FunctionRegistry, int]:
    """A registry that knows one function, `shop.views`, and that function's id."""
    registry = FunctionRegistry()
    return registry, registry.register("shop.views", compile("pass", "shop/views.py", "exec"))


def test_dead_server_buffer_is_bounded_and_drops_reach_the_server(tmp_path: Path):
    registry, fid = views_registry()
    port = free_port()
    budget = 16 * 1024
    transport = Transport(
        TransportSettings(f"127.0.0.1:{port}", "buffered", budget, flush_interval=0.05),
        registry,
        running=list,
    )
    submitted = 200
    for n in range(1, submitted + 1):
        transport.submit(finished_request(n, fid))
        if n % 20 == 0:
            time.sleep(0.3)  # bursts, some of them while the transport backs off
    eventually(lambda: transport.dropped_requests["buffer_full"], timeout=30)
    eventually(lambda: transport.pending == 0, timeout=30)
    assert 0 < transport.dropped_requests["buffer_full"] < submitted
    one_request = transport_wire_bytes(finished_request(0, fid))
    assert transport.backlog_bytes <= budget + one_request  # however many finished at once

    server = ServerProcess(
        f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log", grpc_port=port
    )
    try:
        assert transport.flush(timeout=60), "backlog not acked after the server came back"
        dropped = transport.dropped_requests["buffer_full"]  # final: nothing is pending
        kept = submitted - dropped
        stored = eventually(
            lambda: len(stored_requests(server.http, service="buffered")) == kept, timeout=30
        )
        assert stored, (kept, len(stored_requests(server.http, service="buffered")))
        assert all(r["calls"] == CALLS for r in stored_requests(server.http, service="buffered"))
        reported = eventually(
            lambda: metric_value(
                server.http, "profiler_host_dropped_requests_total", reason="buffer_full"
            ),
            timeout=30,
        )
        assert reported == dropped
    finally:
        transport.stop(timeout=1)
        server.stop(grace=10)


def test_a_requests_estimated_share_of_a_batch_bounds_its_encoded_size():
    """The budget admits finished requests by an estimate taken before encoding: it must
    not be below what they encode to, even with far-apart timestamps, many lanes and
    functions, and call ids in the millions."""
    registry = FunctionRegistry()
    fids = [registry.register("m", compile("pass", f"m{n}.py", "exec")) for n in range(300)]
    request = Request(1, "/r/" + "x" * 200, "GET", event_cap=10**7)
    lanes = [request.main] + [
        request.spawn(request.main, LaneKind.THREAD, "worker " * 20) for _ in range(5)
    ]
    t = request.start_ns
    for n in range(3_000):
        lane = lanes[n % len(lanes)]
        call = 5_000_000 + n
        lane.append((int(EventKind.ENTER), fids[n % len(fids)], call, t + n * 40_000_000))
        lane.append((int(EventKind.EXIT), fids[n % len(fids)], call, t + n * 40_000_000 + 9))
    request.finish(500)
    batcher = Batcher(registry)
    batcher.build([], [], None)  # the functions' definitions go out before
    estimate = transport_wire_bytes(request)
    encoded = len(batcher.build([], [request], None).payload(1))
    assert encoded <= estimate, (encoded, estimate)


def test_lanes_spawned_from_many_threads_at_once_get_distinct_ids():
    request = Request(1, "/r", "GET", event_cap=10_000)
    barrier = threading.Barrier(8)

    def spawn_many() -> None:
        barrier.wait()
        for _ in range(200):
            request.spawn(request.main, LaneKind.THREAD, "worker")

    threads = [threading.Thread(target=spawn_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [lane.id for lane in request.lanes]
    assert len(ids) == len(set(ids)) == 1 + 8 * 200


def test_a_running_request_with_nothing_new_makes_no_batch():
    """A sampled request asleep (or a whole-process job waiting) must not cost the server a
    batch, a transaction and a dedup row every flush interval."""
    batcher = Batcher(FunctionRegistry())
    request = Request(1, "/sleep", "GET", event_cap=10_000)
    assert batcher.build([request], [], None).build(0).ByteSize() > 0  # its start record
    assert batcher.build([request], [], None).build(0).ByteSize() == 0


class _CountingTransport(Transport):
    """Counts the transport thread's passes over the recorded requests."""

    passes = 0

    def _collect(self) -> None:
        self.passes += 1
        super()._collect()


def test_an_idle_transport_sleeps_until_a_request_needs_it(tmp_path: Path):
    """With nothing running or waiting, the transport thread wakes for nothing (an idle
    service pays no periodic cost); a finished request still goes out at once."""
    registry, fid = views_registry()
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    transport = _CountingTransport(
        TransportSettings(server.target, "idle", flush_interval=0.02), registry, list
    )
    try:
        for number in (1, 2):
            transport.submit(finished_request(number, fid))
            stored = eventually(
                lambda n=number: len(stored_requests(server.http, service="idle")) == n,
                timeout=30,
            )
            assert stored, f"request {number} was not stored"
            settled = transport.passes
            time.sleep(1.0)  # 50 flush intervals
            assert transport.passes - settled <= 1, transport.passes - settled
    finally:
        transport.stop(timeout=5)
        server.stop(grace=10)


def test_while_the_server_is_away_an_idle_transport_wakes_only_to_retry():
    """Backing off, the transport batches every flush interval only while requests wait;
    with nothing to send it sleeps through the backoff (an attempt collects a few times)."""
    registry, fid = views_registry()
    transport = _CountingTransport(
        TransportSettings(f"127.0.0.1:{free_port()}", "away", flush_interval=0.02), registry, list
    )
    try:
        transport.submit(finished_request(1, fid))
        assert eventually(lambda: transport.pending == 0 and transport.passes > 0, timeout=30)
        settled = transport.passes
        time.sleep(2.0)  # 100 flush intervals; attempts back off from 0.5 s, doubling
        assert transport.passes - settled <= 20, transport.passes - settled
    finally:
        transport.stop(timeout=1)


def test_an_idle_stream_ends_and_gRPCs_threads_with_it(tmp_path: Path):
    """All stored and nothing new for `idle_close`: the stream ends, and with it the host's
    writer and acks reader, and in the relay process gRPC's channel and its core's threads
    (which wake several times a second while it is open); no thread of the app's but the
    transport's stays, and it waits without waking, and the relay keeps only its own. The
    next request opens a stream again and is stored."""
    registry, fid = views_registry()
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    transport = _CountingTransport(
        TransportSettings(server.target, "closes", flush_interval=0.02, idle_close=0.2),
        registry,
        list,
    )
    before = set(threading.enumerate())
    try:
        for number in (1, 2):
            transport.submit(finished_request(number, fid))
            stored = eventually(
                lambda n=number: len(stored_requests(server.http, service="closes")) == n,
                timeout=30,
            )
            assert stored, f"request {number} was not stored"
            closed = eventually(
                lambda n=number: (
                    transport.idle_closes == n
                    and set(threading.enumerate()) - before == {transport._thread}
                ),
                timeout=30,
            )
            assert closed, (transport.idle_closes, set(threading.enumerate()) - before)
            relay = f"/proc/{transport.link.relay_pid}/task"
            alone = eventually(lambda r=relay: len(os.listdir(r)) == 1, timeout=10)
            assert alone, [Path(relay, t, "comm").read_text().strip() for t in os.listdir(relay)]
            settled = transport.passes
            time.sleep(0.5)  # more than two idle_close spans
            assert transport.passes == settled and transport.idle_closes == number
    finally:
        transport.stop(timeout=5)
        server.stop(grace=10)


def test_a_stream_the_server_ended_leaves_no_thread_behind(tmp_path: Path):
    """The stream's writer reads the outbox on a thread of its own, blocked until the next
    batch: however the stream ends (here the server stops), that thread ends too, so a
    server that comes and goes for days costs no thread per reconnection."""
    registry, fid = views_registry()
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    transport = Transport(
        TransportSettings(server.target, "ends", flush_interval=0.02), registry, list
    )
    before = set(threading.enumerate())
    try:
        transport.submit(finished_request(1, fid))
        assert eventually(lambda: stored_requests(server.http, service="ends"), timeout=30)
        streaming = set(threading.enumerate()) - before - {transport._thread}
        assert streaming  # the stream's threads: the outbox's writer, the acks reader
        server.stop(grace=10)
        ended = eventually(lambda: not any(t.is_alive() for t in streaming), timeout=30)
        assert ended, [t.name for t in streaming if t.is_alive()]
    finally:
        transport.stop(timeout=1)
        server.stop(grace=10)


def test_a_killed_relay_is_replaced_and_what_it_carried_is_sent_again(tmp_path: Path):
    """The relay process holds the stream, the app the unacked batches: a relay that dies
    (here SIGKILL, while a batch may be in flight) is replaced at the next attempt and the
    backlog goes out again under the same session, each request stored once. Killed in
    several rounds: the stream's end, seen by its reader thread while the sending thread
    may be waking for another reason, must never leave the sending thread asleep with
    the backlog unsent."""
    registry, fid = views_registry()
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    transport = Transport(
        TransportSettings(server.target, "relayed", flush_interval=0.02), registry, list
    )
    rounds = 4
    try:
        for n in range(1, 6):
            transport.submit(finished_request(n, fid))
        assert transport.flush(timeout=30)
        for killed in range(1, rounds + 1):
            first = transport.link.relay_pid
            assert first is not None and first != os.getpid()
            os.kill(first, signal.SIGKILL)
            for n in range(5 * killed + 1, 5 * killed + 6):
                transport.submit(finished_request(n, fid))
            assert transport.flush(timeout=60), f"not stored through relay {killed + 1}"
            assert transport.link.relay_pid not in (None, first)
        stored = eventually(
            lambda: len(stored_requests(server.http, service="relayed")) == 5 * (rounds + 1),
            timeout=30,
        )
        assert stored, stored_requests(server.http, service="relayed")
        assert len(sessions(stored_requests(server.http, service="relayed"))) == 1
    finally:
        transport.stop(timeout=1)
        server.stop(grace=10)


RELAYED_APP = """
import sys, time
from profiler_core.model import EventKind
from profiler_host.functions import FunctionRegistry
from profiler_host.recording import Request
from profiler_host.transport import Transport, TransportSettings

registry = FunctionRegistry()
fid = registry.register("app.view", compile("pass", "app/view.py", "exec"))
transport = Transport(TransportSettings(sys.argv[1], "relayed-app"), registry, list)

def finished(number):
    request = Request(number, "/r", "GET", event_cap=100)
    request.main.append((int(EventKind.ENTER), fid, 1, request.start_ns))
    request.main.append((int(EventKind.EXIT), fid, 1, request.start_ns + 1))
    request.finish(200)
    return request

transport.submit(finished(1))
assert transport.flush(timeout=30)
print(transport.link.relay_pid, "grpc" in sys.modules, flush=True)
for line in sys.stdin:  # a request number: recorded, flushed, and which relay carried it
    transport.submit(finished(int(line)))
    print(transport.flush(timeout=30), transport.link.relay_pid, flush=True)
time.sleep(600)
"""


def _relayed_app(tmp_path: Path, server: ServerProcess) -> subprocess.Popen[str]:
    script = tmp_path / "app.py"
    script.write_text(RELAYED_APP)
    return subprocess.Popen(
        [sys.executable, str(script), server.target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_relay_ends_with_the_app_and_the_app_never_loads_grpc(tmp_path: Path):
    """gRPC runs only in the relay (so the app forks safely whatever its stream does), and
    an app killed outright leaves no relay behind: it ends with the app's socket."""
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    app = _relayed_app(tmp_path, server)
    try:
        assert app.stdout is not None
        relay, grpc_loaded = app.stdout.readline().split()
        assert grpc_loaded == "False"
        assert Path(f"/proc/{relay}").exists()
        app.kill()
        app.wait(timeout=30)
        assert eventually(lambda: not _running(int(relay)), timeout=30), f"relay {relay} stays"
    finally:
        app.kill()
        server.stop(grace=10)


def test_a_relay_sent_sigterm_stays_until_the_app_ends(tmp_path: Path):
    """A service manager that stops a service by sending SIGTERM to each of its processes
    (systemd's control-group kill) reaches the relay too: it stays, so the app's last
    batches, flushed as it stops, go out through it, and it ends with the app."""
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    app = _relayed_app(tmp_path, server)
    try:
        assert app.stdin is not None and app.stdout is not None
        relay = int(app.stdout.readline().split()[0])
        os.kill(relay, signal.SIGTERM)
        app.stdin.write("2\n")
        app.stdin.flush()
        assert app.stdout.readline().split() == ["True", str(relay)]
        stored = eventually(
            lambda: len(stored_requests(server.http, service="relayed-app")) == 2, timeout=30
        )
        assert stored, stored_requests(server.http, service="relayed-app")
        app.stdin.close()
        app.kill()
        app.wait(timeout=30)
        assert eventually(lambda: not _running(relay), timeout=30), f"relay {relay} stays"
    finally:
        app.kill()
        server.stop(grace=10)


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie waiting for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_counts_waiting_for_their_report_do_not_hold_back_a_finished_request() -> None:
    """Between two reports of every request's counts the transport sleeps until the next
    one is due (up to COUNTS_EVERY), woken by no counted request; a sampled request that
    ends meanwhile still wakes it, to go out within the flush interval."""
    transport = Transport(TransportSettings("127.0.0.1:9", "counted"), FunctionRegistry(), list)
    transport.counts.waiting = False  # as after the transport's last look: no thread needed
    transport.counts.add("/a", "GET", 200, 1_000)
    wait = transport._next_wait()
    assert wait is not None and 0 <= wait <= COUNTS_EVERY
    assert not transport.counts.waiting  # a counted request does not wake it ...
    assert transport._idle  # ... but a kick (a finished request, a drop, a flush) does


def test_requests_ending_close_together_share_a_batch_and_a_flush_cuts_the_wait(tmp_path: Path):
    """A request that ends after a quiet spell goes at once; those that end within the next
    flush interval wait for it and go as one batch (a batch costs the host's threads the
    same whatever it holds); a flush sends them without waiting the interval out, which
    here is longer than the flush's own timeout."""
    registry, fid = views_registry()
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    transport = Transport(
        TransportSettings(server.target, "lingers", flush_interval=600.0), registry, running=list
    )
    try:
        transport.submit(finished_request(1, fid))
        assert eventually(lambda: transport.stored_batches == 1, timeout=30)
        for n in range(2, 7):
            transport.submit(finished_request(n, fid))
            time.sleep(0.02)
        assert transport.flush(timeout=30)
        assert transport.stored_batches == 2  # the five together
        stored = eventually(
            lambda: len(stored_requests(server.http, service="lingers")) == 6, timeout=30
        )
        assert stored, stored_requests(server.http, service="lingers")
    finally:
        transport.stop(timeout=1)
        server.stop(grace=10)


def _switches(thread: threading.Thread) -> int:
    """How often `thread` has given up its core to wait (the kernel's count)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_an_open_stream_with_everything_acked_reads_nothing_until_a_batch(tmp_path: Path):
    """gRPC's sync reading of a stream wakes its thread every 100 ms to take the GIL; with
    every batch acked, the acks reader waits without waking instead. A batch sent wakes it
    for its ack, and a server that goes away is seen without one."""
    registry, fid = views_registry()
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log")
    transport = Transport(
        TransportSettings(server.target, "quiet", flush_interval=0.02, idle_close=600.0),
        registry,
        running=list,
    )
    try:
        for number in (1, 2):
            transport.submit(finished_request(number, fid))
            assert eventually(lambda n=number: transport.stored_batches == n, timeout=30)
            (reader,) = [t for t in threading.enumerate() if t.name == "request-profiler-acks"]
            waits = _switches(reader)
            time.sleep(1.0)  # ten of gRPC's read timeouts
            assert _switches(reader) - waits <= 1, _switches(reader) - waits
        stored = eventually(
            lambda: len(stored_requests(server.http, service="quiet")) == 2, timeout=30
        )
        assert stored, stored_requests(server.http, service="quiet")
        server.stop(grace=10)
        assert eventually(lambda: not reader.is_alive() and not transport.connected, timeout=30)
    finally:
        transport.stop(timeout=1)
        server.stop(grace=10)
