"""Small helpers shared by tests: polling with a deadline, counting what the API shows."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TypeVar

import grpc
import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from profiler_core.wire import ingest_pb2
from profiler_server.metrics.health import ServerHealth
from profiler_server.metrics.profiles import ProfileMetrics
from profiler_server.pipeline import Pipeline
from profiler_server.settings import DEFAULTS
from profiler_server.storage import migrations
from profiler_server.storage.engine import open_engine

T = TypeVar("T")


def eventually(probe: Callable[[], T], timeout: float = 15.0, interval: float = 0.05) -> T:
    """Polls until probe() is truthy (bounded); returns its last value."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = probe()
    return value


def stored_requests(http: str, **params: str) -> list[dict]:
    params.setdefault("limit", "1000")
    return httpx.get(http + "/api/requests", params=params, timeout=30).json()["requests"]


def metric_value(http: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
    text = httpx.get(http + "/metrics", timeout=30).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def count_nodes(node: dict) -> int:
    return 1 + sum(count_nodes(child) for child in node["children"])


def nodes(node: dict) -> list[dict]:
    """Every node of a call tree (API shape), depth first."""
    found = [node]
    for child in node["children"]:
        found += nodes(child)
    return found


class FakeStream:
    """A stream as the ingest worker sees it, recording what it is sent (for tests of the
    worker alone; the gRPC side is tested with real streams)."""

    def __init__(self) -> None:
        self.acks: list[ingest_pb2.Ack] = []
        self.aborted: list[tuple[grpc.StatusCode, str]] = []
        self.ended = False

    def send(self, message: ingest_pb2.ServerMessage | None) -> None:
        if message is None:
            self.ended = True
        else:
            self.acks.append(message.ack)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append((code, details))

    def seqs(self, kind: str) -> set[int]:
        """The seqs acked as `stored` or `rejected`."""
        return {seq for ack in self.acks for seq in getattr(ack, kind)}


@contextmanager
def worker(db: str, **overrides) -> Iterator[Pipeline]:
    """An ingest worker on a real database, not started: tests drive it group by group."""
    engine = open_engine(db)
    migrations.upgrade(engine)
    registry = CollectorRegistry()
    settings = replace(DEFAULTS, db=db, **overrides)
    try:
        yield Pipeline(
            engine, settings, ServerHealth(registry), ProfileMetrics(registry, 10, 10, 10)
        )
    finally:
        engine.dispose()


def sessions(requests: list[dict]) -> set[str]:
    """Request ids are `<session>-<n>`: one session per profiled process."""
    return {r["id"].rsplit("-", 1)[0] for r in requests}
