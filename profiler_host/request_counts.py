"""Every HTTP request the process serves, sampled or not, counted per route, method and
status class with a duration histogram (`profiler_core.latency`'s buckets).

The app thread that ends a request adds it to the table at once; the transport thread
takes the table every few seconds and sends it. Every request of the app pays for the
add, so `profiler_host._counts` does it in C (one dict lookup and a few adds; this
module's `CountTable` is its twin and reference, compared with it in tests, and the one
used where the C module is not built). Memory is bounded: at most `MAX_ROUTES` distinct
routes and `MAX_METHODS` methods are counted per process (later ones, and longer ones,
count as `(other)`), so the table holds at most (routes + 1) x (methods + 1) x 6 entries.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any, Protocol

from profiler_core.latency import BOUNDS_NS
from profiler_core.wire import ingest_pb2
from profiler_host import native

MAX_ROUTES = 200
MAX_ROUTE_CHARS = 500  # what the server takes (longer routes count as OTHER)
MAX_METHODS = 16
MAX_METHOD_CHARS = 16
OTHER = "(other)"
LOST = "counts_full"  # the drop reason of requests that could not be counted
SUM_LIMIT = 2**63 - 1  # a duration sum stops there (C's int64)

# one row of a take: route, method, status class (0: none or out of range), count,
# duration sum, one count per bucket
Row = tuple[str, str, int, int, int, list[int]]


class Table(Protocol):
    """What the transport and the middlewares use of either twin."""

    waiting: bool  # the next add calls wake (the transport sets it before it sleeps)
    lost: int

    @property
    def pending(self) -> bool: ...
    def add(self, route: str, method: str, status: int | str, duration_ns: int, /) -> None:
        """One request ended (app threads; never raises); `status` is an int or a WSGI
        status line."""

    def take(self) -> list[Row]: ...
    def counted(
        self,
        target: Callable[..., Any],
        path: str,
        method: str,
        environ: Mapping[str, Any] | None = None,
        route_of: Callable[[Mapping[str, Any]], str | None] | None = None,
        /,
    ) -> CountedRequest: ...


class CountedRequest(Protocol):
    """A request that is not sampled, timed and counted: what a middleware hands the app in
    place of WSGI's `start_response` or ASGI's `send`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def fail(self) -> None: ...
    def end(self, route: str | None = None, /) -> None: ...
    def run(
        self,
        app: Callable[[Any, Any, Any], Awaitable[Any]],
        scope: Mapping[str, Any],
        receive: Any,
        route_of: Callable[[Mapping[str, Any]], str | None],
        /,
    ) -> Awaitable[Any]: ...


class CountTable:
    """The Python twin of `_counts.CountTable` (a lock keeps an add and a take apart)."""

    def __init__(
        self,
        bounds: Sequence[int],
        max_routes: int,
        max_route_chars: int,
        max_methods: int,
        max_method_chars: int,
        other: str,
        wake: Callable[[], None],
    ) -> None:
        self._bounds = tuple(bounds)
        self._limits = (max_routes, max_route_chars, max_methods, max_method_chars)
        self._other = other
        self._wake = wake
        self._routes: set[str] = set()
        self._methods: set[str] = set()
        self._table: dict[tuple[str, str, int], list[int]] = {}
        self._lock = threading.Lock()
        self.waiting = True
        self.lost = 0

    @property
    def pending(self) -> bool:
        return bool(self._table)

    def add(self, route: str, method: str, status: int | str, duration_ns: int, /) -> None:
        """One request ended (app threads; never raises)."""
        try:
            with self._lock:
                self._count(route, method, status, duration_ns)
        except Exception:
            self.lost += 1
        if self.waiting:
            self.waiting = False
            self._wake()

    def _count(self, route: str, method: str, status: int | str, duration_ns: int) -> None:
        if isinstance(status, str):
            status = status_of(status)
        if not (isinstance(status, int) and isinstance(duration_ns, int)):
            raise TypeError("a status is an int or a status line, a duration an int")
        status_class = status // 100 if 100 <= status < 600 else 0
        max_routes, max_route_chars, max_methods, max_method_chars = self._limits
        route = self._admitted(route, self._routes, max_routes, max_route_chars)
        method = self._admitted(method, self._methods, max_methods, max_method_chars)
        key = (route, method, status_class)
        entry = self._table.get(key)
        if entry is None:
            entry = self._table[key] = [0] * (3 + len(self._bounds))
        entry[0] += 1
        entry[1] = min(entry[1] + max(duration_ns, 0), SUM_LIMIT)
        entry[2 + bisect_left(self._bounds, duration_ns)] += 1

    def _admitted(self, name: object, seen: set[str], max_count: int, max_chars: int) -> str:
        if not isinstance(name, str):
            return self._other
        name = str.__str__(name)  # a subclass counts as its text, as a str
        if name in seen:
            return name
        if len(seen) < max_count and len(name) <= max_chars:
            seen.add(name)
            return name
        return self._other

    def counted(
        self,
        target: Callable[..., Any],
        path: str,
        method: str,
        environ: Mapping[str, Any] | None = None,
        route_of: Callable[[Mapping[str, Any]], str | None] | None = None,
        /,
    ) -> Counted:
        """A request that is not sampled, its clock started."""
        return Counted(self, target, path, method, environ, route_of)

    def take(self) -> list[Row]:
        """What was counted since the last take (transport thread)."""
        with self._lock:
            table, self._table = self._table, {}
        return [(r, m, c, e[0], e[1], e[2:]) for (r, m, c), e in table.items()]


class Counted:
    """The Python twin of `_counts.Counted`: passes every call to `target` through as
    given, keeps the response's status (and for WSGI, where `environ` is given, the route
    `route_of` reads as the response starts: Flask forgets it afterwards); `end` adds the
    request to the table once."""

    def __init__(
        self,
        table: CountTable,
        target: Callable[..., Any],
        path: str,
        method: str,
        environ: Mapping[str, Any] | None,
        route_of: Callable[[Mapping[str, Any]], str | None] | None,
    ) -> None:
        self._table = table
        self._target = target
        self._path = path
        self._method = method
        self._environ = environ
        self._route_of = route_of
        self._route: str | None = None
        self._status: object = None
        self._failed = False
        self._ended = False
        self._started = time.monotonic_ns()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._environ is not None:
            if args:
                self._status = args[0]
                if self._route_of is not None:
                    with suppress(Exception):  # the response goes on whatever happens here
                        route = self._route_of(self._environ)
                        if route is not None:
                            self._route = route
        elif self._status is None and len(args) == 1 and isinstance(args[0], dict):
            with suppress(Exception):  # until the response starts, which fixes its status
                kind = args[0].get("type")
                if kind == "http.response.start":
                    self._status = args[0].get("status", 0)
                elif kind == "websocket.accept":
                    self._status = 101
        return self._target(*args, **kwargs)

    def fail(self) -> None:
        self._failed = True

    def end(self, route: str | None = None, /) -> None:
        if self._ended:
            return
        self._ended = True
        status = self._status if self._status is not None else 500 if self._failed else 0
        duration_ns = time.monotonic_ns() - self._started
        if route is None:
            route = self._path if self._route is None else self._route
        self._table.add(route, self._method, status, duration_ns)  # type: ignore[arg-type]

    async def run(
        self,
        app: Callable[[Any, Any, Any], Awaitable[Any]],
        scope: Mapping[str, Any],
        receive: Any,
        route_of: Callable[[Mapping[str, Any]], str | None],
        /,
    ) -> Any:
        """An ASGI request as its server awaits it: `app(scope, receive, self)`, counted
        when it ends under the route `route_of` reads then (a failure, a cancellation or a
        close count as failed)."""
        try:
            return await app(scope, receive, self)
        except BaseException:
            self.fail()
            raise
        finally:
            route = None
            with suppress(Exception):  # the app's outcome stands whatever happens here
                route = route_of(scope)
            self.end(route)


def status_of(line: str) -> int:
    """A WSGI status line's code: its leading ASCII digits up to a space or the end, 1 to 9
    of them; else 0."""
    code = line.partition(" ")[0]
    return int(code) if 0 < len(code) <= 9 and code.isascii() and code.isdigit() else 0


def new_table(wake: Callable[[], None] = lambda: None) -> Table:
    """The C table when it is built, else its Python twin."""
    limits = (BOUNDS_NS, MAX_ROUTES, MAX_ROUTE_CHARS, MAX_METHODS, MAX_METHOD_CHARS, OTHER, wake)
    _counts = native.extension("_counts")
    if _counts is None:
        return CountTable(*limits)
    table: Table = _counts.CountTable(*limits)
    return table


def message(rows: list[Row]) -> ingest_pb2.RouteCounts | None:
    """A take as the wire's message (None: nothing was counted)."""
    if not rows:
        return None
    counts = ingest_pb2.RouteCounts(wall_ns=time.time_ns())
    for route, method, status_class, count, duration_ns_sum, buckets in rows:
        counts.routes.add(
            route=route,
            method=method,
            status_class=status_class,
            count=count,
            duration_ns_sum=duration_ns_sum,
            buckets=buckets,
        )
    return counts
