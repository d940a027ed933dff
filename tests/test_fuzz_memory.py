"""A fuzz campaign over real gRPC against a server subprocess: many random, bit-flipped,
cut, spliced and limit-pushing host messages from several streams at once (FUZZ_SECONDS,
30 by default). The server's
memory (its RSS, sampled all along) stays within the bound docs/limits.md states, it keeps
running, and a good host is served correctly afterwards."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

from profiler_core.wire.builder import BatchBuilder
from profiler_server.hostile import HostileMessages
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch
from tests.helpers import eventually, metric_value, stored_requests
from tests.processes import ServerProcess

SETTINGS = (
    "--max-open-events", "200000",
    "--max-open-requests", "1000",
    "--max-session-functions", "2000",
    "--max-message-bytes", str(1 << 20),
    "--max-services", "20",
    "--stream-timeout", "2s",
)  # fmt: skip
STREAMS = 6
SECONDS = float(os.environ.get("FUZZ_SECONDS", 30))
MESSAGES_PER_STREAM = 100
BOUND_MB = 400  # docs/limits.md, "Server memory"
GOOD = CallShape(calls=40, depth=5, functions=6)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def good_host(server: ServerProcess, service: str, seq: int = 1) -> dict:
    """One well-formed request, stored and acked; returns it as the API lists it."""
    stream = HostStream(server.target)
    stream.send_hello(hello(service))
    builder = BatchBuilder()
    synthetic_batch(builder, GOOD, range(1, 2))
    stream.send_batch(builder.build(seq))
    assert stream.wait_acked({seq}, timeout=30) and stream.stored == {seq}
    stream.close()
    (stored,) = eventually(lambda: stored_requests(server.http, service=service), timeout=30)
    return stored


def fuzz(server: ServerProcess, seed: int, until: float, sent: list[int]) -> None:
    """Streams of hostile messages until `until`: each a Hello, then messages sent without
    waiting for acks; ended cleanly or dropped."""
    messages = HostileMessages(seed)
    choose = random.Random(seed)
    while time.monotonic() < until:
        stream = HostStream(server.target)
        stream.send_hello(hello(f"fuzz-{choose.randrange(100)}"))
        for _ in range(MESSAGES_PER_STREAM):
            if stream.done.is_set():
                break
            stream.send_raw(messages.next())
            sent[0] += 1
        if choose.random() < 0.5:
            stream.close(timeout=10)
        else:
            stream.kill()


def test_a_fuzz_campaign_keeps_server_memory_bounded_and_a_good_host_served(
    tmp_path: Path,
) -> None:
    server = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "server.log", *SETTINGS)
    try:
        good_host(server, "before")  # everything imported and warmed up
        idle = rss_mb(server.proc.pid)
        peak = [idle]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                peak[0] = max(peak[0], rss_mb(server.proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        until = time.monotonic() + SECONDS
        sent = [[0] for _ in range(STREAMS)]
        hosts = [
            threading.Thread(target=fuzz, args=(server, seed, until, sent[seed]), daemon=True)
            for seed in range(STREAMS)
        ]
        for host in hosts:
            host.start()
        for host in hosts:
            host.join(SECONDS + 60)
        stop.set()
        sampler.join()

        assert server.proc.poll() is None, server.log.read_text()[-3000:]
        total = sum(s[0] for s in sent)
        rejected = metric_value(server.http, "profiler_ingest_rejected_total", reason="garbage")
        print(f"fuzz: {total} messages, idle {idle:.0f} MB, peak {peak[0]:.0f} MB")
        assert total > 1000 and rejected > 0
        assert peak[0] - idle <= BOUND_MB, f"RSS {idle:.0f} -> {peak[0]:.0f} MB"

        # what the campaign queued is worked off (hostile messages are costly to store: the
        # queue of 1,024 takes a minute or two here), then a good host is served as usual
        backlog = "profiler_ingest_backlog_messages"
        assert eventually(lambda: metric_value(server.http, backlog) == 0, timeout=240)
        after = good_host(server, "after")
        log = server.log.read_text()
        assert "housekeeping failed" not in log and "storage write failed" not in log
        assert after["calls"] == GOOD.calls and not after["truncated"]
    finally:
        server.stop(grace=10)
