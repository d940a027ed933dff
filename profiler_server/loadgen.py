"""Synthetic host traffic: drives a server without an instrumented app (benchmarks, tests).
It speaks the real wire protocol over a real gRPC channel."""

from __future__ import annotations

import os
import queue
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from profiler_core import __version__
from profiler_core.model import EventKind
from profiler_core.wire import ingest_pb2
from profiler_core.wire.builder import BatchBuilder

ENTER = int(EventKind.ENTER)
EXIT = int(EventKind.EXIT)
METHOD = "/request_profiler.v1.Ingest/Stream"


@dataclass
class CallShape:
    """A request's call tree: `calls` nested calls up to `depth`, over `functions` functions."""

    calls: int = 200
    depth: int = 10
    functions: int = 40
    step_ns: int = 1_000


def synthetic_run(
    shape: CallShape, first_fid: int, start_ns: int, variant: int = 0
) -> tuple[bytearray, list[int], list[int], list[int], int]:
    """Events (kinds, functions, calls, times) and the end time of one synthetic request.

    Time steps vary (deterministically per variant) between half and three times step_ns.
    """
    jitter = random.Random(variant)
    steps = [shape.step_ns * jitter.randint(1, 6) // 2 for _ in range(64)]
    kinds = bytearray()
    functions: list[int] = []
    calls: list[int] = []
    times: list[int] = []
    stack: list[tuple[int, int]] = []
    t = start_ns
    for call in range(1, shape.calls + 1):
        target = 1 + (call * 7 + variant) % shape.depth
        while len(stack) >= target:
            fid, cid = stack.pop()
            t += steps[call % 64]
            kinds.append(EXIT)
            functions.append(fid)
            calls.append(cid)
            times.append(t)
        fid = first_fid + (len(stack) * 3 + call % 3) % shape.functions
        t += steps[(call * 5) % 64]
        kinds.append(ENTER)
        functions.append(fid)
        calls.append(call)
        times.append(t)
        stack.append((fid, call))
    while stack:
        fid, cid = stack.pop()
        t += shape.step_ns
        kinds.append(EXIT)
        functions.append(fid)
        calls.append(cid)
        times.append(t)
    return kinds, functions, calls, times, t + shape.step_ns


def wide_run(
    tops: int, width: int, first_fid: int, start_ns: int, step_ns: int = 1_000
) -> tuple[bytearray, list[int], list[int], list[int], int]:
    """Events of a request of tops x (1 + width) calls where every call has a call path of
    its own: function first_fid + t calls functions first_fid + tops + 0..width-1 (a big
    request's summary at its largest). Returns what synthetic_run does."""
    kinds = bytearray()
    functions: list[int] = []
    calls: list[int] = []
    times: list[int] = []
    t = start_ns
    call = 0
    for top in range(tops):
        call += 1
        outer = call
        kinds.append(ENTER)
        functions.append(first_fid + top)
        calls.append(outer)
        times.append(t)
        for child in range(width):
            call += 1
            fid = first_fid + tops + child
            kinds += bytes((ENTER, EXIT))
            functions += (fid, fid)
            calls += (call, call)
            times += (t + step_ns, t + 2 * step_ns)
            t += 2 * step_ns
        t += step_ns
        kinds.append(EXIT)
        functions.append(first_fid + top)
        calls.append(outer)
        times.append(t)
    return kinds, functions, calls, times, t + step_ns


def hello(service: str, session_id: uuid.UUID | None = None) -> ingest_pb2.Hello:
    return ingest_pb2.Hello(
        session_id=(session_id or uuid.uuid4()).bytes,
        service=service,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        python_version=sys.version.split()[0],
        wall_ns=time.time_ns(),
        monotonic_ns=time.monotonic_ns(),
        profiler_version=__version__,
    )


def _serialize(message: ingest_pb2.HostMessage | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


@dataclass
class HostStream:
    """One session's stream: send messages (or raw bytes), collect acks and the final status."""

    target: str
    max_message_bytes: int = 64 * 1024 * 1024
    stored: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)
    error: grpc.RpcError | None = None

    def __post_init__(self) -> None:
        self._channel = grpc.insecure_channel(
            self.target, options=[("grpc.max_send_message_length", self.max_message_bytes)]
        )
        self._outbox: queue.Queue[ingest_pb2.HostMessage | bytes | None] = queue.Queue()
        self._acked = threading.Condition()
        self.done = threading.Event()
        call = self._channel.stream_stream(
            METHOD,
            request_serializer=_serialize,
            response_deserializer=ingest_pb2.ServerMessage.FromString,
        )
        self._responses = call(self._messages())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _messages(self) -> Iterator[ingest_pb2.HostMessage | bytes]:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            yield message

    def _read(self) -> None:
        try:
            for response in self._responses:
                with self._acked:
                    self.stored.update(response.ack.stored)
                    self.rejected.update(response.ack.rejected)
                    self._acked.notify_all()
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()
            with self._acked:
                self._acked.notify_all()

    def send_hello(self, message: ingest_pb2.Hello) -> None:
        self._outbox.put(ingest_pb2.HostMessage(hello=message))

    def send_batch(self, batch: ingest_pb2.Batch) -> None:
        self._outbox.put(ingest_pb2.HostMessage(batch=batch))

    def send_raw(self, data: bytes) -> None:
        self._outbox.put(data)

    def wait_acked(self, seqs: set[int], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._acked:
            while not seqs <= (self.stored | self.rejected):
                left = deadline - time.monotonic()
                if left <= 0 or self.done.is_set():
                    return seqs <= (self.stored | self.rejected)
                self._acked.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Half-closes the stream and waits for the server to end it."""
        self._outbox.put(None)
        self.done.wait(timeout)
        self._channel.close()

    def kill(self) -> None:
        """Drops the connection without a clean end (a host that died)."""
        self._channel.close()
        self.done.wait(5)


def synthetic_batch(
    builder: BatchBuilder,
    shape: CallShape,
    request_ids: range,
    route: str = "/items/{id}",
    method: str = "GET",
    define_functions: bool = True,
) -> None:
    """Adds whole requests (start, events, end) to a batch."""
    if define_functions:
        for fid in range(1, shape.functions + 1):
            builder.function(fid, f"app.module{fid % 5}", f"func_{fid}", "app.py", fid)
    t = time.monotonic_ns()
    for rid in request_ids:
        kinds, functions, calls, times, end = synthetic_run(shape, 1, t, rid)
        builder.start(rid, route, method, t)
        builder.run(rid, 0, kinds, functions, calls, times)
        builder.end(rid, end, 200)
        t = end
