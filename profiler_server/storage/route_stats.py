"""Per service and route over a time range, from every request the hosts counted
(`route_minutes`) and the requests sampled among them (`requests`): the read side of
`GET /api/routes`. Two statements, whole minutes, as the other aggregates; a range's whole
days, hours and ten minutes are read from `route_rollups` (storage.route_rollup)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Select, Table, case, func, select, union_all

from profiler_core.latency import percentile
from profiler_server.storage import route_rollup, schema
from profiler_server.storage.queries import NS_PER_MINUTE


@dataclass(frozen=True)
class RouteStats:
    service: str
    route: str
    requests: int
    errors: int  # 5xx
    duration_ns: int  # summed
    buckets: list[int]  # profiler_core.latency
    sampled: int

    def percentile_ms(self, q: float) -> float | None:
        value = percentile(self.buckets, q)
        return None if value is None else value * 1e3


def route_stats(
    engine: Engine,
    service: str | None = None,
    route: str | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    limit: int = 1000,
    rollup: bool = True,
) -> tuple[list[RouteStats], int, int]:
    """The routes with the most requests first, and the range's first and last minute
    (the earliest counted one when `since_ns` is None; the current one when `until_ns` is).
    `rollup=False` reads minutes only: the reference the rolled-up answer is tested against."""
    m = schema.route_minutes
    with engine.connect() as conn:
        first = (
            since_ns // NS_PER_MINUTE
            if since_ns is not None
            else conn.execute(
                select(func.min(m.c.minute)).where(*_filters(m, service, route))
            ).scalar()
        )
        last = (until_ns if until_ns is not None else time.time_ns()) // NS_PER_MINUTE
        if first is None:
            return [], last, last
        if first > last:
            return [], first, last
        spans = route_rollup.SPANS if rollup else ()
        parts = [
            _counts(service, route, *piece) for piece in route_rollup.split(first, last + 1, spans)
        ]
        pieces = union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()
        total = func.sum(pieces.c.requests)
        counted = conn.execute(
            select(
                pieces.c.service,
                pieces.c.route,
                total,
                func.sum(pieces.c.errors),
                func.sum(pieces.c.duration_ns),
                *(func.sum(pieces.c[name]) for name in schema.ROUTE_MINUTE_BUCKETS),
            )
            .group_by(pieces.c.service, pieces.c.route)
            .order_by(total.desc(), pieces.c.service, pieces.c.route)
            .limit(limit)
        ).all()
        sampled = _sampled(conn, [(row[0], row[1]) for row in counted], first, last)
    return (
        [
            RouteStats(
                service=row[0],
                route=row[1],
                requests=int(row[2]),
                errors=int(row[3]),
                duration_ns=int(row[4]),
                buckets=[int(v) for v in row[5:]],
                sampled=sampled.get((row[0], row[1]), 0),
            )
            for row in counted
        ],
        first,
        last,
    )


def _filters(table: Table, service: str | None, route: str | None) -> list:
    conditions = []
    if service:
        conditions.append(table.c.service == service)
    if route:
        conditions.append(table.c.route == route)
    return conditions


def _counts(service: str | None, route: str | None, span: int, start: int, end: int) -> Select:
    """The count rows of the minutes start..end-1, from `route_minutes` (span MINUTE) or
    that span's `route_rollups` rows (summed once, over every piece, by the caller)."""
    if span == route_rollup.MINUTE:
        table, conditions = schema.route_minutes, []
    else:
        table = schema.route_rollups
        conditions = [table.c.span == span]
    return select(
        table.c.service,
        table.c.route,
        table.c.requests,
        case((table.c.status_class == 5, table.c.requests), else_=0).label("errors"),
        table.c.duration_ns,
        *(table.c[name] for name in schema.ROUTE_MINUTE_BUCKETS),
    ).where(
        *conditions,
        *_filters(table, service, route),
        table.c.minute >= start,
        table.c.minute < end,
    )


def _sampled(
    conn: Connection, keys: list[tuple[str, str]], first: int, last: int
) -> dict[tuple[str, str], int]:
    """Stored requests per (service, route) of `keys` in the minutes first..last."""
    if not keys:
        return {}
    r = schema.requests
    services = sorted({service for service, _ in keys})
    query = (
        select(r.c.service, r.c.route, func.count())
        .where(
            r.c.service.in_(services),
            r.c.start_ns >= first * NS_PER_MINUTE,
            r.c.start_ns < (last + 1) * NS_PER_MINUTE,
        )
        .group_by(r.c.service, r.c.route)
    )
    wanted = set(keys)
    return {(s, rt): int(n) for s, rt, n in conn.execute(query) if (s, rt) in wanted}
