"""Ingest cost per event against call depth and stack width: the server's own pipeline run
in this process (no gRPC, like `stages`) on requests of one call chain 10 to 16,000 deep,
and on requests with up to 100,000 distinct stacks, each shape in a session of its own (so
its stacks are new). Figures are ratios to the 10-deep chain measured in the same run:
linear cost reads 1.0 whatever the shape.

Prometheus' scrape of the stack series (ProfileMetrics.promote) follows each batch, as
on a scraped server: a service's top-k stack places fill, and later stacks cost no label.
Time is the wall time of the worker's processing, median over rounds; memory is the peak
of Python's allocations (tracemalloc, NumPy's included) while a shape is processed, in a
pass of its own (tracing slows the code down)."""

from __future__ import annotations

import math
import statistics
import time
import tracemalloc
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from benchmarks import results
from benchmarks.server import fresh_database
from profiler_core.model import EventKind
from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_server import pipeline
from profiler_server.loadgen import hello
from profiler_server.metrics.health import ServerHealth
from profiler_server.metrics.profiles import ProfileMetrics
from profiler_server.settings import DEFAULTS
from profiler_server.storage import migrations
from profiler_server.storage.engine import open_engine

ENTER, EXIT = int(EventKind.ENTER), int(EventKind.EXIT)
DEPTHS = (10, 100, 1_000, 4_000, 16_000)
WIDTHS = (1_000, 10_000, 100_000)  # distinct stacks in one request


@dataclass
class Shape:
    name: str
    batches: list[ingest_pb2.Batch]
    events: int
    stacks: int  # distinct stacks: each is new to the shape's session


class _Stream:
    """Stands in for a gRPC stream: acks go nowhere."""

    def send(self, message: object) -> None:
        pass

    def abort(self, code: object, details: str) -> None:
        raise RuntimeError(details)


def _calls(builder: BatchBuilder, rid: int, tree: list[tuple[int, list[int]]]) -> None:
    """A request of calls given as (function, children's functions) per outer call, each
    outer call entered, its children called one after the other, and left."""
    kinds, fids, calls, times = bytearray(), [], [], []
    t = t0 = 1_000_000
    call = 0
    for outer, children in tree:
        call += 1
        mine = call
        kinds.append(ENTER)
        fids.append(outer)
        calls.append(mine)
        times.append(t := t + 100)
        for child in children:
            call += 1
            kinds += bytes([ENTER, EXIT])
            fids += [child, child]
            calls += [call, call]
            times += [t + 10, t + 60]
            t += 60
        kinds.append(EXIT)
        fids.append(outer)
        calls.append(mine)
        times.append(t := t + 100)
    builder.start(rid, "/shape", "GET", t0)
    builder.run(rid, 0, bytes(kinds), fids, calls, times)
    builder.end(rid, t + 100, 200)


def _chain(builder: BatchBuilder, rid: int, depth: int) -> None:
    """A request of one function calling itself `depth` deep (the issue's shape)."""
    t0 = 1_000_000
    calls = list(range(1, depth + 1))
    times = [t0 + 100 * i for i in range(1, 2 * depth + 1)]
    builder.start(rid, "/shape", "GET", t0)
    builder.run(
        rid, 0, bytes([ENTER] * depth + [EXIT] * depth), [1] * 2 * depth, calls + calls[::-1], times
    )
    builder.end(rid, times[-1] + 100, 200)


def _define(builder: BatchBuilder, fids: range) -> None:
    for fid in fids:
        builder.function(fid, "shape", f"f{fid}", "shape.py", fid)


def depth_shape(depth: int, events: int) -> Shape:
    """Enough requests `depth` deep for about `events` events, in batches of up to 32,000."""
    per_batch = max(1, 32_000 // (2 * depth))
    requests = max(1, events // (2 * depth))
    batches = []
    rid = 0
    while rid < requests:
        builder = BatchBuilder()
        if not batches:
            _define(builder, range(1, 2))
        for _ in range(min(per_batch, requests - rid)):
            rid += 1
            _chain(builder, rid, depth)
        batches.append(builder.build(len(batches) + 1))
    return Shape(f"depth {depth:,}", batches, requests * 2 * depth, depth)


def width_shape(width: int) -> Shape:
    """One request with `width` distinct stacks, two levels deep: `outer` functions each
    calling the same `inner` ones."""
    outer = math.isqrt(width)
    inner = width // outer
    builder = BatchBuilder()
    _define(builder, range(1, outer + inner + 1))
    children = list(range(outer + 1, outer + inner + 1))
    _calls(builder, 1, [(fid, children) for fid in range(1, outer + 1)])
    events = builder.event_count
    stacks = outer * (inner + 1)
    return Shape(f"width {stacks:,}", [builder.build(1)], events, stacks)


def _worker(url: str) -> pipeline.Pipeline:
    engine = open_engine(url)
    migrations.upgrade(engine)
    registry = CollectorRegistry(auto_describe=True)
    return pipeline.Pipeline(
        engine,
        DEFAULTS,
        ServerHealth(registry),
        ProfileMetrics(registry, DEFAULTS.top_k, DEFAULTS.top_functions, DEFAULTS.max_routes),
    )


def _feed(worker: pipeline.Pipeline, shape: Shape) -> float:
    """Processes the shape's batches in a new session; the seconds it took."""
    stream = _Stream()
    worker._process([pipeline.Inbound(stream, hello=hello("depth"))])
    raws = [ingest_pb2.HostMessage(batch=b).SerializeToString() for b in shape.batches]
    started = time.perf_counter()
    for batch, raw in zip(shape.batches, raws, strict=True):
        worker._process([pipeline.Inbound(stream, batch=batch, raw=raw)])
        worker.profiles.promote()  # a scrape, as Prometheus makes of a server
    return time.perf_counter() - started


def _peak(worker: pipeline.Pipeline, shape: Shape) -> int:
    """Peak bytes allocated above what was held before, while processing the shape."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _feed(worker, shape)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def run(
    db: str, rounds: int, events: int, depths: tuple[int, ...], widths: tuple[int, ...]
) -> dict:
    shapes = [depth_shape(d, events) for d in (10, *depths) if d > 0]
    shapes = list({s.name: s for s in shapes}.values())
    shapes += [width_shape(w) for w in widths]
    seconds: dict[str, list[float]] = {s.name: [] for s in shapes}
    peaks: dict[str, int] = {}
    with fresh_database(db) as url:
        worker = _worker(url)
        _feed(worker, shapes[0])  # warm-up: imports, statements, caches
        for _ in range(rounds):
            for shape in shapes:
                seconds[shape.name].append(_feed(worker, shape))
        for shape in shapes:
            peaks[shape.name] = _peak(worker, shape)
        worker.engine.dispose()
    base = shapes[0]
    base_ns = statistics.median(seconds[base.name]) / base.events * 1e9
    base_peak = peaks[base.name] / base.events
    rows = {}
    for shape in shapes:
        ns = statistics.median(seconds[shape.name]) / shape.events * 1e9
        peak = peaks[shape.name] / shape.events
        rows[shape.name] = {
            "events": shape.events,
            "new_stacks_per_event": round(shape.stacks / shape.events, 4),
            "ns_per_event": round(ns),
            "time_ratio": round(ns / base_ns, 2),
            "peak_bytes_per_event": round(peak),
            "memory_ratio": round(peak / base_peak, 2),
        }
    figures = {"db": db, "rounds": rounds, "baseline": base.name, "shapes": rows}
    report(figures)
    print(f"saved {results.save(f'depth-{db}', figures)}")
    return figures


def report(f: dict) -> None:
    print(
        f"\ningest cost per event by call depth and stack width, in-process on {f['db']} "
        f"(median of {f['rounds']} rounds; ratios to {f['baseline']})"
    )
    print(
        results.table(
            (
                "shape",
                "events",
                "new stacks/event",
                "ns/event",
                "time ratio",
                "peak B/event",
                "memory ratio",
            ),
            [
                (
                    name,
                    f"{r['events']:,}",
                    r["new_stacks_per_event"],
                    f"{r['ns_per_event']:,}",
                    r["time_ratio"],
                    f"{r['peak_bytes_per_event']:,}",
                    r["memory_ratio"],
                )
                for name, r in f["shapes"].items()
            ],
        )
    )
