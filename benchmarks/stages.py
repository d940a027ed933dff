"""Where the ingest time goes per event, without cProfile's distortion (it slows Python-heavy
code ~2.5x, unevenly): the server's own ingest pipeline run in this process on the same
batches (no gRPC), with a wall-clock timer around each stage."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from prometheus_client import CollectorRegistry

from benchmarks import callgrind, results
from benchmarks.fleet import build_feed
from benchmarks.ingest import build
from benchmarks.load import SERVICE
from benchmarks.server import fresh_database
from profiler_core.wire import ingest_pb2
from profiler_server import pipeline
from profiler_server.app import tune_interpreter
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


def _ingest_feed(batches: int) -> tuple[int, list[tuple[int, bytes]]]:
    """One session's big batches: (sessions, (session index, serialized batch) pairs)."""
    feed = build(batches)
    return 1, [(0, raw) for raw in feed.batches]


def _fleet_feed(sessions: int, batches: int) -> tuple[int, list[tuple[int, bytes]]]:
    """The fleet's shape (benchmarks/fleet.py): `sessions` sessions sending `batches`
    small batches each, interleaved as a fleet's arrive."""
    feed = build_feed(batches)
    return sessions, [(session, raw) for raw in feed for session in range(sessions)]


def _feed(db: str, batches: int, group: int, shape: str, sessions: int) -> tuple:
    """Feeds the shape's batches through the pipeline: (batches, events, seconds, CPU
    seconds, seconds by stage)."""
    if shape == "fleet":
        sessions, pairs = _fleet_feed(sessions, batches)
    else:
        sessions, pairs = _ingest_feed(batches)
    groups = [pairs[first : first + group] for first in range(0, len(pairs), group)]
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
        tune_interpreter()  # as the server does once started
        streams = [_Stream() for _ in range(sessions)]
        worker._process([pipeline.Inbound(stream, hello=hello(SERVICE)) for stream in streams])
        for owner, name, stage in STAGES:
            timers.enter_context(_timer(owner, name, stage, spent))
        events = 0
        callgrind.end_phase()  # under callgrind, what follows is what it counts
        started, cpu_started = time.perf_counter(), time.process_time()
        for taken in groups:
            decoding = time.perf_counter()
            decoded = [(i, raw, ingest_pb2.HostMessage.FromString(raw).batch) for i, raw in taken]
            spent["protobuf decode"] += time.perf_counter() - decoding
            events += sum(len(batch.events.kind) for _, _, batch in decoded)
            worker._process(
                [pipeline.Inbound(streams[i], batch=b, raw=raw) for i, raw, b in decoded]
            )
        total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        callgrind.end_phase()
        engine.dispose()
    return len(pairs), events, total, cpu, spent


def instructions_per_batch(db: str, batches: int, group: int, shape: str, sessions: int) -> float:
    """The pipeline's instructions per batch, callgrind's count of a process feeding
    `batches` (per session: `sessions` is 1 for the ingest shape), the feeding alone:
    PostgreSQL's own work is not counted, the driver's is."""
    code = f"from benchmarks import stages; stages._feed({db!r}, {batches}, {group}, "
    feeding = [sys.executable, "-c", code + f"{shape!r}, {sessions})"]
    return callgrind.phases(feeding, 2)[1] / (batches * sessions)


def run(
    db: str,
    batches: int,
    group: int,
    shape: str = "ingest",
    sessions: int = 1,
    instructions: bool = False,
) -> dict:
    """Feeds prebuilt batches through the pipeline, `group` per transaction: the `ingest`
    shape is one session's big batches (`batches` of 20k events), the `fleet` shape is
    `sessions` sessions' small ones (`batches` each, of one 20-event request). With
    `instructions`, also counts them per batch under callgrind (slow: ~50x)."""
    sessions = sessions if shape == "fleet" else 1
    count, events, total, cpu, spent = _feed(db, batches, group, shape, sessions)
    finish = spent.pop("finish request (all)")
    spent["finish: request rows"] = (
        finish - spent["assemble call trees"] - spent["summarize: stacks, totals, tree"]
    )
    spent["other"] = total - sum(spent.values())
    figures = {
        "db": db,
        "shape": shape,
        "sessions": sessions,
        "batches": count,
        "events": events,
        "batches_per_transaction": group,
        "seconds": round(total, 2),
        "events_per_second": round(events / total),
        "batches_per_second": round(count / total),
        "cpu_ms_per_batch": round(cpu / count * 1e3, 4),
        "instructions_per_batch": (
            round(instructions_per_batch(db, batches, group, shape, sessions))
            if instructions
            else None
        ),
        "stages": {
            stage: {
                "seconds": round(s, 3),
                "share": round(s / total, 3),
                "ns_per_event": round(s / events * 1e9),
                "us_per_batch": round(s / count * 1e6, 1),
            }
            for stage, s in spent.most_common()
        },
    }
    report(figures)
    name = f"stages-{db}" if shape == "ingest" else f"stages-{shape}-{db}"
    print(f"saved {results.save(name, figures)}")
    return figures


def report(f: dict) -> None:
    print(
        f"\n{f['batches']:,} batches from {f['sessions']:,} sessions, {f['events']:,} events, "
        f"through the pipeline in-process on {f['db']} ({f['batches_per_transaction']} "
        f"batches per transaction): {f['seconds']} s, {f['events_per_second']:,} events/s, "
        f"{f['batches_per_second']:,} batches/s, {f['cpu_ms_per_batch']} ms CPU per batch "
        "(one thread, no gRPC)"
    )
    if f.get("instructions_per_batch") is not None:
        print(f"callgrind: {f['instructions_per_batch']:,} instructions per batch")
    print(
        results.table(
            ("stage", "seconds", "share", "ns/event", "us/batch"),
            [
                (
                    stage,
                    s["seconds"],
                    f"{s['share']:.1%}",
                    f"{s['ns_per_event']:,}",
                    s["us_per_batch"],
                )
                for stage, s in f["stages"].items()
            ],
        )
    )
