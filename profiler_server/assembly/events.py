"""A batch's event columns read into NumPy arrays, split into runs (one lane of one request).

The host packs events with `profiler_core.wire.columns.EventColumns`; this is the server's
reader. Columns become arrays without a per-event Python step. Each run gets its own copy,
not a view: a run of a request still open outlives its batch and must not keep it all alive.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profiler_core.model import EventKind
from profiler_core.wire import ingest_pb2

MAX_NS = 2**62  # monotonic ns are non-negative; below this, differences and wall times fit
MAX_KIND = max(EventKind)  # once: iterating the enum per batch costs more than reading it


class MalformedEvents(ValueError):
    """The event columns do not agree with each other; the batch cannot be used."""


@dataclass(slots=True)
class Run:
    """Consecutive events of one lane of one request, in order."""

    request_id: int
    lane_id: int
    kinds: np.ndarray  # uint8 EventKind
    functions: np.ndarray  # session function ids
    calls: np.ndarray  # request-wide call ids
    times: np.ndarray  # int64 monotonic ns


def _times(events: ingest_pb2.Events) -> np.ndarray:
    """Undoes the delta encoding; raises MalformedEvents for times outside [0, MAX_NS).

    Each step is checked before the sum could wrap: consecutive times in range differ by
    less than MAX_NS, and a running sum of such steps leaves the range before it can wrap."""
    deltas = np.array(events.time_delta, dtype=np.int64)
    if not len(deltas):
        return deltas
    first = events.base_ns + int(deltas[0])
    if not 0 <= first < MAX_NS or (len(deltas) > 1 and np.abs(deltas[1:]).max() >= MAX_NS):
        raise MalformedEvents("timestamps out of range")
    deltas[0] = first
    times = np.cumsum(deltas)
    if times.min() < 0 or times.max() >= MAX_NS:
        raise MalformedEvents("timestamps out of range")
    return times


def read_runs(events: ingest_pb2.Events) -> list[Run]:
    """Splits the columns into runs; raises MalformedEvents if they disagree."""
    lengths = list(events.run_length)
    total = len(events.kind)
    if not (len(events.run_request) == len(events.run_lane) == len(lengths)):
        raise MalformedEvents("run columns differ in length")
    if not (sum(lengths) == total == len(events.function) == len(events.call)):
        raise MalformedEvents("event columns differ in length")
    if len(events.time_delta) != total:
        raise MalformedEvents("time column differs in length")
    kinds = np.frombuffer(events.kind, dtype=np.uint8)
    if total and kinds.max() > MAX_KIND:
        raise MalformedEvents("unknown event kind")
    functions = np.array(events.function, dtype=np.int64)
    calls = np.array(events.call, dtype=np.uint64)
    times = _times(events)
    runs = []
    offset = 0
    for request_id, lane_id, length in zip(
        events.run_request, events.run_lane, lengths, strict=True
    ):
        end = offset + length
        runs.append(
            Run(
                request_id,
                lane_id,
                kinds[offset:end].copy(),
                functions[offset:end].copy(),
                calls[offset:end].copy(),
                times[offset:end].copy(),
            )
        )
        offset = end
    return runs
