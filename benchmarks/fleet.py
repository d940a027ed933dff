"""Fleet scale: many concurrent host streams, each sending one small batch at a time, against
a server on one core. Measures acked batches/s and ack latency (send to ack, as the host
sees it) for a steady per-host rate, or with `rate` 0 as fast as acks allow (the maximum).
The hosts are asyncio gRPC streams in this process (on the client core)."""

from __future__ import annotations

import asyncio
import random
import resource
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

import grpc
import numpy as np

from benchmarks import profiling, results
from benchmarks.load import SERVICE
from benchmarks.server import (
    ServerProcess,
    backends_cpu,
    cpu_used,
    fresh_database,
    thread_shares,
)
from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import METHOD, CallShape, hello, synthetic_batch

SHAPE = CallShape(calls=10, depth=5, functions=10)  # one request of 20 events a batch
STREAMS_PER_CHANNEL = 50
ACK_TIMEOUT = 30.0
GOAL_BATCHES = 5_000
GOAL_P99_S = 1.0
PROFILE_TOP = 25
MAX_RATE = 1_000  # batches/s one stream sends at most with `rate` 0
FLOOR_MODULE = "benchmarks.grpc_floor"
NO_DATABASE = "sqlite://"  # the floor stores nothing


def build_feed(batches: int) -> list[bytes]:
    """Serialized batches seq 1..n, one small request each (functions defined in seq 1)."""
    out = []
    for seq in range(1, batches + 1):
        builder = BatchBuilder()
        synthetic_batch(builder, SHAPE, range(seq, seq + 1), define_functions=seq == 1)
        out.append(builder.payload(seq))
    return out


@dataclass
class FleetResult:
    sent: list[float] = field(default_factory=list)  # send times of acked batches
    acked: list[float] = field(default_factory=list)  # their ack times
    rejected: int = 0
    unacked: int = 0
    errors: list[str] = field(default_factory=list)


class _Host:
    """One host: a Hello, then batches at `rate` per second (0: one in flight at a time)."""

    def __init__(self, channel: grpc.aio.Channel, feed: list[bytes], rate: float) -> None:
        self.feed = feed
        self.rate = rate
        self.call = channel.stream_stream(
            METHOD,
            request_serializer=lambda raw: raw,
            response_deserializer=ingest_pb2.ServerMessage.FromString,
        )()
        self.in_flight: dict[int, float] = {}
        self.acked = asyncio.Event()

    async def run(self, start: float, deadline: float, out: FleetResult) -> None:
        reader = asyncio.create_task(self._read(out))
        try:
            message = ingest_pb2.HostMessage(hello=hello(SERVICE, uuid.uuid4()))
            await self.call.write(message.SerializeToString())
            await self._send_all(start, deadline)
            await self._drain()
            await self.call.done_writing()
            await asyncio.wait_for(reader, ACK_TIMEOUT)
        except (TimeoutError, grpc.RpcError) as exc:
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else exc
            out.errors.append(f"{type(exc).__name__}: {details}"[:200])
        finally:
            reader.cancel()
            out.unacked += len(self.in_flight)

    async def _send_all(self, start: float, deadline: float) -> None:
        next_at = start + (random.random() / self.rate if self.rate else 0.0)
        for seq, raw in enumerate(self.feed, 1):
            if self.rate:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                next_at += 1.0 / self.rate
            else:
                while self.in_flight:
                    self.acked.clear()
                    await asyncio.wait_for(self.acked.wait(), ACK_TIMEOUT)
            if time.monotonic() >= deadline:
                return
            self.in_flight[seq] = time.monotonic()
            await self.call.write(raw)

    async def _drain(self) -> None:
        give_up = time.monotonic() + ACK_TIMEOUT
        while self.in_flight and time.monotonic() < give_up:
            self.acked.clear()
            try:
                await asyncio.wait_for(self.acked.wait(), give_up - time.monotonic())
            except TimeoutError:
                return

    async def _read(self, out: FleetResult) -> None:
        async for response in self.call:
            now = time.monotonic()
            for seq in response.ack.stored:
                sent = self.in_flight.pop(seq, None)
                if sent is not None:
                    out.sent.append(sent)
                    out.acked.append(now)
            for seq in response.ack.rejected:
                out.rejected += self.in_flight.pop(seq, None) is not None
            self.acked.set()


async def _drive(targets: list[str], streams: int, rate: float, seconds: float, feed: list[bytes]):
    """The hosts, their channels dealt round the servers (`targets`) as a load balancer
    would."""
    out = FleetResult()
    channels = [
        grpc.aio.insecure_channel(targets[i % len(targets)])
        for i in range(-(-streams // STREAMS_PER_CHANNEL))
    ]
    try:
        hosts = [_Host(channels[i // STREAMS_PER_CHANNEL], feed, rate) for i in range(streams)]
        start = time.monotonic()
        deadline = start + seconds
        await asyncio.gather(*(h.run(start, deadline, out) for h in hosts))
    finally:
        for channel in channels:
            await channel.close()
    return out, start, deadline


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _figures(out: FleetResult, start: float, deadline: float, warmup: float) -> dict:
    """Over the steady part, from the warmup to the end of sending: batches acked then
    per second, and the ack latency of the batches sent then."""
    sent, acked = np.array(out.sent), np.array(out.acked)
    steady = sent >= start + warmup
    window = max(deadline - (start + warmup), 1e-9)
    acked_in_window = int(((acked >= start + warmup) & (acked < deadline)).sum())
    latency = acked[steady] - sent[steady]
    pct = np.percentile(latency, [50, 99]).tolist() if latency.size else [float("nan")] * 2
    return {
        "acked_batches": int(sent.size),
        "steady_acked_batches": int(steady.sum()),
        "batches_per_second": round(acked_in_window / window, 1),
        "ack_p50_s": round(pct[0], 4),
        "ack_p99_s": round(pct[1], 4),
        "ack_max_s": round(float(latency.max()), 4) if latency.size else None,
    }


def _measured(
    servers: list[ServerProcess],
    url: str,
    streams: int,
    rate: float,
    seconds: float,
    warmup: float,
    feed: list[bytes],
) -> dict:
    """Drives `servers` with the fleet; its figures and the CPU each side used (the
    servers' summed, their threads listed per server when there are several)."""

    def cpu() -> float:
        return sum(server.cpu_seconds() for server in servers)

    cpu0, client0, pg0 = cpu(), _client_cpu(), backends_cpu(url)
    threads0 = [server.thread_cpu() for server in servers]
    targets = [server.target for server in servers]
    out, start, deadline = asyncio.run(_drive(targets, streams, rate, seconds, feed))
    cpu1, client1, pg1 = cpu(), _client_cpu(), backends_cpu(url)
    threads1 = [server.thread_cpu() for server in servers]
    wall = max(time.monotonic() - start, 1e-9)
    acked = max(len(out.sent), 1)
    threads = []
    for number, (before, after) in enumerate(zip(threads0, threads1, strict=True), 1):
        for row in thread_shares(before, after, wall):
            if len(servers) > 1:
                row["name"] = f"{number}: {row['name']}"
            threads.append({**row, "ms_per_batch": round(1000 * row["cpu_s"] / acked, 3)})
    return {
        **_figures(out, start, deadline, min(warmup, seconds / 2)),
        "server_cpu_share": round((cpu1 - cpu0) / wall, 3),
        # what a batch costs the server whatever share of the core it got (a loaded machine)
        "server_cpu_ms_per_batch": round(1000 * (cpu1 - cpu0) / acked, 3),
        "server_threads_ms_per_batch": threads,
        "client_cpu_share": round((client1 - client0) / wall, 3),
        "postgres_cpu_share": round(cpu_used(pg0, pg1) / wall, 3),
        "rejected_batches": out.rejected,
        "unacked_batches": out.unacked,
        "errors": out.errors[:20],
        "error_count": len(out.errors),
    }


def run(
    db: str,
    streams: int,
    rate: float,
    seconds: float,
    warmup: float,
    profile: bool = False,
    floor: bool = True,
    servers: int = 1,
) -> dict:
    """The fleet against the server, and first (`floor`) against benchmarks/grpc_floor.py,
    the cost of gRPC and the wire format alone, in the same run. With several `servers`
    (on one PostgreSQL), the hosts are split between them and the servers share the
    server core: their CPU per batch against one server's says what sharing the database
    costs."""
    if servers > 1 and (db != "postgresql" or profile):
        raise SystemExit("--servers above 1 needs --db postgresql and no --profile")
    # with `rate` 0, enough that no stream runs out, even against the floor
    batches = int(seconds * (rate or MAX_RATE)) + 2
    feed = build_feed(batches)
    name = f"fleet-{db}" + ("-profiled" if profile else "")
    json_path = results.path_for(name, ".json")
    profile_path = json_path.with_suffix(".prof") if profile else None
    figures: dict = {
        "db": db,
        "profiled": profile,
        "streams": streams,
        "servers": servers,
        "rate_per_stream": rate or "max (one batch in flight per stream)",
        "seconds": seconds,
        "warmup_s": warmup,
        "events_per_batch": 2 * SHAPE.calls,
        "goal_batches_per_second": GOAL_BATCHES,
        "goal_ack_p99_s": GOAL_P99_S,
    }
    if floor:
        with ExitStack() as stack:
            started = [
                stack.enter_context(ServerProcess(NO_DATABASE, module=FLOOR_MODULE))
                for _ in range(servers)
            ]
            figures["floor"] = _measured(started, NO_DATABASE, streams, rate, seconds, warmup, feed)
    with fresh_database(db) as url, ExitStack() as stack:
        started = [
            stack.enter_context(ServerProcess(url, profile_to=profile_path)) for _ in range(servers)
        ]
        figures.update(_measured(started, url, streams, rate, seconds, warmup, feed))
    figures["server_exit_code"] = max(server.returncode or 0 for server in started)
    if floor:
        base = figures["floor"]
        figures["of_floor"] = {
            name: round(figures[key] / base[key], 3) if base[key] else None
            for name, key in (
                ("batches_per_second", "batches_per_second"),
                ("server_cpu_per_batch", "server_cpu_ms_per_batch"),
            )
        }
    if profile_path is not None:
        figures["profile_file"] = str(profile_path)
        figures["profile_top"] = profiling.top(profile_path, "tottime", PROFILE_TOP)
        figures["profile_top_cumulative"] = profiling.top(profile_path, "cumtime", PROFILE_TOP)
    report(figures)
    print(f"saved {results.save(name, figures, json_path)}")
    return figures


def report(f: dict) -> None:
    base = f.get("floor")
    header = ("fleet", "server") + (("gRPC floor", "server / floor") if base else ())

    def line(label: str, ours: str, floor: str = "", ratio: str = "") -> tuple:
        return (label, ours, floor, ratio) if base else (label, ours)

    def row(label: str, key: str, show: Callable[[object], str] = str, ratio: str = "") -> tuple:
        floor = show(base[key]) if base else ""
        return line(label, show(f[key]), floor, str(f["of_floor"][ratio]) if base and ratio else "")

    latency = "{ack_p50_s} / {ack_p99_s} / {ack_max_s}"
    rows = [
        line("database", f["db"] + (" (under cProfile)" if f["profiled"] else ""), "none"),
        line("streams x rate", f"{f['streams']} x {f['rate_per_stream']}"),
        line("servers (sharing the server core)", str(f["servers"])),
        row("acked batches/s (steady)", "batches_per_second", "{:,}".format, "batches_per_second"),
        line("ack p50 / p99 / max s", latency.format(**f), latency.format(**(base or f))),
        line("goal", f"{f['goal_batches_per_second']:,}/s, p99 < {f['goal_ack_p99_s']} s"),
        row("server CPU (of one core)", "server_cpu_share", "{:.0%}".format),
        row(
            "server CPU per acked batch, ms",
            "server_cpu_ms_per_batch",
            str,
            "server_cpu_per_batch",
        ),
        row("client CPU (of one core)", "client_cpu_share", "{:.0%}".format),
        row("PostgreSQL backends' CPU (of one core)", "postgres_cpu_share", "{:.0%}".format),
        row("acked batches", "acked_batches"),
        row("rejected batches", "rejected_batches"),
        row("unacked batches", "unacked_batches"),
        row("errors", "error_count"),
    ]
    print()
    print(results.table(header, rows))
    print("\nserver CPU per acked batch, by thread (kernel accounting; main runs the loop):")
    for thread in f["server_threads_ms_per_batch"]:
        print(f"  {thread['name']:<16} tid {thread['tid']:<8} {thread['ms_per_batch']} ms")
    for error in f["errors"][:5] + (base["errors"][:5] if base else []):
        print(f"error: {error}")
    profiling.print_profile(f)
