"""Every request the hosts served, as they report it (`Batch.route_counts`): checked, then
summed per (minute, service, route, method, status class) for one storage transaction.

A host's counts arrive with a batch, so they are stored exactly once with its seq (a resent
batch is acked as a duplicate and not counted again). The minute is the host's clock, as
for the requests it samples; a clock more than a day behind or an hour ahead is taken as
the server's."""

from __future__ import annotations

import time
from collections import Counter

from profiler_core.latency import BUCKETS
from profiler_core.wire import ingest_pb2
from profiler_server.assembly import problems as P
from profiler_server.assembly.text import storable

MINUTE_NS = 60_000_000_000
MAX_ENTRIES = 5_000  # per batch: a host sends at most its 200 routes x methods x classes
MAX_COUNT = 10**6  # requests per entry per report
MAX_DURATION_SUM = 2**50  # ns per entry per report (13 days): a minute's sums stay in BIGINT
BEHIND_NS, AHEAD_NS = 24 * 60 * MINUTE_NS, 60 * MINUTE_NS
MAX_ROUTE, MAX_METHOD, MAX_SERVICE = 500, 16, 200  # the columns' sizes
_KEY = tuple[int, str, str, str, int]


class RouteMinutes:
    """What one storage group adds to `route_minutes`: one row per key, the sums of every
    report in the group (an upsert may not touch one row twice)."""

    def __init__(self) -> None:
        self._rows: dict[_KEY, list[int]] = {}

    def add(self, service: str, counts: ingest_pb2.RouteCounts, problems: Counter) -> None:
        """Adds a report's valid entries; each invalid one is dropped and counted as
        BAD_ROUTE_COUNT. Routes and methods are made storable as every name a host sends
        is (NUL and lone surrogates replaced, long ones cut)."""
        minute = self._minute(counts.wall_ns)
        for index, entry in enumerate(counts.routes):
            if index >= MAX_ENTRIES or not _valid(service, entry):
                problems[P.BAD_ROUTE_COUNT] += 1
                continue
            route = storable(entry.route, MAX_ROUTE, problems)
            method = storable(entry.method, MAX_METHOD, problems)
            key = (minute, service, route, method, entry.status_class)
            values = [entry.count, entry.duration_ns_sum, *entry.buckets]
            row = self._rows.get(key)
            if row is None:
                self._rows[key] = values
            else:
                row[:] = [a + b for a, b in zip(row, values, strict=True)]

    @staticmethod
    def _minute(wall_ns: int) -> int:
        now = time.time_ns()
        if not now - BEHIND_NS < wall_ns < now + AHEAD_NS:
            wall_ns = now
        return wall_ns // MINUTE_NS

    def rows(self) -> list[tuple]:
        """In `route_minutes`' column order, sorted (servers sharing a PostgreSQL lock the
        rows in one order)."""
        return [(*key, *values) for key, values in sorted(self._rows.items())]


def _valid(service: str, entry: ingest_pb2.RouteCount) -> bool:
    return (
        len(service) <= MAX_SERVICE
        and len(entry.route) > 0
        and entry.status_class <= 5
        and 0 < entry.count <= MAX_COUNT
        and entry.duration_ns_sum <= MAX_DURATION_SUM
        and len(entry.buckets) == BUCKETS
        and sum(entry.buckets) == entry.count
    )
