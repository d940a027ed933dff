"""Real frameworks with their own async machinery instrumented (issue 14).

FastAPI (with Starlette and anyio) and Django (with asgiref) under uvicorn, each profiled
with the framework's packages included and every request sampled. Their machinery hands
work to threads, throws exceptions into `yield` dependencies, and starts pool threads that
outlive the request: every stored tree must still be complete (nothing the server had to
repair, nothing truncated) with no empty lanes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually, metric_value, nodes, stored_requests
from tests.processes import HttpProcess, ServerProcess, free_port, host, sqlite_server

pytestmark = pytest.mark.slow

FASTAPI = "profiling_target.frameworks.fastapi_app"
DJANGO = "profiling_target.frameworks.django_app"
REPAIRS = (
    "missing_exit",
    "exit_without_enter",
    "exit_mismatch",
    "suspend_while_suspended",
    "resume_without_suspend",
    "events_after_end",
    "unknown_function",
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with sqlite_server(tmp_path) as proc:
        yield proc


def serve(server: ServerProcess, tmp_path: Path, service: str, app: str, include: str):
    port = free_port()
    command = [
        *host("--server", server.target, "--service", service, "--sample-rate", "1000",
              "--include", include, "--"),
        sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    # rewriting a framework's modules on a cold code cache takes a while on a loaded machine
    return HttpProcess(command, tmp_path / f"{service}.log", port, "/health", ready_timeout=120)


def requests_stored(server: ServerProcess, service: str, paths: list[str]) -> list[dict]:
    """Every request sent to `paths` (the readiness probe's `/health` ones, retried as the
    app starts, are not counted)."""
    sent = sum(path != "/health" for path in paths)

    def counted() -> list[dict]:
        stored = stored_requests(server.http, service=service)
        return [request for request in stored if request["route"] != "/health"]

    eventually(lambda: len(counted()) >= sent, 60)
    stored = counted()
    assert len(stored) == sent, sorted((s["route"], s["status"]) for s in stored)
    return stored


def assert_complete(server: ServerProcess, stored: list[dict]) -> list[dict]:
    """No repair, no truncation, no lane that recorded nothing; the requests in detail."""
    repaired = {reason: metric_value(server.http, "profiler_ingest_rejected_total", reason=reason)
                for reason in REPAIRS}  # fmt: skip
    assert not any(repaired.values()), repaired
    assert not [s["route"] for s in stored if s["truncated"]]
    details = [
        httpx.get(f"{server.http}/api/requests/{s['id']}", timeout=30).json() for s in stored
    ]
    empty = [(d["route"], lane["name"]) for d in details for lane in d["lanes"][1:]
             if not lane["root"]["children"]]  # fmt: skip
    assert not empty, empty
    return details


def functions_in(detail: dict) -> list[str]:
    return [node["function"] for lane in detail["lanes"] for node in nodes(lane["root"])[1:]]


def test_fastapi_with_anyio_instrumented_gives_complete_trees(
    server: ServerProcess, tmp_path: Path
) -> None:
    """`HTTPException` leaving `yield` dependencies (thrown into them, cleaned up in anyio's
    worker threads), the first request starting anyio's worker thread, work handed to the
    loop's default executor (which starts its threads inside the request)."""
    app = serve(server, tmp_path, "fastapi", f"{FASTAPI}:app",
                f"fastapi.*,starlette.*,anyio.*,{FASTAPI}")  # fmt: skip
    paths = ["/sync/0", "/sync/1", "/async/0", "/async/2", "/executor"] * 3
    try:
        statuses = [httpx.get(app.url + path, timeout=30).status_code for path in paths]
        stored = requests_stored(server, "fastapi", paths)  # before a shutdown can cut one
    finally:
        app.stop(grace=10)
    assert statuses == [404, 200, 404, 200, 200] * 3
    details = assert_complete(server, stored)
    by_route: dict[str, list[dict]] = {}
    for detail in details:
        by_route.setdefault(detail["route"], []).append(detail)
    failed = [d for d in by_route["/sync/{item_id}"] if d["status"] == 404]
    assert len(failed) == 3
    for detail in failed:
        called = functions_in(detail)
        assert f"{FASTAPI}:sync_resource" in called
        assert f"{FASTAPI}:sync_item" in called  # the endpoint ran, then raised
        assert any(f.startswith("anyio.") for f in called)
    names = {lane["name"] for d in details for lane in d["lanes"]}
    assert not {"AnyIO worker thread", "asyncio_0"} & names, names


def test_django_with_asgiref_instrumented_gives_complete_trees(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Sync views through asgiref's thread-sensitive `sync_to_async` (a per-request executor
    joined in a thread of its own as the request ends), async views, a 404."""
    app = serve(server, tmp_path, "django", f"{DJANGO}:app",
                f"django.*,asgiref.*,{DJANGO}")  # fmt: skip
    paths = ["/items/1/", "/items/0/", "/async/2/", "/health"] * 5
    try:
        statuses = [httpx.get(app.url + path, timeout=30).status_code for path in paths]
        stored = requests_stored(server, "django", paths)  # before a shutdown can cut one
    finally:
        app.stop(grace=10)
    assert statuses == [200, 404, 200, 200] * 5
    details = assert_complete(server, stored)
    called = {f for detail in details for f in functions_in(detail)}
    assert {f"{DJANGO}:item", f"{DJANGO}:async_item"} <= called
    assert any(f.startswith("asgiref.") for f in called)
