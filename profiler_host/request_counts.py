"""Every HTTP request the process serves, sampled or not, counted per route, method and
status class with a duration histogram (`profiler_core.latency`'s buckets).

An app thread only appends the request's (route, method, status, duration) to a deque
(atomic, no lock); the transport thread gathers them into the table every flush interval
and sends the table every few seconds. Memory is bounded: at most `MAX_WAITING` requests
wait to be gathered (past that they are lost and counted), and at most `MAX_ROUTES`
distinct routes are counted per process (later ones count as `(other)`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from profiler_core.latency import BUCKETS, bucket
from profiler_core.wire import ingest_pb2

MAX_ROUTES = 200
MAX_ROUTE_CHARS = 500  # what the server takes (longer routes count as OTHER)
MAX_METHOD_CHARS = 16
MAX_WAITING = 50_000
OTHER = "(other)"
LOST = "counts_full"  # the drop reason of requests not counted
_COUNT, _SUM = 0, 1  # an entry: [count, duration sum, one count per bucket...]


class RequestCounts:
    def __init__(self, wake: Callable[[], None] = lambda: None) -> None:
        self._wake = wake
        self.waiting = True  # the transport sleeps until a request is counted
        self._ended: deque[tuple[str, str, int, int]] = deque()
        self.lost = 0  # requests not counted because MAX_WAITING were waiting
        # the transport thread's alone:
        self._table: dict[tuple[str, str, int], list[int]] = {}
        self._routes: set[str] = set()

    def add(self, route: str, method: str, status: int, duration_ns: int) -> None:
        """One request ended (app threads: a deque append, never raises)."""
        ended = self._ended
        if len(ended) >= MAX_WAITING:
            self.lost += 1
            return
        ended.append((route, method, status, duration_ns))
        if self.waiting:  # after the append: the transport looks before it sleeps
            self.waiting = False
            self._wake()

    @property
    def ungathered(self) -> bool:
        return bool(self._ended)

    @property
    def pending(self) -> bool:
        return bool(self._ended or self._table)

    def gather(self) -> None:
        """Adds the ended requests to the table (transport thread)."""
        ended, table = self._ended, self._table
        while ended:
            route, method, status, duration_ns = ended.popleft()
            if route not in self._routes:
                route = self._admit(route)
            if len(method) > MAX_METHOD_CHARS:
                method = OTHER
            key = (route, method, status // 100 if 100 <= status < 600 else 0)
            entry = table.get(key)
            if entry is None:
                entry = table[key] = [0] * (2 + BUCKETS)
            entry[_COUNT] += 1
            entry[_SUM] += max(duration_ns, 0)
            entry[2 + bucket(duration_ns)] += 1

    def _admit(self, route: str) -> str:
        if len(self._routes) < MAX_ROUTES and len(route) <= MAX_ROUTE_CHARS:
            self._routes.add(route)
            return route
        return OTHER

    def take(self) -> ingest_pb2.RouteCounts | None:
        """What was counted since the last take, as the wire's message (None: nothing;
        transport thread)."""
        self.gather()
        table, self._table = self._table, {}
        if not table:
            return None
        message = ingest_pb2.RouteCounts(wall_ns=time.time_ns())
        for (route, method, status_class), entry in table.items():
            message.routes.add(
                route=route,
                method=method,
                status_class=status_class,
                count=entry[_COUNT],
                duration_ns_sum=entry[_SUM],
                buckets=entry[2:],
            )
        return message
