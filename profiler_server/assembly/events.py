"""A batch's event columns read into NumPy arrays, split into runs (one lane of one request).

The host packs events with `profiler_core.wire.columns.EventColumns`; this is the server's
reader. Columns become arrays without a per-event Python step. Each run of several in a
batch gets its own copy, not a view: a run of a request still open outlives its batch and
must not keep it all alive (a batch of one run is that run's arrays).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from profiler_core.model import EventKind
from profiler_core.wire import ingest_pb2

MAX_NS = 2**62  # monotonic ns are non-negative; below this, differences and wall times fit
KINDS = bytes(sorted(EventKind))  # the kind bytes that mean something: deleted, none is left


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


def _column(values: Sequence[int], dtype: type) -> np.ndarray:
    # fromiter with a count: half the fixed cost of np.array on a protobuf repeated field
    return np.fromiter(values, dtype=dtype, count=len(values))


def _times(events: ingest_pb2.Events) -> np.ndarray:
    """Undoes the delta encoding; raises MalformedEvents for times outside [0, MAX_NS).

    Every time is checked, so a sum that wraps is seen: from a time in range, one int64
    step lands in range, at MAX_NS or above, or (wrapped) below zero."""
    deltas = _column(events.time_delta, np.int64)
    if not len(deltas):
        return deltas
    first = events.base_ns + int(deltas[0])
    if not 0 <= first < MAX_NS:
        raise MalformedEvents("timestamps out of range")
    deltas[0] = first
    times = np.add.accumulate(deltas, out=deltas)  # cumsum without its Python wrapper
    # one ufunc reduction (no Python wrapper around a call on a few values): read as uint64,
    # a negative time is 2**63 or more, so above MAX_NS too
    if np.maximum.reduce(times.view(np.uint64)) >= MAX_NS:
        raise MalformedEvents("timestamps out of range")
    return times


def read_runs(events: ingest_pb2.Events) -> list[Run]:
    """Splits the columns into runs; raises MalformedEvents if they disagree.

    Its fixed cost matters as much as its cost per event: a fleet's batches hold a few
    dozen events each, so it makes a handful of NumPy calls per batch, and none per run
    when one run is the whole batch."""
    lengths = events.run_length
    kind = events.kind
    total = len(kind)
    if not (len(events.run_request) == len(events.run_lane) == len(lengths)):
        raise MalformedEvents("run columns differ in length")
    if not (sum(lengths) == total == len(events.function) == len(events.call)):
        raise MalformedEvents("event columns differ in length")
    if len(events.time_delta) != total:
        raise MalformedEvents("time column differs in length")
    if kind.translate(None, KINDS):
        raise MalformedEvents("unknown event kind")
    kinds = np.frombuffer(kind, dtype=np.uint8)
    functions = _column(events.function, np.int64)
    calls = _column(events.call, np.uint64)
    times = _times(events)
    if len(lengths) == 1:  # the arrays hold this run alone: no copies
        return [Run(events.run_request[0], events.run_lane[0], kinds, functions, calls, times)]
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
