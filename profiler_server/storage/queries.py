"""Read side: the queries behind the HTTP API. Each answers in one or two SQL statements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    FromClause,
    Table,
    column,
    func,
    select,
    text,
)

from profiler_core.wire import tree_pb2
from profiler_server.assembly.flatten import stable_id
from profiler_server.assembly.stacktree import EMPTY_ID, StackTree
from profiler_server.assembly.states import WALL, Value
from profiler_server.storage import schema

NS_PER_MINUTE = 60_000_000_000


def plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as a dict keyed by plain `str`: SQLAlchemy keys a row by `quoted_name`, a str
    subclass that orjson refuses as a dict key, so an answer holding one was written by the
    slow fallback encoder (a 10,000-call request: 200 ms instead of 40)."""
    return {str(key): value for key, value in row.items()}


@dataclass(frozen=True)
class RequestFilter:
    service: str | None = None
    route: str | None = None
    min_duration_ns: int | None = None
    max_duration_ns: int | None = None
    status: tuple[int, int] | None = None  # [low, high)
    since_ns: int | None = None
    until_ns: int | None = None
    function: str | None = None
    order: str = "duration"
    limit: int = 100
    offset: int = 0


MAX_COUNT = 100_000  # counting stops past this: over millions of rows it would take seconds


def list_requests(engine: Engine, f: RequestFilter) -> tuple[list[dict], int]:
    """One page of the requests matching `f`, and how many match in all (for paging), up to
    MAX_COUNT + 1."""
    r = schema.requests
    source: FromClause = r
    conditions = []
    if f.function:
        rf = schema.request_functions
        source = r.join(rf, rf.c.request_id == r.c.id)
        conditions.append(rf.c.function_id == stable_id(f.function))
    if f.service:
        conditions.append(r.c.service == f.service)
    if f.route:
        conditions.append(r.c.route == f.route)
    if f.min_duration_ns is not None:
        conditions.append(r.c.duration_ns >= f.min_duration_ns)
    if f.max_duration_ns is not None:
        conditions.append(r.c.duration_ns <= f.max_duration_ns)
    if f.status is not None:
        conditions.append(r.c.status >= f.status[0])
        conditions.append(r.c.status < f.status[1])
    if f.since_ns is not None:
        conditions.append(r.c.start_ns >= f.since_ns)
    if f.until_ns is not None:
        conditions.append(r.c.start_ns < f.until_ns)
    order = r.c.duration_ns.desc() if f.order == "duration" else r.c.start_ns.desc()
    page = select(r).select_from(source).where(*conditions).order_by(order, r.c.id)
    matching = select(r.c.id).select_from(source).where(*conditions).limit(MAX_COUNT + 1)
    count = select(func.count()).select_from(matching.subquery())
    with engine.connect() as conn:
        rows = conn.execute(page.limit(f.limit).offset(f.offset)).mappings()
        found = [plain(row) for row in rows]
        return found, conn.execute(count).scalar_one()


MAX_NAMES = 5000  # (service, route) pairs answered: the pickers' choices, bounded


def service_routes(engine: Engine, since_ns: int | None, until_ns: int | None) -> list[dict]:
    """Each service with the routes it served in the range (stored requests), by name."""
    r = schema.requests
    conditions = []
    if since_ns is not None:
        conditions.append(r.c.start_ns >= since_ns)
    if until_ns is not None:
        conditions.append(r.c.start_ns < until_ns)
    query = (
        select(r.c.service, r.c.route)
        .where(*conditions)
        .group_by(r.c.service, r.c.route)
        .order_by(r.c.service, r.c.route)
        .limit(MAX_NAMES)
    )
    services: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for service, route in conn.execute(query):
            services.setdefault(service, []).append(route)
    return [{"service": s, "routes": routes} for s, routes in services.items()]


def get_request(engine: Engine, request_id: str) -> tuple[dict, tree_pb2.StoredTree] | None:
    r, t = schema.requests, schema.request_trees
    query = select(r, t.c.tree).join(t, t.c.request_id == r.c.id).where(r.c.id == request_id)
    with engine.connect() as conn:
        row = conn.execute(query).mappings().first()
    if row is None:
        return None
    tree = tree_pb2.StoredTree.FromString(row["tree"])
    return {k: v for k, v in plain(row).items() if k != "tree"}, tree


SOURCES_PER_QUERY = 10_000  # bound parameters per statement: SQLite allows 32,766


def function_sources(engine: Engine, names: list[str]) -> list[dict]:
    """file and first line of the named functions (the ones the store knows)."""
    fn = schema.functions
    ids = [stable_id(n) for n in names]
    found = []
    with engine.connect() as conn:
        for first in range(0, len(ids), SOURCES_PER_QUERY):
            chunk = ids[first : first + SOURCES_PER_QUERY]
            query = select(fn.c.name, fn.c.file, fn.c.line).where(fn.c.id.in_(chunk))
            found += [plain(row) for row in conn.execute(query).mappings()]
    return found


def _buckets(engine: Engine, table: Table) -> FromClause:
    """`table` as `b`; on SQLite pinned to its covering index (schema.bucket_indexes) with
    INDEXED BY. SQLite never has ANALYZE statistics here, and without them its planner
    guesses: a time range bounded on both sides looks narrow to it, so it walks the primary
    key (minute first) through what may be the whole day, looks every row up in the table and
    sorts them all (3-5 s over 1.6M buckets, against 0.4 s through the index)."""
    if engine.dialect.name != "sqlite":
        return table.alias("b")
    index, _ = schema.bucket_indexes[table.name]
    pinned = text(f"SELECT * FROM {table.name} INDEXED BY {index}")
    return pinned.columns(*(column(c.name, c.type) for c in table.c)).subquery("b")


def _seek_per_key(engine: Engine, since_ns: int | None, until_ns: int | None) -> bool:
    """Sum a time range key by key, one index seek to (key, first minute) each, instead of
    grouping the rows in range? On SQLite: it groups by sorting, and its index is in key
    order, so the grouped form has to read the whole index. PostgreSQL hashes the rows in
    range (found through the primary key), which is faster than joining every row first."""
    return engine.dialect.name == "sqlite" and (since_ns is not None or until_ns is not None)


def _bucket_conditions(
    b: FromClause,
    service: str | None,
    route: str | None,
    since_ns: int | None,
    until_ns: int | None,
) -> list[ColumnElement[bool]]:
    conditions = []
    if service:
        conditions.append(b.c.service == service)
    if route:
        conditions.append(b.c.route == route)
    if since_ns is not None:
        conditions.append(b.c.minute >= since_ns // NS_PER_MINUTE)
    if until_ns is not None:
        conditions.append(b.c.minute <= until_ns // NS_PER_MINUTE)
    return conditions


def stack_totals(
    engine: Engine,
    service: str | None = None,
    route: str | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    value: Value = WALL,
) -> list[tuple[str, int, int]]:
    """(name as shown, `value`, calls) per stack over the minute buckets of the range, by
    name. Names come from the prefix tree (stacktree.StackTree), a deep stack's middle
    elided; stacks that then look alike are added up."""
    b, s = _buckets(engine, schema.stack_buckets), schema.stack_nodes
    conditions = _bucket_conditions(b, service, route, since_ns, until_ns)
    weight = sum((b.c[column] for column in value.columns[1:]), b.c[value.columns[0]])
    sums = (func.sum(weight).label("value"), func.sum(b.c.calls).label("calls"))
    node = (s.c.id, s.c.parent_id, s.c.function_id)
    if _seek_per_key(engine, since_ns, until_ns):
        query = select(*node, *sums).join(b, b.c.stack_id == s.c.id).where(*conditions)
        query = query.group_by(s.c.id)
    else:
        summed = select(b.c.stack_id, *sums).where(*conditions).group_by(b.c.stack_id).subquery()
        query = select(*node, summed.c.value, summed.c.calls).join(
            summed, summed.c.stack_id == s.c.id
        )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
        nodes = {sid: (parent, function) for sid, parent, function, _, _ in rows}
        _add_ancestors(conn, nodes)
        names = _function_names(conn, {function for _, function in nodes.values()})
    tree, index = _stack_tree(nodes, names)
    totals: dict[str, list[int]] = {}
    for sid, _, _, weighed, calls in rows:
        found = totals.setdefault(tree.name(index[sid]), [0, 0])
        found[0] += int(weighed)
        found[1] += int(calls)
    return [(name, weighed, calls) for name, (weighed, calls) in sorted(totals.items())]


def _add_ancestors(conn: Connection, nodes: dict[int, tuple[int, int]]) -> None:
    """Adds the stored nodes of stacks' ancestors that are not in `nodes` yet (rarely any:
    every prefix of a stack is a stack with calls of its own in the same buckets)."""
    nodes_table = schema.stack_nodes
    missing = {parent for parent, _ in nodes.values() if parent and parent not in nodes}
    while missing:
        found = {}
        ids = sorted(missing)
        for first in range(0, len(ids), SOURCES_PER_QUERY):
            chunk = ids[first : first + SOURCES_PER_QUERY]
            query = select(nodes_table).where(nodes_table.c.id.in_(chunk))
            found.update({sid: (p, f) for sid, p, f in conn.execute(query)})
        nodes.update(found)
        missing = {p for p, _ in found.values() if p and p not in nodes}


def _function_names(conn: Connection, ids: set[int]) -> dict[int, str]:
    fn = schema.functions
    names: dict[int, str] = {}
    chunks = sorted(ids)
    for first in range(0, len(chunks), SOURCES_PER_QUERY):
        chunk = chunks[first : first + SOURCES_PER_QUERY]
        names.update(conn.execute(select(fn.c.id, fn.c.name).where(fn.c.id.in_(chunk))).all())
    return names


def _frame(function: int, names: dict[int, str]) -> str:
    """A function's name; an unknown one (never defined by its host) as the ingest named it."""
    found = names.get(function)
    if found is not None:
        return found
    return f"(unknown function {-function - 1})" if function < 0 else f"(function {function})"


def _stack_tree(
    nodes: dict[int, tuple[int, int]], names: dict[int, str]
) -> tuple[StackTree, dict[int, int]]:
    """The stored nodes as a StackTree and each stack id's index in it, parents added before
    children (iteratively: a stack may be thousands of frames deep). A node whose parent is
    not stored hangs from the empty stack."""
    tree = StackTree()
    index = {EMPTY_ID: 0}
    for sid in nodes:
        path = []
        while sid not in index and len(path) <= len(nodes):
            path.append(sid)
            sid = nodes[sid][0] if nodes[sid][0] in nodes else EMPTY_ID
        for sid in reversed(path):
            parent, function = nodes[sid]
            index[sid] = tree.add(index.get(parent, 0), _frame(function, names))
    return tree, index


def function_totals(
    engine: Engine,
    service: str | None = None,
    route: str | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
) -> list[dict]:
    """Per function over the minute buckets of the range, most self time first."""
    b, fn = _buckets(engine, schema.function_buckets), schema.functions
    conditions = _bucket_conditions(b, service, route, since_ns, until_ns)
    sums = (
        func.sum(b.c.calls).label("calls"),
        func.sum(b.c.total_ns).label("total_ns"),
        func.sum(b.c.self_ns).label("self_ns"),
        func.sum(b.c.active_ns).label("active_ns"),
        func.sum(b.c.await_ns).label("await_ns"),
        func.sum(b.c.ready_ns).label("ready_ns"),
        func.max(b.c.max_ns).label("max_ns"),
        func.max(b.c.max_slice_ns).label("max_slice_ns"),
    )
    if _seek_per_key(engine, since_ns, until_ns):
        query = (
            select(fn.c.name, fn.c.file, fn.c.line, fn.c.id.label("function_id"), *sums)
            .join(b, b.c.function_id == fn.c.id)
            .where(*conditions)
            .group_by(fn.c.id)
            .order_by(func.sum(b.c.self_ns).desc())
        )
    else:
        summed = (
            select(b.c.function_id, *sums).where(*conditions).group_by(b.c.function_id).subquery()
        )
        query = (
            select(fn.c.name, fn.c.file, fn.c.line, summed)
            .join(summed, summed.c.function_id == fn.c.id)
            .order_by(summed.c.self_ns.desc())
        )
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [
        {
            k: (int(v) if k not in ("name", "file") and v is not None else v)
            for k, v in plain(row).items()
        }
        for row in rows
    ]
