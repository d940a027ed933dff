"""Columnar event runs: the one place that knows how events are packed into a Batch."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass

from profiler_core.wire import ingest_pb2


@dataclass(slots=True)
class Run:
    """Consecutive events of one lane of one request, in order."""

    request_id: int
    lane_id: int
    kinds: bytes
    functions: list[int]
    calls: list[int]
    times: list[int]


class MalformedEvents(ValueError):
    """The event columns do not agree with each other; the batch cannot be used."""


class EventColumns:
    """Accumulates runs and writes them as packed, delta-encoded columns."""

    def __init__(self) -> None:
        self.run_request: list[int] = []
        self.run_lane: list[int] = []
        self.run_length: list[int] = []
        self.kinds = bytearray()
        self.functions: list[int] = []
        self.calls: list[int] = []
        self.times: list[int] = []

    def __len__(self) -> int:
        return len(self.kinds)

    def add_run(
        self,
        request_id: int,
        lane_id: int,
        kinds: bytes | bytearray,
        functions: list[int],
        calls: list[int],
        times: list[int],
    ) -> None:
        count = len(kinds)
        if not (count == len(functions) == len(calls) == len(times)):
            raise ValueError("run columns differ in length")
        if count == 0:
            return
        self.run_request.append(request_id)
        self.run_lane.append(lane_id)
        self.run_length.append(count)
        self.kinds += kinds
        self.functions += functions
        self.calls += calls
        self.times += times

    def write(self, events: ingest_pb2.Events) -> None:
        base = self.times[0] if self.times else 0
        events.base_ns = base
        events.run_request.extend(self.run_request)
        events.run_lane.extend(self.run_lane)
        events.run_length.extend(self.run_length)
        events.kind = bytes(self.kinds)
        events.function.extend(self.functions)
        events.call.extend(self.calls)
        events.time_delta.extend(map(operator.sub, self.times, [base, *self.times[:-1]]))


def read_runs(events: ingest_pb2.Events) -> Iterator[Run]:
    """Splits the columns back into runs; raises MalformedEvents if they disagree."""
    lengths = list(events.run_length)
    total = len(events.kind)
    if not (len(events.run_request) == len(events.run_lane) == len(lengths)):
        raise MalformedEvents("run columns differ in length")
    if not (sum(lengths) == total == len(events.function) == len(events.call)):
        raise MalformedEvents("event columns differ in length")
    if len(events.time_delta) != total:
        raise MalformedEvents("time column differs in length")
    if total and max(events.kind) > ingest_pb2.READY:
        raise MalformedEvents("unknown event kind")
    functions = list(events.function)
    calls = list(events.call)
    times = list(itertools.accumulate(events.time_delta, initial=events.base_ns))[1:]
    kinds = events.kind
    offset = 0
    for request_id, lane_id, length in zip(
        events.run_request, events.run_lane, lengths, strict=True
    ):
        end = offset + length
        yield Run(
            request_id,
            lane_id,
            kinds[offset:end],
            functions[offset:end],
            calls[offset:end],
            times[offset:end],
        )
        offset = end
