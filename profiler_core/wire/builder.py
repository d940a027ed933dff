"""Builds one Batch message from records and event runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from profiler_core.wire import framing, ingest_pb2
from profiler_core.wire.columns import EventColumns

_BATCH = ingest_pb2.HostMessage.DESCRIPTOR.fields_by_name["batch"].number
_EVENTS = ingest_pb2.Batch.DESCRIPTOR.fields_by_name["events"].number


class Columns(Protocol):
    """Where a batch's events gather until it is built (`EventColumns`, or a faster twin)."""

    def __len__(self) -> int: ...

    def write(self, events: ingest_pb2.Events) -> bytes:
        """Fills `events`; returns the fields it has serialized already (or b"")."""
        ...


class BatchBuilder:
    """The batch is built inside its HostMessage: wrapping a finished Batch would copy it."""

    def __init__(self, events: Columns | None = None) -> None:
        self._message = ingest_pb2.HostMessage()
        self._batch = self._message.batch
        self._events = events if events is not None else EventColumns()

    @property
    def empty(self) -> bool:
        """Nothing was added (a cheap check, unlike the message's ByteSize)."""
        return not len(self._events) and not self._batch.ListFields()

    @property
    def events(self) -> Columns:
        return self._events

    @property
    def event_count(self) -> int:
        return len(self._events)

    def function(
        self, fid: int, module: str, qualname: str, file: str = "", line: int = 0, kind: int = 0
    ) -> None:
        self._batch.functions.add(
            id=fid, module=module, qualname=qualname, file=file, line=line, kind=kind
        )

    def start(self, request_id: int, route: str, method: str, start_ns: int) -> None:
        self._batch.request_starts.add(
            request_id=request_id, route=route, method=method, start_ns=start_ns
        )

    def lane(
        self,
        request_id: int,
        lane_id: int,
        kind: int,
        name: str,
        parent_lane: int = 0,
        parent_call: int = 0,
        start_ns: int = 0,
    ) -> None:
        self._batch.lanes.add(
            request_id=request_id,
            lane_id=lane_id,
            kind=kind,
            name=name,
            parent_lane=parent_lane,
            parent_call=parent_call,
            start_ns=start_ns,
        )

    def run(
        self,
        request_id: int,
        lane_id: int,
        kinds: bytes | bytearray,
        functions: list[int],
        calls: list[int],
        times: list[int],
    ) -> None:
        """One lane's events as columns (into the default `EventColumns`)."""
        if not isinstance(self._events, EventColumns):
            raise TypeError("run() adds to the default EventColumns only")
        self._events.add_run(request_id, lane_id, kinds, functions, calls, times)

    def end(
        self,
        request_id: int,
        end_ns: int,
        status: int = 0,
        truncated: bool = False,
        route: str = "",
        running_lanes: Sequence[int] = (),
    ) -> None:
        self._batch.request_ends.add(
            request_id=request_id,
            end_ns=end_ns,
            status=status,
            truncated=truncated,
            route=route,
            running_lanes=running_lanes,
        )

    def drops(self, requests: dict[str, int], events: dict[str, int]) -> None:
        self._batch.drops.requests.update(requests)
        self._batch.drops.events.update(events)

    def route_counts(self, counts: ingest_pb2.RouteCounts | None) -> None:
        if counts is not None:
            self._batch.route_counts.CopyFrom(counts)

    def _fill(self, seq: int) -> bytes:
        self._batch.seq = seq
        if not len(self._events):  # an empty `events` would make an empty batch non-empty
            return b""
        return self._events.write(self._batch.events)

    def build(self, seq: int) -> ingest_pb2.Batch:
        """The batch as a message, every event in it."""
        serialized = self._fill(seq)
        if serialized:
            self._batch.events.MergeFromString(serialized)
        return self._batch

    def payload(self, seq: int) -> bytes:
        """The HostMessage as the host sends it. Serialized event fields are appended as a
        second occurrence of `batch.events`, which the parser merges into the first: never
        parsed into the message and encoded again (a third of what a recorded request
        costs the transport thread)."""
        serialized = self._fill(seq)
        data = self._message.SerializeToString()
        if serialized:
            data += framing.field(_BATCH, framing.field(_EVENTS, serialized))
        return data
