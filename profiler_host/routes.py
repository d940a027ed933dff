"""The route of a request as its framework names it: the template the app matched
(`/items/{item_id}`, `/items/<int:item_id>`), so one endpoint is one route whatever ids its
paths carry, and every request no route matched is `(unmatched)`.

Each framework is read where it keeps what it resolved, once the request ends (nothing is
matched again): Flask's `request.url_rule`, Starlette's `scope["route"]` (FastAPI's
effective route for an included router, the templates of the mounts the request went
through), Django's `request.resolver_match` (taken as `get_response` returns). Where no
framework is recognised the request keeps its path. Unsampled requests are named the same
way: they are counted per route.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from profiler_host import integrations, native
from profiler_host.recording import CURRENT

log = logging.getLogger("profiler_host")

UNMATCHED = "(unmatched)"
ROUTE_KEY = "request_profiler.route"  # where a route resolved inside the app (Django) waits
_MISSING = object()
# Starlette route types seen that are not mounts (asgi_route's fast path reads their path)
_LEAF_TYPES: set[type] = set()


def wsgi_route(environ: Mapping[str, Any]) -> str | None:
    """Flask: the rule of the request Werkzeug keeps in the environ (read as the response
    starts: Flask drops its request afterwards)."""
    if ROUTE_KEY in environ:
        return environ[ROUTE_KEY]
    request = environ.get("werkzeug.request")
    rule = getattr(request, "url_rule", _MISSING)  # a Flask request, not a bare Werkzeug one
    if rule is _MISSING:
        return None
    return UNMATCHED if rule is None else getattr(rule, "rule", None)


def asgi_route(scope: Mapping[str, Any]) -> str | None:
    """Starlette and FastAPI: the route their router put in the scope, behind the templates
    of the mounts it went through.

    Every request pays this, so the common case is read first: a route of a type known not
    to be a mount, no mount passed, no FastAPI state: its own template."""
    route: Any = scope.get("route")
    if (
        type(route) in _LEAF_TYPES
        and "app_root_path" not in scope
        and "fastapi" not in scope
        and ROUTE_KEY not in scope
    ):
        return str(route.path)
    return asgi_route_in_full(scope)


def asgi_route_in_full(scope: Mapping[str, Any]) -> str | None:
    if ROUTE_KEY in scope:
        return scope[ROUTE_KEY]
    if "router" not in scope:
        return None
    try:
        return _starlette_route(scope)
    except Exception:  # a router we do not know: the request keeps its path
        log.debug("request-profiler: no Starlette route", exc_info=True)
        return None


def _asgi_route_reader() -> Callable[[Mapping[str, Any]], str | None]:
    """`asgi_route`, in C where the host's extensions are built (`_counts.AsgiRoute`, its
    twin: every ASGI request is counted under the route it reads)."""
    counts = native.extension("_counts")
    if counts is None:
        return asgi_route
    return counts.AsgiRoute(_LEAF_TYPES, asgi_route, ROUTE_KEY)


ASGI_ROUTE = _asgi_route_reader()


def _starlette_route(scope: Mapping[str, Any]) -> str | None:
    routing = sys.modules.get("starlette.routing")
    if routing is None:
        return None
    route = scope.get("route")
    mounted = _mounted(scope)
    if not mounted and route is not None and not isinstance(route, routing.Mount):
        if isinstance(getattr(route, "path", None), str):
            _LEAF_TYPES.add(type(route))
        return _leaf_template(scope, route)  # the common case: no router's routes are read
    routes = getattr(scope.get("router"), "routes", ())  # FastAPI builds this list per read
    chain = _mount_chain(routes, mounted, routing.Mount) if mounted else []
    prefix = mounted if chain is None else "".join(mount.path for mount in chain)
    if route is None or isinstance(route, routing.Mount):
        # FastAPI's router names only its own routes: a Starlette route under it is found
        # by the endpoint it put in the scope
        route = _by_endpoint(chain[-1].routes if chain else routes, scope, routing.Mount)
    if route is not None:
        return prefix + _leaf_template(scope, route)
    if chain and not chain[-1].routes:
        return prefix + "/{path}"  # an app without routes serves the whole mount
    return UNMATCHED


def _leaf_template(scope: Mapping[str, Any], route: Any) -> str:
    """FastAPI keeps an included router's routes as they were declared and the prefix in
    the route it resolved for the request."""
    state = scope.get("fastapi")
    effective = state.get("effective_route_context") if isinstance(state, dict) else None
    if effective is not None and getattr(effective, "original_route", None) is route:
        return str(effective.path)
    return str(route.path)


def _mounted(scope: Mapping[str, Any]) -> str:
    """What the mounts matched: each adds its part to `root_path` (Starlette keeps the
    app's own root path in `app_root_path` once a mount matched)."""
    if "app_root_path" not in scope:
        return ""
    return str(scope.get("root_path", ""))[len(str(scope["app_root_path"])) :]


def _mount_chain(routes: Sequence[Any], mounted: str, mount_type: Any) -> list[Any] | None:
    """The mounts in `routes`, one inside the other, that matched `mounted` exactly (their
    templates keep a mount's own parameters as parameters)."""
    if not mounted:
        return []
    for route in routes:
        if not isinstance(route, mount_type):
            continue
        match = route.path_regex.match(mounted + "/")
        if match is None:
            continue
        inner = _mount_chain(route.routes, ("/" + match.group("path"))[:-1], mount_type)
        if inner is not None:
            return [route, *inner]
    return None


def _by_endpoint(routes: Sequence[Any], scope: Mapping[str, Any], mount_type: Any) -> Any:
    """The route of `routes` with the scope's endpoint that takes the request's path (one
    endpoint may serve several routes)."""
    endpoint = scope.get("endpoint")
    if endpoint is None:
        return None
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    route_path = path[len(root) :] if path.startswith(root) else path
    for route in routes:
        same = getattr(route, "endpoint", None) is endpoint and not isinstance(route, mount_type)
        if same and route.path_regex.match(route_path):
            return route
    return None


def django_route(match: Any) -> str:
    """Django joins the routes of nested `include()`s in `ResolverMatch.route`, without
    the leading slash (and with the `^` of a regex pattern)."""
    route = getattr(match, "route", None)
    return "/" + route.lstrip("^") if route else UNMATCHED


def _name_django_request(request: Any) -> None:
    """Every request's route waits in its environ (WSGI) or scope (ASGI), the very dict the
    middleware reads, sampled or not; a sampled request (not a job, not the whole process,
    which keep their names) takes it at once."""
    try:
        route = django_route(getattr(request, "resolver_match", None))
        carrier = getattr(request, "scope", None)
        (carrier if isinstance(carrier, dict) else request.environ)[ROUTE_KEY] = route
    except Exception:  # the app's request is answered whatever happens here
        log.debug("request-profiler: no Django route", exc_info=True)
        return
    lane = CURRENT.get()
    if lane is not None and lane.request.method:
        lane.request.route = route


def _patch_django(base: ModuleType) -> None:
    handler = base.BaseHandler
    sync, asynchronous = handler.get_response, handler.get_response_async
    if getattr(sync, "_request_profiler", False):
        return

    @functools.wraps(sync)
    def get_response(self: Any, request: Any) -> Any:
        response = sync(self, request)
        _name_django_request(request)
        return response

    @functools.wraps(asynchronous)
    async def get_response_async(self: Any, request: Any) -> Any:
        response = await asynchronous(self, request)
        _name_django_request(request)
        return response

    get_response._request_profiler = True  # type: ignore[attr-defined]
    handler.get_response = get_response
    handler.get_response_async = get_response_async


PATCHES: dict[str, Callable[[ModuleType], None]] = {"django.core.handlers.base": _patch_django}


def install() -> None:
    """Patches the frameworks that resolve routes inside the app (Django) now if they are
    imported already, else right after their import."""
    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is None:
            integrations.after_import(name, patch)
        else:
            patch(module)
