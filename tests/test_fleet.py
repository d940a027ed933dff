"""A fleet split between two servers on one PostgreSQL stores what one server stores:
request, function and stack ids are derived from what hosts send, never from a server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, select, text

from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch
from profiler_server.storage import schema
from tests.helpers import metric_value
from tests.processes import ServerProcess

HOSTS = 6
BATCHES = 4
MIDDLE = 2  # the batch after which a host of the split fleet moves to the other server
SPANNING = 1_000  # the request id of the one that spans batches MIDDLE and MIDDLE + 1
SHAPE = CallShape(calls=30, depth=6, functions=12)
# Rows a server makes of its own (owner, heartbeats, arrival times) are not compared.
OWN = {schema.sessions.name, schema.spool.name, schema.schema_version.name}


def _fleet() -> list[tuple[uuid.UUID, list[bytes]]]:
    """Each host's session id and batches, built once so that both runs send the same bytes
    (three requests a batch, routes varying, functions defined in the first; one request
    begun in the middle batch and ended in the next, so it waits in the spool)."""
    fleet = []
    for host in range(HOSTS):
        batches = []
        for seq in range(1, BATCHES + 1):
            builder = BatchBuilder()
            first = (seq - 1) * 3 + 1
            synthetic_batch(
                builder,
                SHAPE,
                range(first, first + 3),
                route=f"/r{(host + seq) % 3}",
                define_functions=seq == 1,
            )
            if seq == MIDDLE:
                builder.start(SPANNING, "/spanning", "GET", time.monotonic_ns())
            elif seq == MIDDLE + 1:
                builder.end(SPANNING, time.monotonic_ns(), 201)
            batches.append(builder.payload(seq))
        fleet.append((uuid.UUID(int=host + 1), batches))
    return fleet


def _stream(target: str, session_id: uuid.UUID, batches: dict[int, bytes], clock: tuple) -> None:
    """One connection of a host's session: a Hello, then `batches` (by seq), all acked."""
    stream = HostStream(target)
    message = hello("fleet", session_id)
    message.hostname, message.pid = f"host{session_id.int}", session_id.int
    message.wall_ns, message.monotonic_ns = clock
    stream.send_hello(message)
    for raw in batches.values():
        stream.send_raw(raw)
    assert stream.wait_acked(set(batches), timeout=60), stream.error
    assert not stream.rejected
    stream.close()


@contextmanager
def _servers(db: str, count: int, where) -> Iterator[list[ServerProcess]]:
    servers = []
    try:
        for i in range(count):
            servers.append(ServerProcess(db, where / f"server{count}-{i}.log"))
        yield servers
    finally:
        for server in servers:
            server.stop(grace=10)


def _stored(db: str) -> dict[str, list[tuple]]:
    engine = create_engine(db)
    try:
        with engine.connect() as conn:
            return {
                table.name: sorted(tuple(map(repr, row)) for row in conn.execute(select(table)))
                for table in schema.metadata.sorted_tables
                if table.name not in OWN
            }
    finally:
        engine.dispose()


def test_two_servers_sharing_a_fleet_store_what_one_server_does(pg_admin, pg_url, tmp_path) -> None:
    fleet = _fleet()
    clock = (time.time_ns(), time.monotonic_ns())
    second = f"profiler_test_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{second}"'))
    split_url = pg_url.rsplit("/", 1)[0] + f"/{second}"
    try:
        with _servers(pg_url, 1, tmp_path) as (one,):
            for session_id, batches in fleet:
                _stream(one.target, session_id, dict(enumerate(batches, 1)), clock)
        with _servers(split_url, 2, tmp_path) as pair:
            for i, (session_id, batches) in enumerate(fleet):
                # Half the fleet on each server; every host moves to the other mid-session.
                before = dict(enumerate(batches[:MIDDLE], 1))
                after = dict(enumerate(batches[MIDDLE:], MIDDLE + 1))
                _stream(pair[i % 2].target, session_id, before, clock)
                _stream(pair[1 - i % 2].target, session_id, after, clock)
            assert all(metric_value(x.http, "profiler_requests_stored_total") for x in pair)
        alone, split = _stored(pg_url), _stored(split_url)
    finally:
        with pg_admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{second}" WITH (FORCE)'))
    assert len(alone[schema.requests.name]) == HOSTS * (BATCHES * 3 + 1)
    assert alone[schema.stack_buckets.name] and alone[schema.request_functions.name]
    for table in alone:
        assert split[table] == alone[table], table
