"""Turns recorded requests into wire batches (runs on the transport thread only).

A request is announced (start record, lanes) with its first events; finished requests
are drained whole and closed with their end record. Requests still running are drained
too, so long requests and whole-process mode stream instead of growing in memory.
"""

from __future__ import annotations

from collections import Counter

from profiler_core.wire.builder import BatchBuilder
from profiler_host.functions import FunctionRegistry
from profiler_host.recording import Lane, Request


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
        builder = BatchBuilder()
        for request in [*running, *finished]:
            self._add_request(builder, request)
        for request in finished:
            # the route again: a framework matches its template after the start went out
            builder.end(
                request.id, request.end_ns or 0, request.status, request.truncated, request.route
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

    def _add_request(self, builder: BatchBuilder, request: Request) -> None:
        if request.id not in self.announced:
            self.announced.add(request.id)
            builder.start(request.id, request.route, request.method, request.start_ns)
        for lane in list(request.lanes):
            self._announce_lane(builder, request, lane)
            kinds, functions, calls, times = lane.drain_columns()
            if kinds:
                builder.run(request.id, lane.id, kinds, functions, calls, times)

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
