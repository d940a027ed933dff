"""Read side: the queries behind the HTTP API. Each answers in one or two SQL statements."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, Engine, Table, func, select

from profiler_core.wire import tree_pb2
from profiler_server.assembly.flatten import stable_id
from profiler_server.storage import schema

NS_PER_MINUTE = 60_000_000_000


@dataclass(frozen=True)
class RequestFilter:
    service: str | None = None
    route: str | None = None
    min_duration_ns: int | None = None
    since_ns: int | None = None
    until_ns: int | None = None
    function: str | None = None
    order: str = "duration"
    limit: int = 100


def list_requests(engine: Engine, f: RequestFilter) -> list[dict]:
    r = schema.requests
    query = select(r)
    conditions = []
    if f.function:
        rf = schema.request_functions
        query = query.join(rf, rf.c.request_id == r.c.id)
        conditions.append(rf.c.function_id == stable_id(f.function))
    if f.service:
        conditions.append(r.c.service == f.service)
    if f.route:
        conditions.append(r.c.route == f.route)
    if f.min_duration_ns is not None:
        conditions.append(r.c.duration_ns >= f.min_duration_ns)
    if f.since_ns is not None:
        conditions.append(r.c.start_ns >= f.since_ns)
    if f.until_ns is not None:
        conditions.append(r.c.start_ns < f.until_ns)
    order = r.c.duration_ns.desc() if f.order == "duration" else r.c.start_ns.desc()
    query = query.where(*conditions).order_by(order).limit(f.limit)
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(query).mappings()]


def get_request(engine: Engine, request_id: str) -> tuple[dict, tree_pb2.StoredTree] | None:
    r, t = schema.requests, schema.request_trees
    query = select(r, t.c.tree).join(t, t.c.request_id == r.c.id).where(r.c.id == request_id)
    with engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    if row is None:
        return None
    tree = tree_pb2.StoredTree.FromString(row["tree"])
    return {k: v for k, v in row.items() if k != "tree"}, tree


def _bucket_conditions(
    table: Table, service: str | None, route: str | None, since_ns: int | None, until_ns: int | None
) -> list[ColumnElement[bool]]:
    conditions = []
    if service:
        conditions.append(table.c.service == service)
    if route:
        conditions.append(table.c.route == route)
    if since_ns is not None:
        conditions.append(table.c.minute >= since_ns // NS_PER_MINUTE)
    if until_ns is not None:
        conditions.append(table.c.minute <= until_ns // NS_PER_MINUTE)
    return conditions


def stack_totals(
    engine: Engine,
    service: str | None = None,
    route: str | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
) -> list[tuple[str, int, int]]:
    """(signature, self ns, calls) per stack over the minute buckets of the range."""
    b, s = schema.stack_buckets, schema.stacks
    summed = (
        select(
            b.c.stack_id,
            func.sum(b.c.self_ns).label("self_ns"),
            func.sum(b.c.calls).label("calls"),
        )
        .where(*_bucket_conditions(b, service, route, since_ns, until_ns))
        .group_by(b.c.stack_id)
        .subquery()
    )
    query = (
        select(s.c.signature, summed.c.self_ns, summed.c.calls)
        .join(summed, summed.c.stack_id == s.c.id)
        .order_by(s.c.signature)
    )
    with engine.connect() as conn:
        return [(sig, int(self_ns), int(calls)) for sig, self_ns, calls in conn.execute(query)]


def function_totals(
    engine: Engine,
    service: str | None = None,
    route: str | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
) -> list[dict]:
    b, fn = schema.function_buckets, schema.functions
    summed = (
        select(
            b.c.function_id,
            func.sum(b.c.calls).label("calls"),
            func.sum(b.c.total_ns).label("total_ns"),
            func.sum(b.c.self_ns).label("self_ns"),
            func.sum(b.c.active_ns).label("active_ns"),
            func.sum(b.c.await_ns).label("await_ns"),
            func.sum(b.c.ready_ns).label("ready_ns"),
            func.max(b.c.max_ns).label("max_ns"),
            func.max(b.c.max_slice_ns).label("max_slice_ns"),
        )
        .where(*_bucket_conditions(b, service, route, since_ns, until_ns))
        .group_by(b.c.function_id)
        .subquery()
    )
    query = (
        select(fn.c.name, fn.c.file, fn.c.line, summed)
        .join(summed, summed.c.function_id == fn.c.id)
        .order_by(summed.c.self_ns.desc())
    )
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [
        {k: (int(v) if k not in ("name", "file") and v is not None else v) for k, v in row.items()}
        for row in rows
    ]
