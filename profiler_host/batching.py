"""Turns recorded requests into wire batches (runs on the transport thread only).

A request is announced (start record, lanes) with its first events; finished requests
are drained whole and closed with their end record. Requests still running are drained
too, so long requests and whole-process mode stream instead of growing in memory.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, cast

from profiler_core.wire import framing, ingest_pb2
from profiler_core.wire.builder import BatchBuilder
from profiler_core.wire.columns import EventColumns
from profiler_host import recording
from profiler_host.events import EVENT_INTS
from profiler_host.functions import FunctionRegistry
from profiler_host.recording import Lane, Request

if TYPE_CHECKING:
    from profiler_host._hotpath import EventBuffer


class PyLaneColumns(EventColumns):
    """Lane buffers as the wire's columns, in Python (the reference for `PackedColumns`)."""

    def add_buffer(
        self, request_id: int, lane_id: int, buffer: recording.Buffer, start: int, stop: int
    ) -> None:
        self.add_run(request_id, lane_id, *recording.columns(buffer, start, stop))


_EVENTS = ingest_pb2.Events.DESCRIPTOR.fields_by_name
_PACKED_FIELDS = tuple(_EVENTS[name].number for name in ("function", "call", "time_delta"))


class PackedColumns:
    """Lane buffers as the wire's columns, in C: `_hotpath.pack` appends the packed-varint
    payloads of `Events.function`, `.call` and `.time_delta` straight from the buffers, and
    they go out as serialized fields (`BatchBuilder.payload`). No int object is made per
    value, as filling the repeated fields from lists would."""

    def __init__(self) -> None:
        from profiler_host import _hotpath

        self._pack = _hotpath.pack
        self.run_request: list[int] = []
        self.run_lane: list[int] = []
        self.run_length: list[int] = []
        self.kinds = bytearray()
        self.payloads = (bytearray(), bytearray(), bytearray())  # as `_PACKED_FIELDS`
        self.base: int | None = None
        self.last: int | None = None

    def __len__(self) -> int:
        return len(self.kinds)

    def add_buffer(
        self, request_id: int, lane_id: int, buffer: recording.Buffer, start: int, stop: int
    ) -> None:
        count = (stop - start) // EVENT_INTS
        if count <= 0:
            return
        events = cast("EventBuffer", buffer)  # the C cores' lanes' (see _LaneColumns)
        first, self.last = self._pack(events, start, stop, self.last, self.kinds, *self.payloads)
        if self.base is None:
            self.base = first
        self.run_request.append(request_id)
        self.run_lane.append(lane_id)
        self.run_length.append(count)

    def write(self, events: ingest_pb2.Events) -> bytes:
        events.base_ns = self.base or 0
        events.run_request.extend(self.run_request)
        events.run_lane.extend(self.run_lane)
        events.run_length.extend(self.run_length)
        events.kind = bytes(self.kinds)
        return b"".join(
            framing.field(number, payload)
            for number, payload in zip(_PACKED_FIELDS, self.payloads, strict=True)
        )


_LaneColumns = PackedColumns if recording.IMPLEMENTATION == "c" else PyLaneColumns


class Batcher:
    def __init__(self, registry: FunctionRegistry) -> None:
        self.registry = registry
        self.function_cursor = 0  # definitions this session has already put in a batch
        self.announced: set[int] = set()  # request ids with a start record sent
        self._lanes_sent: set[tuple[int, int]] = set()

    def build(
        self,
        running: list[Request],
        finished: list[Request],
        drops: tuple[Counter, Counter] | None,
    ) -> BatchBuilder:
        """What the requests recorded since the last batch, their ends, new definitions."""
        columns = _LaneColumns()
        builder = BatchBuilder(columns)
        for request in [*running, *finished]:
            self._add_request(builder, columns, request)
        for request in finished:
            # the route again: a framework matches its template after the start went out
            builder.end(
                request.id,
                request.end_ns or 0,
                request.status,
                request.truncated,
                request.route,
                request.running_lanes,
            )
            self.announced.discard(request.id)
            self._lanes_sent = {key for key in self._lanes_sent if key[0] != request.id}
        # definitions last: every function an event above refers to is registered by now
        for fdef in self.registry.since(self.function_cursor):
            builder.function(fdef.id, fdef.module, fdef.qualname, fdef.file, fdef.line, fdef.kind)
            self.function_cursor = fdef.id
        if drops is not None:
            builder.drops(dict(drops[0]), dict(drops[1]))
        return builder

    def _add_request(
        self, builder: BatchBuilder, columns: recording.LaneColumns, request: Request
    ) -> None:
        if request.id not in self.announced:
            self.announced.add(request.id)
            builder.start(request.id, request.route, request.method, request.start_ns)
        for lane in list(request.lanes):
            self._announce_lane(builder, request, lane)
            lane.drain_into(columns)

    def _announce_lane(self, builder: BatchBuilder, request: Request, lane: Lane) -> None:
        key = (request.id, lane.id)
        if lane.id == 0 or key in self._lanes_sent:
            return
        self._lanes_sent.add(key)
        builder.lane(
            request.id,
            lane.id,
            int(lane.kind),
            lane.name,
            lane.parent.id if lane.parent else 0,
            lane.parent_call,
            lane.start_ns,
        )
