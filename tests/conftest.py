"""Fixtures: real databases (SQLite files, the local PostgreSQL), real servers on loopback."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import pytest
from sqlalchemy import create_engine, text

from profiler_server.app import ProfilingServer
from profiler_server.settings import DEFAULTS

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


TRANSPORT_THREAD = "request-profiler-transport"


@pytest.fixture(autouse=True)
def no_transport_outlives_its_test() -> Iterator[None]:
    """A host transport thread started in this process drains the lanes of every sampled
    request in flight (`hooks.ACTIVE`): one left running by a test would take the events of
    later tests' requests. Each test stops the transports it starts."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t.name == TRANSPORT_THREAD and t not in before]
    for thread in leaked:
        thread.join(5)
    assert not [t for t in leaked if t.is_alive()], "a host transport thread outlived its test"


def _pg_available() -> bool:
    try:
        engine = create_engine(PG_ADMIN_URL)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_admin():
    if not _pg_available():
        pytest.fail("PostgreSQL is not reachable on 127.0.0.1:5432 (./dev setup starts it)")
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture
def pg_url(pg_admin) -> Iterator[str]:
    """A fresh, empty PostgreSQL database."""
    name = f"profiler_test_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'profiler.db'}"
    return request.getfixturevalue("pg_url")


@dataclass
class RunningServer:
    server: ProfilingServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"

    def get(self, path: str, **params) -> httpx.Response:
        return httpx.get(self.http + path, params=params, timeout=30)

    def call(self, fn) -> None:
        """Runs a coroutine function on the server's event loop and waits for it."""
        asyncio.run_coroutine_threadsafe(fn(), self.loop).result(60)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.call(self.server.stop)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)


TEST_SETTINGS = replace(
    DEFAULTS,
    listen="127.0.0.1:0",
    http="127.0.0.1:0",
    stream_timeout=1.0,
    gap_timeout=1.0,
)


@pytest.fixture
def start_server() -> Iterator:  # type: ignore[type-arg]
    """Starts real servers (gRPC + HTTP on loopback, ports chosen by the OS)."""
    running: list[RunningServer] = []

    def start(db: str, **overrides) -> RunningServer:
        settings = replace(TEST_SETTINGS, db=db, **overrides)
        server = ProfilingServer(settings)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(60)
        handle = RunningServer(server, loop, thread)
        running.append(handle)
        return handle

    yield start
    for handle in running:
        handle.stop()


@pytest.fixture
def server(db_url, start_server) -> RunningServer:
    return start_server(db_url)
