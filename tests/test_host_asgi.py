"""The ASGI middleware as servers see it: an ASGI 3 app to every way they tell one, what it
hands them for a request that is not sampled (the app's own awaitable wrapped in C, no
Python frame), and every request counted once however it ends: returned, failed, cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from profiler_host import native, runtime
from profiler_host.asgi import ProfilerMiddleware
from profiler_host.integrations import _patch_uvicorn
from profiler_host.routes import asgi_route
from profiler_host.runtime import Profiler
from profiler_host.settings import HostSettings

_counts = native.extension("_counts")


@pytest.fixture
def profiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Profiler]:
    """A profiler that samples nothing, as the middleware finds it (not started: no import
    hook; its transport thread, which the first count starts, is stopped after)."""
    settings = HostSettings.load({"server": "127.0.0.1:9", "sample_rate": 0.0, "code_cache": "off"})
    profiler = Profiler(settings)
    monkeypatch.setattr(runtime, "STARTED", profiler)
    yield profiler
    profiler.transport.stop(0)


def rows(profiler: Profiler) -> list[tuple[str, str, int, int]]:
    return sorted((r[0], r[1], r[2], r[3]) for r in profiler.counts.take())


async def app(scope: dict, receive: Any, send: Any) -> str:
    if scope["type"] == "lifespan":
        return "lifespan"
    if scope["path"] == "/slow":
        await asyncio.sleep(3600)
    if scope["path"] == "/fails":
        raise ValueError("the app failed")
    await send({"type": "http.response.start", "status": 200})
    await send({"type": "http.response.body", "body": b"ok"})
    return "returned"


def http(path: str) -> dict:
    return {"type": "http", "path": path, "method": "GET", "headers": []}


def test_servers_see_an_asgi3_coroutine_function() -> None:
    """hypercorn asks `inspect`, uvicorn and Starlette `asyncio` (before 3.14), asgiref its
    own: each must see a coroutine function, or it drives the app as ASGI 2."""
    middleware = ProfilerMiddleware(app)
    assert inspect.iscoroutinefunction(middleware.__call__)
    assert asyncio.iscoroutinefunction(middleware.__call__)
    from asgiref.compatibility import guarantee_single_callable

    assert guarantee_single_callable(middleware) is middleware
    import uvicorn

    config = uvicorn.Config(middleware, interface="auto")
    config.load()
    assert config.interface == "asgi3"


def test_uvicorn_is_given_dispatch_once_it_has_told_the_interface() -> None:
    import uvicorn.config

    config = uvicorn.Config(app, interface="auto", proxy_headers=False)
    patched = type("Config", (uvicorn.Config,), {})
    module = type("module", (), {"Config": patched})
    _patch_uvicorn(module)  # type: ignore[arg-type]
    config.__class__ = patched
    config.load()
    assert config.interface == "asgi3"
    assert isinstance(config.loaded_app.__self__, ProfilerMiddleware)
    assert config.loaded_app is config.loaded_app.__self__.dispatch
    assert config.loaded_app.__self__.app is app
    config.loaded = False
    config.loaded_app = config.loaded_app  # loaded again: not wrapped twice
    patched.load(config)
    assert config.loaded_app.__self__.app is app


@pytest.mark.skipif(_counts is None, reason="the C table is not built or not wanted")
def test_a_request_not_sampled_gets_no_python_frame(profiler: Profiler) -> None:
    middleware = ProfilerMiddleware(app)
    awaitable = middleware.dispatch(http("/"), None, None)
    assert type(awaitable) is _counts.Awaiting
    awaitable.close()  # never started: the app is not called, nothing is counted
    lifespan = middleware.dispatch({"type": "lifespan"}, None, None)
    assert inspect.iscoroutine(lifespan)  # the app's own coroutine, handed through
    assert asyncio.run(lifespan) == "lifespan"
    assert rows(profiler) == []


@pytest.mark.parametrize("entry", ["dispatch", "__call__"])
def test_every_request_is_counted_once_however_it_ends(profiler: Profiler, entry: str) -> None:
    middleware = ProfilerMiddleware(app)
    call = getattr(middleware, entry)
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def serve() -> list[Any]:
        returned = await call(http("/"), None, send)
        with pytest.raises(ValueError, match="the app failed") as failed:
            await call(http("/fails"), None, send)
        assert failed.traceback[-1].name == "app"  # the app's own frame raised it
        slow = asyncio.ensure_future(call(http("/slow"), None, send))
        await asyncio.sleep(0)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        return [returned]

    assert asyncio.run(serve()) == ([None] if entry == "__call__" else ["returned"])
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert rows(profiler) == [("/", "GET", 2, 1), ("/fails", "GET", 5, 1), ("/slow", "GET", 5, 1)]


SCOPES: dict[str, Any] = {
    "http": http("/orders/17"),
    "http, the sampler takes it": http("/sampled"),
    "websocket": {"type": "websocket", "path": "/ws", "headers": []},
    "lifespan": {"type": "lifespan"},
    "no path": {"type": "http", "method": "POST", "headers": []},
    "empty path": {"type": "http", "path": "", "method": "GET", "headers": []},
    "path not a str": {"type": "http", "path": b"/b", "method": "GET", "headers": []},
    "no method": {"type": "http", "path": "/m", "headers": []},
    "empty method": {"type": "http", "path": "/m", "method": "", "headers": []},
    "the sampler fails": http("/decide-fails"),
    "forced": {**http("/f"), "headers": [(b"host", b"h"), (b"x-profiler-force", b"s3cret")]},
    "forced, the name in capitals": {**http("/f"), "headers": [(b"X-Profiler-Force", b"s3cret")]},
    "the wrong secret": {**http("/f"), "headers": [(b"x-profiler-force", b"wrong")]},
    "a name one letter off": {**http("/f"), "headers": [(b"x-profiler-forcd", b"s3cret")]},
    "headers a tuple": {**http("/f"), "headers": ((b"x-profiler-force", b"s3cret"),)},
    "a str name": {**http("/f"), "headers": [("x-profiler-force", "s3cret")]},
    "a header not a pair": {**http("/f"), "headers": [(b"host",)]},
    "headers none": {**http("/f"), "headers": None},
    "no headers": {"type": "http", "path": "/f", "method": "GET"},
}


class _Scope(dict):
    """A scope that is a dict but not exactly one."""


def _through(dispatch: Any, profiler: Profiler, scope: Any, kwargs: bool) -> tuple[str, Any, list]:
    """What a server sees of one connection: the kind of thing it awaits, how awaiting it
    ends, and what was counted."""
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        awaitable = (
            dispatch(scope=scope, receive=None, send=send)
            if kwargs
            else dispatch(scope, None, send)
        )
    except Exception as exc:
        return "raised", repr(exc), rows(profiler)
    kind = "coroutine" if inspect.iscoroutine(awaitable) else type(awaitable).__name__
    try:
        outcome = asyncio.run(_awaited(awaitable))
    except Exception as exc:
        outcome = repr(exc)
    return kind, (outcome, [m["type"] for m in sent]), rows(profiler)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


@pytest.mark.skipif(_counts is None, reason="the C table is not built or not wanted")
@pytest.mark.parametrize("secret", [None, "s3cret"])
@pytest.mark.parametrize("started", [True, False])
def test_the_c_dispatch_does_what_the_python_one_does(
    profiler: Profiler, monkeypatch: pytest.MonkeyPatch, secret: str | None, started: bool
) -> None:
    """`_counts.Dispatch` against `python_dispatch`, on the same scopes with the same
    sampler: the same kind of awaitable, the same outcome, the same counts, the sampler
    asked the same paths, the sampled path given the same arguments."""
    middleware = ProfilerMiddleware(app)
    assert type(middleware.dispatch) is _counts.Dispatch
    monkeypatch.setattr(profiler, "force_secret", secret)
    monkeypatch.setattr(profiler, "settings", replace(profiler.settings, force_secret=secret or ""))
    if not started:
        monkeypatch.setattr(runtime, "STARTED", None)
    asked: list[str] = []
    taken: list[tuple] = []

    def decide(path: str) -> bool:
        asked.append(path)
        if path == "/decide-fails":
            raise RuntimeError("the sampler failed")
        return path == "/sampled"

    def sampled(*args: Any) -> Any:
        taken.append((args[0] is profiler, *args[2:3], *args[4:]))
        return middleware.app(args[1], args[2], args[3])

    monkeypatch.setattr(profiler, "decide", decide)
    monkeypatch.setattr(middleware, "sampled", sampled)
    fell: list[str] = []

    def fallback(scope: Any, *args: Any, **kwargs: Any) -> Any:
        fell.append(scope.get("path"))
        return middleware.python_dispatch(scope, *args, **kwargs)

    twins = {
        "c": _counts.Dispatch(app, vars(runtime), fallback, sampled, asgi_route, middleware),
        "python": middleware.python_dispatch,
    }
    cases = {name: (scope, False) for name, scope in SCOPES.items()}
    cases["a dict subclass"] = (_Scope(http("/sub")), False)
    cases["keywords"] = (http("/kw"), True)
    seen: dict[str, dict[str, tuple]] = {}
    fell_back: dict[str, bool] = {}
    for twin, dispatch in twins.items():
        for name, (scope, kwargs) in cases.items():
            asked.clear()
            taken.clear()
            fell.clear()
            seen.setdefault(name, {})[twin] = (
                *_through(
                    dispatch, profiler, dict(scope) if type(scope) is dict else scope, kwargs
                ),
                list(asked),
                list(taken),
            )
            if twin == "c":
                fell_back[name] = bool(fell)
    for name, outcomes in seen.items():
        assert outcomes["c"] == outcomes["python"], name
    kinds = {name: outcomes["c"][0] for name, outcomes in seen.items()}
    if started:  # the C path was taken where it can be, and it differs
        assert kinds["http"] == "Awaiting" and kinds["lifespan"] == "coroutine"
        assert seen["http, the sampler takes it"]["c"][4] == [
            (True, None, "/sampled", "GET", False)
        ]
        # with a secret, headers without the force header stay in C; the header itself, or
        # headers of a shape C does not read, go to Python
        in_python = {name for name, fell in fell_back.items() if fell}
        assert {"websocket", "lifespan", "no path", "keywords"} <= in_python
        assert not {"http", "no headers", "headers none", "a name one letter off"} & in_python
        headed = {"forced", "forced, the name in capitals", "the wrong secret", "a str name"}
        assert (headed <= in_python) == (secret is not None)
        if secret is not None:
            assert seen["forced"]["c"][4] == [(True, None, "/f", "GET", True)]
            assert seen["forced, the name in capitals"]["c"][4] == [(True, None, "/f", "GET", True)]
            assert seen["the wrong secret"]["c"][3] == ["/f"]  # asked the sampler


@pytest.mark.skipif(_counts is None, reason="the C table is not built or not wanted")
def test_the_c_dispatch_follows_the_started_profiler(
    profiler: Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C dispatch reads a profiler's secret, counts and sampler once, as it first sees
    it: a profiler started after another is read afresh, and none started is the
    fallback's (the app awaited plainly, nothing counted)."""
    dispatch = ProfilerMiddleware(app).dispatch
    assert _through(dispatch, profiler, http("/first"), False)[2] == [("/first", "GET", 2, 1)]
    second = Profiler(
        HostSettings.load({"server": "127.0.0.1:9", "sample_rate": 0.0, "code_cache": "off"})
    )
    asked: list[str] = []
    monkeypatch.setattr(second, "decide", lambda path: asked.append(path) or False)
    monkeypatch.setattr(runtime, "STARTED", second)
    try:
        assert _through(dispatch, second, http("/second"), False)[2] == [("/second", "GET", 2, 1)]
        assert asked == ["/second"] and rows(profiler) == []
        monkeypatch.setattr(runtime, "STARTED", None)
        assert _through(dispatch, second, http("/none"), False)[:2] == (
            "coroutine",
            ("returned", ["http.response.start", "http.response.body"]),
        )
        assert rows(second) == []
    finally:
        second.transport.stop(0)
