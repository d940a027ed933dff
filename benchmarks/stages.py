"""Where the ingest time goes per event, without cProfile's distortion (it slows Python-heavy
code ~2.5x, unevenly): the server's own ingest pipeline run in this process on the same
batches (no gRPC), with a wall-clock timer around each stage."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from prometheus_client import CollectorRegistry

from benchmarks import results
from benchmarks.ingest import build
from benchmarks.load import SERVICE
from benchmarks.server import fresh_database
from profiler_core.wire import ingest_pb2
from profiler_server import pipeline
from profiler_server.assembly.session import Session
from profiler_server.loadgen import hello
from profiler_server.metrics.health import ServerHealth
from profiler_server.metrics.profiles import ProfileMetrics
from profiler_server.settings import DEFAULTS
from profiler_server.storage import migrations
from profiler_server.storage.engine import open_engine
from profiler_server.storage.writer import Writer
from profiler_server.worker import lifecycle

# (owner, attribute, stage); the worker's own names, so the timers see what the worker calls
STAGES = (
    (Session, "apply", "apply batch to session"),
    (lifecycle, "assemble_all", "assemble call trees"),
    (lifecycle, "summarize", "summarize: stacks, totals, tree"),
    (lifecycle.Sessions, "finish", "finish request (all)"),
    (Writer, "write", "storage transaction"),
    (ProfileMetrics, "record", "prometheus aggregates"),
)


class _Stream:
    """Stands in for a gRPC stream: acks go nowhere."""

    def send(self, message: object) -> None:
        pass

    def abort(self, code: object, details: str) -> None:
        raise RuntimeError(details)


@contextmanager
def _timer(owner: object, name: str, stage: str, spent: Counter) -> Iterator[None]:
    original = getattr(owner, name)

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[stage] += time.perf_counter() - started

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


def run(db: str, batches: int, group: int) -> dict:
    """Feeds `batches` prebuilt batches through the pipeline, `group` per transaction."""
    feed = build(batches)
    spent: Counter = Counter()
    with fresh_database(db) as url, ExitStack() as timers:
        engine = open_engine(url)
        migrations.upgrade(engine)
        registry = CollectorRegistry(auto_describe=True)
        worker = pipeline.Pipeline(
            engine,
            DEFAULTS,
            ServerHealth(registry),
            ProfileMetrics(registry, DEFAULTS.top_k, DEFAULTS.top_functions, DEFAULTS.max_routes),
        )
        stream = _Stream()
        worker._process([pipeline.Inbound(stream, hello=hello(SERVICE))])
        for owner, name, stage in STAGES:
            timers.enter_context(_timer(owner, name, stage, spent))
        started = time.perf_counter()
        for first in range(0, batches, group):
            decoding = time.perf_counter()
            raws = feed.batches[first : first + group]
            decoded = [ingest_pb2.HostMessage.FromString(raw).batch for raw in raws]
            spent["protobuf decode"] += time.perf_counter() - decoding
            pairs = zip(decoded, raws, strict=True)
            worker._process([pipeline.Inbound(stream, batch=b, raw=r) for b, r in pairs])
        total = time.perf_counter() - started
        engine.dispose()
    events = feed.total_events
    finish = spent.pop("finish request (all)")
    spent["finish: request rows"] = (
        finish - spent["assemble call trees"] - spent["summarize: stacks, totals, tree"]
    )
    spent["other"] = total - sum(spent.values())
    figures = {
        "db": db,
        "events": events,
        "batches_per_transaction": group,
        "seconds": round(total, 2),
        "events_per_second": round(events / total),
        "stages": {
            stage: {
                "seconds": round(s, 3),
                "share": round(s / total, 3),
                "ns_per_event": round(s / events * 1e9),
            }
            for stage, s in spent.most_common()
        },
    }
    report(figures)
    print(f"saved {results.save(f'stages-{db}', figures)}")
    return figures


def report(f: dict) -> None:
    print(
        f"\n{f['events']:,} events through the pipeline in-process on {f['db']} "
        f"({f['batches_per_transaction']} batches per transaction): {f['seconds']} s, "
        f"{f['events_per_second']:,} events/s on one core (no gRPC)"
    )
    print(
        results.table(
            ("stage", "seconds", "share", "ns/event"),
            [
                (stage, s["seconds"], f"{s['share']:.1%}", f"{s['ns_per_event']:,}")
                for stage, s in f["stages"].items()
            ],
        )
    )
