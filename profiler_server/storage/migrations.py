"""Schema versions, applied in order on start. Several servers may start at once on one
PostgreSQL: an advisory lock makes one of them migrate while the others wait."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    MetaData,
    Table,
    Text,
    func,
    insert,
    inspect,
    literal,
    select,
    text,
)

from profiler_core.stacks import SEPARATOR
from profiler_server.assembly.flatten import OUTSIDE_ID, OUTSIDE_NAME, stable_id
from profiler_server.assembly.stacktree import EMPTY_ID, stack_id
from profiler_server.storage import route_rollup, schema

log = logging.getLogger(__name__)

LOCK_KEY = 0x70726F66  # arbitrary, constant: "prof"


def _v1(conn: Connection) -> None:
    schema.metadata.create_all(conn)


def _v2(conn: Connection) -> None:
    """SQLite: covering indexes on the minute buckets (schema.bucket_indexes). PostgreSQL
    gets none: its planner, given statistics, never picks them (it hashes the rows of a
    parallel scan, or of the primary key's minute range), so they would only slow ingest."""
    if conn.dialect.name != "sqlite":
        return
    for table, (name, columns) in schema.bucket_indexes.items():
        present = {c["name"] for c in inspect(conn).get_columns(table)}
        covered = ", ".join(c for c in columns if c in present)  # later ones: a later version
        conn.execute(text(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({covered})"))


# Versions 1 and 2 kept each stack as its whole `a;b;c` signature, id stable_id(signature).
legacy_stacks = Table(
    "stacks",
    MetaData(),
    Column("id", BigInteger, primary_key=True),
    Column("signature", Text, nullable=False),
)
_UNKNOWN_FUNCTION = re.compile(r"\(unknown function (\d+)\)")
_CHUNK = 5_000


def _function_id(frame: str) -> int:
    """The function id a signature's frame stood for (flatten.StackInterner.child)."""
    unknown = _UNKNOWN_FUNCTION.fullmatch(frame)
    return -int(unknown.group(1)) - 1 if unknown else stable_id(frame)


def _v3(conn: Connection) -> None:
    """Stacks as a prefix tree (schema.stack_nodes): each signature becomes the nodes of its
    frames, and the minute buckets move to the new stack ids; the signatures go."""
    schema.metadata.create_all(conn, tables=[schema.stack_nodes])
    if not inspect(conn).has_table(legacy_stacks.name):
        return
    renamed = Table(
        "stack_id_renames",
        MetaData(),
        Column("old_id", BigInteger, primary_key=True),
        Column("new_id", BigInteger, nullable=False),
        prefixes=["TEMPORARY"],
    )
    renamed.create(conn)
    known: set[int] = set()
    last = None
    while True:
        query = select(legacy_stacks).order_by(legacy_stacks.c.id).limit(_CHUNK)
        if last is not None:
            query = query.where(legacy_stacks.c.id > last)
        rows = conn.execute(query).all()
        if not rows:
            break
        nodes, renames = [], []
        for old_id, signature in rows:
            parent = EMPTY_ID
            for frame in signature.split(SEPARATOR):
                function = _function_id(frame)
                node = stack_id(parent, function)
                if node not in known:
                    known.add(node)
                    nodes.append({"id": node, "parent_id": parent, "function_id": function})
                parent = node
            renames.append({"old_id": old_id, "new_id": parent})
        if nodes:
            conn.execute(insert(schema.stack_nodes), nodes)
        conn.execute(insert(renamed), renames)
        last = rows[-1][0]
    b = schema.stack_buckets.name
    conn.execute(
        text(
            f"UPDATE {b} SET stack_id = (SELECT new_id FROM {renamed.name} r "
            f"WHERE r.old_id = {b}.stack_id) "
            f"WHERE stack_id IN (SELECT old_id FROM {renamed.name})"
        )
    )
    renamed.drop(conn)
    legacy_stacks.drop(conn)


def _v4(conn: Connection) -> None:
    """Every request counted per minute and route (schema.route_minutes)."""
    schema.route_minutes.create(conn, checkfirst=True)


def _v5(conn: Connection) -> None:
    """Route counts per day, hour and ten minutes (schema.route_rollups), summed from the
    minutes stored so far."""
    schema.route_rollups.create(conn, checkfirst=True)
    m, r = schema.route_minutes, schema.route_rollups
    sums = [func.sum(m.c[c.name]) for c in r.columns if not c.primary_key]
    for span in route_rollup.SPANS:
        start = m.c.minute - m.c.minute % span
        key = (start, m.c.service, m.c.route, m.c.status_class)
        rows = select(literal(span), *key, *sums).group_by(*key)
        conn.execute(insert(r).from_select([c.name for c in r.columns], rows))


def _v6(conn: Connection) -> None:
    """Waits per stack (stack_buckets.await_ns, ready_ns), in SQLite's covering index too;
    the function that a lane's time outside profiled calls is charged to."""
    table = schema.stack_buckets
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    for name in ("await_ns", "ready_ns"):
        if name not in present:
            conn.execute(
                text(f"ALTER TABLE {table.name} ADD COLUMN {name} BIGINT NOT NULL DEFAULT 0")
            )
    if conn.dialect.name == "sqlite":
        name, columns = schema.bucket_indexes[table.name]
        conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
        conn.execute(text(f"CREATE INDEX {name} ON {table.name} ({', '.join(columns)})"))
    f = schema.functions
    if conn.execute(select(f.c.id).where(f.c.id == OUTSIDE_ID)).first() is None:
        conn.execute(insert(f).values(id=OUTSIDE_ID, name=OUTSIDE_NAME, file="", line=0, kind=0))


# Append a function for each schema change; never edit a released one.
MIGRATIONS: list[Callable[[Connection], None]] = [_v1, _v2, _v3, _v4, _v5, _v6]
LATEST = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    pass


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table(schema.schema_version.name):
        return 0
    return conn.execute(select(func.max(schema.schema_version.c.version))).scalar() or 0


def upgrade(engine: Engine) -> int:
    """Brings the database to LATEST; returns the version found before."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
        found = current_version(conn)
        if found > LATEST:
            raise SchemaTooNew(
                f"database schema version {found} is newer than this server's {LATEST}; "
                "upgrade request-profiler"
            )
        for version in range(found + 1, LATEST + 1):
            log.info("migrating database schema to version %d", version)
            MIGRATIONS[version - 1](conn)
        if found < LATEST:
            conn.execute(schema.schema_version.delete())
            conn.execute(schema.schema_version.insert().values(version=LATEST))
    return found
