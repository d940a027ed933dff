"""Tables (SQLAlchemy Core). Times are integer ns since the epoch; buckets are epoch minutes."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from profiler_core.latency import BUCKETS

metadata = MetaData()

schema_version = Table(
    "profiler_schema_version",
    metadata,
    Column("version", Integer, nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("service", String(200), nullable=False),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("python_version", String(64), nullable=False),
    Column("profiler_version", String(64), nullable=False),
    Column("wall_ns", BigInteger, nullable=False),
    Column("monotonic_ns", BigInteger, nullable=False),
    Column("owner", String(36), nullable=False),  # the server instance handling its stream
    Column("heartbeat", Float, nullable=False),  # epoch seconds, refreshed by the owner
    Column("first_seen", Float, nullable=False),
    Index("ix_sessions_heartbeat", "heartbeat"),
)

functions = Table(
    "functions",
    metadata,
    Column("id", BigInteger, primary_key=True),  # stable_id(name): equal on every server
    Column("name", Text, nullable=False),
    Column("file", Text, nullable=False),
    Column("line", Integer, nullable=False),
    Column("kind", Integer, nullable=False),
)

session_functions = Table(
    "session_functions",
    metadata,
    Column("session_id", String(36), primary_key=True),
    Column("fid", BigInteger, primary_key=True),
    Column("function_id", BigInteger, nullable=False),
)

# A stack is its parent stack and its leaf function (a prefix tree, stacktree.py): a deep
# stack costs one row, never a copy of its prefix. Names are built where they are shown.
stack_nodes = Table(
    "stack_nodes",
    metadata,
    Column("id", BigInteger, primary_key=True),  # stacktree.stack_id(parent_id, function_id)
    Column("parent_id", BigInteger, nullable=False),  # 0: an outermost call's stack
    Column("function_id", BigInteger, nullable=False),  # functions.id (negative: unknown)
)

# Every batch ever stored (dedup), with its payload kept while it holds a request that
# is not stored yet, so any server can rebuild that request after a reconnect or crash.
spool = Table(
    "spool",
    metadata,
    Column("session_id", String(36), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("received_at", Float, nullable=False),
    Column("payload", LargeBinary, nullable=True),
    Index("ix_spool_received", "received_at"),
)

requests = Table(
    "requests",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("session_id", String(36), nullable=False),
    Column("service", String(200), nullable=False),
    Column("route", String(500), nullable=False),
    Column("method", String(16), nullable=False),
    Column("status", Integer, nullable=True),
    Column("start_ns", BigInteger, nullable=False),
    Column("duration_ns", BigInteger, nullable=False),
    Column("truncated", Boolean, nullable=False),
    Column("calls", Integer, nullable=False),
    Column("events", Integer, nullable=False),
    Index("ix_requests_start", "start_ns"),
    Index("ix_requests_route", "service", "route", "start_ns"),
    Index("ix_requests_duration", "duration_ns"),
)

request_trees = Table(
    "request_trees",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("tree", LargeBinary, nullable=False),  # StoredTree
)

request_functions = Table(
    "request_functions",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("function_id", BigInteger, primary_key=True),
    Column("start_ns", BigInteger, nullable=False),
    Column("duration_ns", BigInteger, nullable=False),
    Column("calls", Integer, nullable=False),
    Column("total_ns", BigInteger, nullable=False),
    Column("self_ns", BigInteger, nullable=False),
    Column("active_ns", BigInteger, nullable=False),
    Column("max_ns", BigInteger, nullable=False),
    Index("ix_request_functions_slowest", "function_id", "duration_ns"),
    Index("ix_request_functions_start", "start_ns"),
)

_BUCKET_KEY = ("minute", "service", "route")

stack_buckets = Table(
    "stack_buckets",
    metadata,
    Column("minute", BigInteger, primary_key=True),
    Column("service", String(200), primary_key=True),
    Column("route", String(500), primary_key=True),
    Column("stack_id", BigInteger, primary_key=True),
    Column("self_ns", BigInteger, nullable=False),  # running (totals.SELF)
    Column("calls", BigInteger, nullable=False),
    # the time the stack's lanes waited on it (totals.AWAITING, READYING): schema version 6
    Column("await_ns", BigInteger, nullable=False, server_default="0"),
    Column("ready_ns", BigInteger, nullable=False, server_default="0"),
)

function_buckets = Table(
    "function_buckets",
    metadata,
    Column("minute", BigInteger, primary_key=True),
    Column("service", String(200), primary_key=True),
    Column("route", String(500), primary_key=True),
    Column("function_id", BigInteger, primary_key=True),
    Column("calls", BigInteger, nullable=False),
    Column("total_ns", BigInteger, nullable=False),
    Column("self_ns", BigInteger, nullable=False),
    Column("active_ns", BigInteger, nullable=False),
    Column("await_ns", BigInteger, nullable=False),
    Column("ready_ns", BigInteger, nullable=False),
    Column("max_ns", BigInteger, nullable=False),
    Column("max_slice_ns", BigInteger, nullable=False),
)

# Every request the hosts served, sampled or not (schema version 3), per minute of the host's
# report: the count, the sum of durations and one count per duration bucket
# (`profiler_core.latency`: b0 .. b41).
ROUTE_MINUTE_BUCKETS = tuple(f"b{i}" for i in range(BUCKETS))

route_minutes = Table(
    "route_minutes",
    metadata,
    Column("minute", BigInteger, primary_key=True),
    Column("service", String(200), primary_key=True),
    Column("route", String(500), primary_key=True),
    Column("method", String(16), primary_key=True),
    Column("status_class", Integer, primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("duration_ns", BigInteger, nullable=False),
    *(Column(name, BigInteger, nullable=False) for name in ROUTE_MINUTE_BUCKETS),
)

# The same counts summed per day, hour and ten minutes (schema version 5, kept by the writer
# in the transaction that adds to route_minutes): a range's whole spans are read here, the
# minutes left at its ends from route_minutes (storage.route_rollup). `minute` is the span's
# first minute, so both tables are read and expired alike; `method` is not kept (the
# overview sums over it).
route_rollups = Table(
    "route_rollups",
    metadata,
    Column("span", Integer, primary_key=True),  # minutes
    Column("minute", BigInteger, primary_key=True),
    Column("service", String(200), primary_key=True),
    Column("route", String(500), primary_key=True),
    Column("status_class", Integer, primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("duration_ns", BigInteger, nullable=False),
    *(Column(name, BigInteger, nullable=False) for name in ROUTE_MINUTE_BUCKETS),
)

# Schema version 2 (migrations._v2) adds these covering indexes on SQLite, for the flame
# graph and the function table (queries.stack_totals, queries.function_totals). SQLite groups
# by sorting: with rows in stack (function) order, the sums over every minute stream through
# the index (1.6M rows for 100,000 requests over a day: 0.3 s instead of 1.9 s), and a time
# range is one seek per stack to its first minute. Service and route are in them so a filter
# on those never reads the table. Not Index objects on the tables above: v1 is
# `metadata.create_all`, so those tables stay as v1 made them (any later change goes into a
# migration the same way).
bucket_indexes = {
    stack_buckets.name: (
        "ix_stack_buckets_stack",
        ("stack_id", "minute", "service", "route", "self_ns", "calls", "await_ns", "ready_ns"),
    ),
    function_buckets.name: (
        "ix_function_buckets_function",
        (
            "function_id",
            "minute",
            "service",
            "route",
            "calls",
            "total_ns",
            "self_ns",
            "active_ns",
            "await_ns",
            "ready_ns",
            "max_ns",
            "max_slice_ns",
        ),
    ),
}
