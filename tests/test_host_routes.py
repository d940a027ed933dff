"""The route a framework matched, read from real Starlette, FastAPI, Flask and Django apps
in process (what the middleware reads as a request ends); the same under the real host and
server is in test_host_frameworks.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from flask import Blueprint, Flask
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from werkzeug.test import Client
from werkzeug.wrappers import Request as WerkzeugRequest
from werkzeug.wrappers import Response as WerkzeugResponse

from profiler_host import native, routes
from profiler_host.recording import CURRENT
from profiler_host.recording import Request as Sampled
from profiler_host.routes import UNMATCHED, asgi_route, asgi_route_in_full, wsgi_route


async def text(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def asgi_routes(app: Any, paths: list[str]) -> dict[str, str | None]:
    """Each path's route as the middleware reads it once the app answered (each path twice:
    the second read takes the fast path where the first taught it the route's type, and
    gives what reading the scope in full gives, and what the middleware's reader, C where
    built, gives)."""
    seen: dict[str, str | None] = {}

    async def middleware(scope: dict, receive: Callable, send: Callable) -> None:
        await app(scope, receive, send)
        seen[scope["path"]] = asgi_route(scope)
        assert seen[scope["path"]] == asgi_route_in_full(scope) == routes.ASGI_ROUTE(scope)

    async def run() -> None:
        transport = httpx.ASGITransport(app=middleware)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for path in paths * 2:
                await client.get(path)

    asyncio.run(run())
    return seen


def test_starlette_mounts_join_their_templates(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    users = Starlette(routes=[Route("/users/{user_id:int}", text), Route("/admin/", text)])
    app = Starlette(
        routes=[
            Route("/items/{item_id}", text),
            Mount("/bigger", app=users),
            Mount("/tenants/{tenant}", app=users),  # the same app mounted twice
            Mount("/static", app=StaticFiles(directory=tmp_path)),
            Mount("/deep", routes=[Mount("/er", routes=[Route("/{x}", text)])]),
        ]
    )
    assert asgi_routes(
        app,
        [
            "/items/1",
            "/bigger/users/2",
            "/bigger/admin/",
            "/tenants/acme/users/3",
            "/static/a.txt",
            "/deep/er/4",
            "/bigger/nowhere",
            "/nowhere",
        ],
    ) == {
        "/items/1": "/items/{item_id}",
        "/bigger/users/2": "/bigger/users/{user_id:int}",
        "/bigger/admin/": "/bigger/admin/",
        "/tenants/acme/users/3": "/tenants/{tenant}/users/{user_id:int}",
        "/static/a.txt": "/static/{path}",
        "/deep/er/4": "/deep/er/{x}",
        "/bigger/nowhere": UNMATCHED,
        "/nowhere": UNMATCHED,
    }


def test_fastapi_included_routers_keep_their_prefixes() -> None:
    items = APIRouter()
    items.get("/{item_id}")(lambda item_id: {"id": item_id})
    nested = APIRouter(prefix="/outer")
    nested.include_router(items, prefix="/inner")
    app = FastAPI()
    app.include_router(items, prefix="/api/v1/items")
    app.include_router(nested)
    app.add_route("/plain/{name}", text)  # a Starlette route, which FastAPI leaves unnamed
    app.mount("/sub", Starlette(routes=[Route("/x/{y}", text)]))
    assert asgi_routes(
        app, ["/api/v1/items/7", "/outer/inner/8", "/plain/a", "/sub/x/1", "/api/v1/nowhere/1/2"]
    ) == {
        "/api/v1/items/7": "/api/v1/items/{item_id}",
        "/outer/inner/8": "/outer/inner/{item_id}",
        "/plain/a": "/plain/{name}",
        "/sub/x/1": "/sub/x/{y}",
        "/api/v1/nowhere/1/2": UNMATCHED,
    }


class _Leaf:
    """A route type `asgi_route` knows is no mount, whose path is whatever it is given."""

    def __init__(self, path: Any) -> None:
        self._path = path

    @property
    def path(self) -> Any:
        if isinstance(self._path, Exception):
            raise self._path
        return self._path


class _Template:
    def __str__(self) -> str:
        return "/from/str"


LEAF_SCOPES: dict[str, Any] = {
    "a leaf": {"route": _Leaf("/a/{id}")},
    "a leaf with a path that is no str": {"route": _Leaf(_Template())},
    "a leaf whose path fails": {"route": _Leaf(LookupError("no path"))},
    "a leaf under a mount": {"route": _Leaf("/a"), "app_root_path": "", "root_path": "/m"},
    "a leaf under FastAPI": {"route": _Leaf("/a"), "fastapi": {}},
    "a leaf and a route named in the app": {"route": _Leaf("/a"), routes.ROUTE_KEY: "/named"},
    "a route of a type not known": {"route": object(), "router": None},
    "no route, no router": {"path": "/p"},
    "route None, no router": {"route": None},
    "no route, a router": {"router": None},
    "no route, a route named in the app": {routes.ROUTE_KEY: "/named"},
    "a dict subclass": type("Scope", (dict,), {})(route=_Leaf("/sub")),
}


@pytest.mark.skipif(native.extension("_counts") is None, reason="the C reader is not built")
def test_the_c_route_reader_reads_what_asgi_route_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_counts.AsgiRoute` against `asgi_route` on scopes of every shape its fast path looks
    at; it reads the common ones itself and hands the rest to the Python."""
    monkeypatch.setattr(routes, "_LEAF_TYPES", routes._LEAF_TYPES | {_Leaf})
    handed: list[Any] = []

    def python(scope: Any) -> str | None:
        handed.append(scope)
        return asgi_route(scope)

    reader = native.extension("_counts").AsgiRoute(routes._LEAF_TYPES, python, routes.ROUTE_KEY)

    def outcome(read: Callable[[Any], Any], scope: Any) -> Any:
        try:
            return read(scope)
        except Exception as exc:
            return repr(exc)

    for name, scope in LEAF_SCOPES.items():
        handed.clear()
        assert outcome(reader, scope) == outcome(asgi_route, scope), name
        read_in_c = name in (
            "a leaf",
            "a leaf with a path that is no str",
            "a leaf whose path fails",
        )
        read_in_c |= name in ("no route, no router", "route None, no router")
        assert (not handed) == read_in_c, name


def test_an_asgi_app_without_a_known_router_keeps_its_path() -> None:
    async def bare(scope: dict, receive: Callable, send: Callable) -> None:
        await PlainTextResponse("ok")(scope, receive, send)

    assert asgi_routes(bare, ["/a/1"]) == {"/a/1": None}


def wsgi_routes(app: Callable, paths: list[str]) -> dict[str, str | None]:
    seen: dict[str, str | None] = {}

    def middleware(environ: dict, start_response: Callable) -> Iterable[bytes]:
        def capture(status: str, headers: list, exc_info: Any = None) -> Callable:
            seen[environ["PATH_INFO"]] = wsgi_route(environ)
            return start_response(status, headers, exc_info)

        return app(environ, capture)

    client = Client(middleware)
    for path in paths:
        client.get(path)
    return seen


def test_flask_rules_blueprint_prefixes_included() -> None:
    app = Flask(__name__)
    app.get("/items/<int:item_id>")(lambda item_id: {"id": item_id})
    shop = Blueprint("shop", __name__)
    shop.get("/orders/<order_id>")(lambda order_id: {"id": order_id})
    app.register_blueprint(shop, url_prefix="/shop")
    assert wsgi_routes(app, ["/items/1", "/shop/orders/x", "/nowhere"]) == {
        "/items/1": "/items/<int:item_id>",
        "/shop/orders/x": "/shop/orders/<order_id>",
        "/nowhere": UNMATCHED,
    }


def test_a_bare_werkzeug_app_keeps_its_path() -> None:
    @WerkzeugRequest.application
    def app(request: WerkzeugRequest) -> WerkzeugResponse:
        return WerkzeugResponse("ok")

    assert wsgi_routes(app, ["/a/1"]) == {"/a/1": None}


def test_django_names_http_requests_and_leaves_jobs_their_names() -> None:
    """Django's route is taken as `get_response` returns, for the sampled request of the
    context; a job (whole process, `profile_request`) calling Django keeps its name."""
    from django.test import Client

    import profiling_target.frameworks.django_app  # noqa: F401 - configures Django

    routes.install()
    client = Client(HTTP_HOST="127.0.0.1")
    cases = [
        ("GET", "/shop/orders/5/", "/shop/orders/<int:item_id>/"),
        ("GET", "/nowhere/", UNMATCHED),
        ("", "/shop/orders/5/", "nightly-job"),
    ]
    for method, path, expected in cases:
        request = Sampled(1, "nightly-job" if not method else path, method, 1000)
        token = CURRENT.set(request.main)
        try:
            client.get(path)
        finally:
            CURRENT.reset(token)
        assert request.route == expected, (method, path)


def test_django_leaves_every_requests_route_where_the_middleware_reads_it() -> None:
    """Unsampled requests are counted per route too: the route waits in the WSGI environ
    (sync) or the ASGI scope (async), the dict the middleware holds."""
    from django.test import AsyncClient, Client

    import profiling_target.frameworks.django_app  # noqa: F401 - configures Django

    routes.install()
    assert CURRENT.get() is None  # not sampled
    response = Client(HTTP_HOST="127.0.0.1").get("/shop/orders/5/")
    assert wsgi_route(response.wsgi_request.environ) == "/shop/orders/<int:item_id>/"

    async def asynchronous() -> Any:
        return await AsyncClient(HTTP_HOST="127.0.0.1").get("/nowhere/")

    response = asyncio.run(asynchronous())
    assert asgi_route(response.asgi_request.scope) == UNMATCHED
