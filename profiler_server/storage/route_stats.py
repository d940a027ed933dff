"""Per service and route over a time range, from every request the hosts counted
(`route_minutes`) and the requests sampled among them (`requests`): the read side of
`GET /api/routes`. Two statements, whole minutes, as the other aggregates."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, case, func, select

from profiler_core.latency import percentile
from profiler_server.storage import schema
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
) -> tuple[list[RouteStats], int, int]:
    """The routes with the most requests first, and the range's first and last minute
    (the earliest counted one when `since_ns` is None; the current one when `until_ns` is)."""
    m = schema.route_minutes
    conditions = []
    if service:
        conditions.append(m.c.service == service)
    if route:
        conditions.append(m.c.route == route)
    with engine.connect() as conn:
        first = (
            since_ns // NS_PER_MINUTE
            if since_ns is not None
            else conn.execute(select(func.min(m.c.minute)).where(*conditions)).scalar()
        )
        last = (until_ns if until_ns is not None else time.time_ns()) // NS_PER_MINUTE
        if first is None:
            return [], last, last
        buckets = [func.sum(m.c[name]) for name in schema.ROUTE_MINUTE_BUCKETS]
        total = func.sum(m.c.requests)
        counted = conn.execute(
            select(
                m.c.service,
                m.c.route,
                total,
                func.sum(case((m.c.status_class == 5, m.c.requests), else_=0)),
                func.sum(m.c.duration_ns),
                *buckets,
            )
            .where(*conditions, m.c.minute >= first, m.c.minute <= last)
            .group_by(m.c.service, m.c.route)
            .order_by(total.desc(), m.c.service, m.c.route)
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
