"""Real frameworks under the real host and server.

FastAPI (with Starlette and anyio) and Django (with asgiref) under uvicorn, each profiled
with the framework's packages included and every request sampled. Their machinery hands
work to threads, throws exceptions into `yield` dependencies, and starts pool threads that
outlive the request: every stored tree must still be complete (nothing the server had to
repair, nothing truncated) with no empty lanes.

Flask, Starlette, FastAPI and Django name the routes they matched: the stored route is the
full template (router prefixes, mounts and nested includes joined), and every request no
route matched shares one route.
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
STARLETTE = "profiling_target.frameworks.fast_async"
FLASK = "profiling_target.frameworks.fast_sync"
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


def serve(
    server: ServerProcess,
    tmp_path: Path,
    service: str,
    app: str,
    include: str | None,
    wsgi: bool = False,
    app_dir: Path | None = None,
) -> HttpProcess:
    """`app` under gunicorn (`wsgi`) or uvicorn, profiled with `--include include` (none
    given when None), imported from `app_dir` if given."""
    port = free_port()
    if wsgi:
        app_server = [sys.executable, "-m", "gunicorn", "-w", "1", "-b", f"127.0.0.1:{port}", app]
    else:
        app_server = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1",
                      "--port", str(port)]  # fmt: skip
    if app_dir is not None:
        app_server += ["--app-dir", str(app_dir)]
    included = [] if include is None else ["--include", include]
    command = [
        *host("--server", server.target, "--service", service, "--sample-rate", "1000",
              *included, "--"),
        *app_server,
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
    """No repair, no truncation, no lane that recorded nothing unless one that did hangs
    under it (a task of code not instrumented that handed work over); the requests in
    detail."""
    repaired = {reason: metric_value(server.http, "profiler_ingest_rejected_total", reason=reason)
                for reason in REPAIRS}  # fmt: skip
    assert not any(repaired.values()), repaired
    assert not [s["route"] for s in stored if s["truncated"]]
    details = [
        httpx.get(f"{server.http}/api/requests/{s['id']}", timeout=30).json() for s in stored
    ]
    empty = [(d["route"], lane["name"]) for d in details for lane in d["lanes"][1:]
             if not lane["root"]["children"]
             and not any(other["parent_lane"] == lane["id"] for other in d["lanes"])]  # fmt: skip
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


@pytest.mark.parametrize("asgiref", [True, False], ids=["asgiref", "no-asgiref"])
def test_django_gives_complete_trees(server: ServerProcess, tmp_path: Path, asgiref: bool) -> None:
    """Sync views through asgiref's thread-sensitive `sync_to_async` (a per-request executor
    joined in a thread of its own as the request ends), async views, a 404; with asgiref
    instrumented or not."""
    include = f"django.*,asgiref.*,{DJANGO}" if asgiref else f"django.*,{DJANGO}"
    app = serve(server, tmp_path, "django", f"{DJANGO}:app", include)
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
    assert any(f.startswith("asgiref.") for f in called) == asgiref
    # the view runs in the executor's lane, under asgiref's thread handler (in the copy of
    # the task's context asgiref made before handing it over): no thread lane of its own
    views = [
        (lane["kind"], [n["function"] for n in nodes(lane["root"])])
        for detail in details
        for lane in detail["lanes"]
        if any(n["function"] == f"{DJANGO}:item" for n in nodes(lane["root"]))
    ]
    assert len(views) == 10, views
    for kind, functions in views:
        assert kind == "executor", views
        if asgiref:
            handler = functions.index("asgiref.sync:SyncToAsync.thread_handler")
            assert handler < functions.index(f"{DJANGO}:item")


CALLBACKS_APP = "tests.data.loop_callbacks_app"


def test_loop_callbacks_run_outside_the_request_lane_on_uvicorns_loop(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Under uvicorn's default loop selection (uvloop, installed with `uvicorn[standard]`)
    a loop callback scheduled in a sampled request (`call_soon`, `call_later`,
    `call_soon_threadsafe`) runs with no lane, as on asyncio's loop: its calls do not
    nest under the request's suspended handler."""
    app = serve(server, tmp_path, "callbacks", f"{CALLBACKS_APP}:app", CALLBACKS_APP)
    paths = ["/callbacks"] * 3
    try:
        bodies = [httpx.get(app.url + path, timeout=30).text for path in paths]
        stored = requests_stored(server, "callbacks", paths)
    finally:
        app.stop(grace=10)
    assert bodies == ["3 uvloop"] * 3  # every callback ran, on uvloop's loop
    for detail in assert_complete(server, stored):
        called = functions_in(detail)
        assert f"{CALLBACKS_APP}:app" in called
        assert f"{CALLBACKS_APP}:on_the_loop" not in called, called


DJANGO_ROUTES = {
    "/items/3/": "/items/<int:item_id>/",
    "/shop/items/1/": "/shop/items/<int:item_id>/",
    "/shop/items/2/": "/shop/items/<int:item_id>/",
    "/shop/orders/5/": "/shop/orders/<int:item_id>/",
    "/shop/orders/6/": "/shop/orders/<int:item_id>/",
    "/items/0/": "/items/<int:item_id>/",  # the view's own 404: the route matched
    "/nowhere/1/": "(unmatched)",
    "/nowhere/2/": "(unmatched)",
    "/shop/items/9": "(unmatched)",  # redirected to its trailing slash: no route ran
}
ROUTES = {
    "flask": (f"{FLASK}:app", True, {
        "/items/1": "/items/<int:item_id>",
        "/items/2": "/items/<int:item_id>",
        "/nowhere/1": "(unmatched)",
        "/nowhere/2": "(unmatched)",
    }),
    "starlette": (f"{STARLETTE}:app", False, {
        "/items/1": "/items/{item_id:int}",
        "/items/2": "/items/{item_id:int}",
        "/nowhere/1": "(unmatched)",
        "/nowhere/2": "(unmatched)",
    }),
    "fastapi": (f"{FASTAPI}:app", False, {
        "/items/3": "/items/{item_id}",
        "/api/v1/items/7": "/api/v1/items/{item_id}",
        "/api/v1/items/8": "/api/v1/items/{item_id}",
        "/bigger/admin/": "/bigger/admin/",
        "/bigger/users/4": "/bigger/users/{user_id:int}",
        "/bigger/users/5": "/bigger/users/{user_id:int}",
        "/bigger/nowhere": "(unmatched)",
        "/nowhere/1": "(unmatched)",
    }),
    "django": (f"{DJANGO}:app", False, DJANGO_ROUTES),
    "django-wsgi": (f"{DJANGO}:wsgi", True, DJANGO_ROUTES),
}  # fmt: skip


@pytest.mark.parametrize("framework", sorted(ROUTES))
def test_routes_are_the_templates_the_framework_matched(
    server: ServerProcess, tmp_path: Path, framework: str
) -> None:
    spec, wsgi, expected = ROUTES[framework]
    app = serve(server, tmp_path, framework, spec, spec.partition(":")[0], wsgi=wsgi)
    try:
        statuses = {path: httpx.get(app.url + path, timeout=30).status_code for path in expected}
        stored = requests_stored(server, framework, list(expected))
        counted = eventually(lambda: routes_counted(server, framework, expected), 30)
    finally:
        app.stop(grace=10)
    unmatched = [path for path, route in expected.items() if route == "(unmatched)"]
    assert {statuses[path] for path in unmatched} == (
        {404, 301} if "django" in framework else {404}
    )
    assert sorted(s["route"] for s in stored) == sorted(expected.values())
    assert counted, "every request counted under the route it is stored under"
    matched = [s for s in stored if s["route"] != "(unmatched)"]
    assert matched and all(s["calls"] > 0 for s in matched), matched


def routes_counted(server: ServerProcess, service: str, expected: dict[str, str]) -> bool:
    """Every request to `expected`'s paths counted under its route (`/api/routes`)."""
    answer = httpx.get(f"{server.http}/api/routes", params={"service": service}, timeout=30)
    counts = {r["route"]: r["requests"] for r in answer.json()["routes"] if r["route"] != "/health"}
    want: dict[str, int] = {}
    for route in expected.values():
        want[route] = want.get(route, 0) + 1
    return counts == want


DJANGO_PROJECT = {
    "mysite/__init__.py": "",
    "mysite/settings.py": (
        "SECRET_KEY = 'not-a-secret-for-tests'\nALLOWED_HOSTS = ['127.0.0.1']\n"
        "ROOT_URLCONF = 'mysite.urls'\nINSTALLED_APPS = []\nMIDDLEWARE = []\n"
    ),
    "mysite/urls.py": (
        "from django.urls import include, path\nfrom polls import views\n"
        "urlpatterns = [path('health', views.health), path('polls/', include('polls.urls'))]\n"
    ),
    "mysite/asgi.py": (
        "import os\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'mysite.settings')\n"
        "from django.core.asgi import get_asgi_application\n"
        "application = get_asgi_application()\n"
    ),
    "polls/__init__.py": "",
    "polls/views.py": (
        "from django.http import JsonResponse\n\n"
        "def health(request):\n    return JsonResponse({'ok': True})\n\n"
        "def votes(question_id):\n    return question_id * 3\n\n"
        "def detail(request, question_id):\n"
        "    return JsonResponse({'id': question_id, 'votes': votes(question_id)})\n"
    ),
    "polls/urls.py": (
        "from django.urls import path\nfrom polls import views\n"
        "urlpatterns = [path('<int:question_id>/', views.detail)]\n"
    ),
}


@pytest.mark.parametrize("include", [None, "mysite"], ids=["default", "project-package"])
def test_a_django_project_is_instrumented_or_says_how_to_be(
    server: ServerProcess, tmp_path: Path, include: str | None
) -> None:
    """Without `--include`, the project package and the apps beside it are instrumented,
    as said at start; with only the package of `asgi.py`, the first request says that it
    ran no instrumented function and how to name the apps."""
    root = tmp_path / "project"
    for name, source in DJANGO_PROJECT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    app = serve(server, tmp_path, "mysite", "mysite.asgi:application", include, app_dir=root)
    paths = ["/polls/1/", "/polls/2/"]
    try:
        assert [httpx.get(app.url + path, timeout=30).status_code for path in paths] == [200, 200]
        stored = requests_stored(server, "mysite", paths)
    finally:
        app.stop(grace=10)
    log = app.log.read_text()
    assert {s["route"] for s in stored} == {"/polls/<int:question_id>/"}
    if include is None:
        assert "profiler-host: instrumenting mysite, polls (the app's code in" in log, log
        assert all(s["calls"] >= 2 for s in stored), stored
        assert "ran no instrumented function" not in log
    else:
        assert "profiler-host: instrumenting" not in log
        assert all(s["calls"] == 0 for s in stored), stored
        # the readiness probe's /health is the first request: once per process
        assert log.count("request-profiler: the sampled request GET /health ran no ") == 1, log
        assert log.count("ran no instrumented function") == 1
        assert "only modules matching --include 'mysite' are instrumented" in log
