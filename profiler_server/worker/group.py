"""What one storage transaction holds: the messages grouped from the queue, the rows they
make, and the acks sent once it commits."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import grpc

from profiler_core.wire import ingest_pb2
from profiler_server.ingest.route_counts import RouteMinutes
from profiler_server.storage.writer import WriteSet

if TYPE_CHECKING:
    from profiler_server.assembly.session import Session


class Stream(Protocol):
    """The worker's view of one gRPC stream; both methods are thread-safe."""

    def send(self, message: ingest_pb2.ServerMessage | None) -> None: ...
    def abort(self, code: grpc.StatusCode, details: str) -> None: ...


@dataclass
class Inbound:
    stream: Stream
    hello: ingest_pb2.Hello | None = None
    batch: ingest_pb2.Batch | None = None
    raw: bytes = b""
    closed: bool = False
    received: float = field(default_factory=time.monotonic)


def events(item: Inbound) -> int:
    return len(item.batch.events.kind) if item.batch is not None else 0


@dataclass
class Group:
    ws: WriteSet = field(default_factory=WriteSet)
    acks: dict[int, tuple[Stream, ingest_pb2.Ack]] = field(default_factory=dict)
    received: list[float] = field(default_factory=list)
    batches: list[tuple[Session, int, bytes]] = field(default_factory=list)
    sessions: dict[str, Session] = field(default_factory=dict)
    drops: list[tuple[str, dict[str, int], dict[str, int]]] = field(default_factory=list)
    closes: list[Stream] = field(default_factory=list)
    route_minutes: RouteMinutes = field(default_factory=RouteMinutes)
    batches_received: int = 0
    events_received: int = 0

    def ack(self, stream: Stream) -> ingest_pb2.Ack:
        entry = self.acks.get(id(stream))
        if entry is None:
            entry = self.acks[id(stream)] = (stream, ingest_pb2.Ack())
        return entry[1]
