"""Columnar event runs: how the host packs events into a Batch (the server reads them with
`profiler_server.assembly.events`, into NumPy arrays)."""

from __future__ import annotations

import operator

from profiler_core.wire import ingest_pb2


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

    def write(self, events: ingest_pb2.Events) -> bytes:
        base = self.times[0] if self.times else 0
        events.base_ns = base
        events.run_request.extend(self.run_request)
        events.run_lane.extend(self.run_lane)
        events.run_length.extend(self.run_length)
        events.kind = bytes(self.kinds)
        events.function.extend(self.functions)
        events.call.extend(self.calls)
        events.time_delta.extend(map(operator.sub, self.times, [base, *self.times[:-1]]))
        return b""
