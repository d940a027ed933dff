"""What a recorded request costs the app's own threads, in one process: a real framework's
app (Django over ASGI, whose sync view runs in a thread through asgiref; `django.*` and the
app instrumented) driven without a server, one request in `every` forced, against the same
process with none forced and against the app unprofiled. Instructions under callgrind, of
the N requests after a warm-up (`callgrind.phases`: start-up and warm-up not
counted), so no other job on the machine blurs them.

The first sampled request puts the propagation patches in. asyncio's and threading's
Python methods are patched in their code and go out as each sampled request ends; a
wrapper set on a class (uvloop's) stays in until it has been in for a second
(`propagation.LINGER_NS`), so at a steady rate it goes in and out at most once a second:
under callgrind a second is a few requests, so the benchmark measures the two ends apart.
`patches kept in` keeps class wrappers in for the run (a rate where a second holds many
requests), `patches out at each end` takes them out as each sampled request ends; the
difference is what setting attributes on classes and taking them off costs the app in
re-specialised bytecode (the methods patched in their code go in and out in both).
`nothing sampled, another request in flight` measures what a request that is not sampled
pays while a sampled one is in flight, as at the default rate under load, where a sampled
request stays in flight for its whole latency. `nothing sampled, the app imported first`
starts the profiler after the app's import, so its functions get their code swapped
instead of rewritten as they are imported (on 3.13 a
function whose `__code__` is set loses the version its calls specialise on, unless the
host gives it back). The transport is not started: what the
host's threads spend encoding and sending is `host-app`'s per-thread figure, and a dead
server's retries would be counted here as noise.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from benchmarks import callgrind, host_unsampled, results

APPS = {
    "django": (
        "profiling_target.frameworks.django_app",
        "django.*,profiling_target.frameworks.django_app",
        "/items/5/",
    ),
    "fast-async": (  # the fast Starlette endpoint: a short run, for the smoke test
        "profiling_target.frameworks.fast_async",
        "starlette.*,profiling_target.frameworks.fast_async",
        "/items/1",
    ),
    "fastapi": (  # its sync route: the view runs in anyio's thread pool
        "profiling_target.frameworks.fastapi_app",
        "fastapi.*,starlette.*,profiling_target.frameworks.fastapi_app",
        "/sync/1",
    ),
}
SECRET = "bench"


@dataclass(frozen=True)
class Setup:
    label: str
    profiled: bool
    sampled: bool = False  # one request in the run's `every` forced
    kept: bool = True  # the propagation patches kept in once they went in
    once: bool = False  # only the warm-up's first request forced, none of those measured
    imported_first: bool = False  # the app imported before the profiler started
    # a forced request is in flight (gates open, patches in) while the others run
    in_flight: bool = False


SETUPS = {
    "none": Setup("none", profiled=False),
    "off": Setup("nothing sampled", profiled=True),
    "kept": Setup("1 in every sampled, patches kept in", profiled=True, sampled=True),
    "once": Setup("sampled once, patches kept in", profiled=True, sampled=True, once=True),
    "toggled": Setup(
        "1 in every sampled, patches out at each end", profiled=True, sampled=True, kept=False
    ),
    "in-flight": Setup("nothing sampled, another request in flight", profiled=True, in_flight=True),
    "swapped": Setup(
        "nothing sampled, the app imported first (its code swapped)",
        profiled=True,
        imported_first=True,
    ),
}


def _app(app_key: str, setup: Setup) -> Any:
    module_name, include, _ = APPS[app_key]

    def imported() -> Any:
        return __import__(module_name, fromlist=["app"]).app

    if not setup.profiled:
        return imported()
    if setup.imported_first:
        imported()  # before the profiler: the sweep swaps its functions' code
    import profiler_host
    from profiler_host import propagation
    from profiler_host.asgi import ProfilerMiddleware

    profiler = profiler_host.start(
        server="127.0.0.1:9", service="bench", include=include, sample_rate="0",
        route_interval="1000000s", force_secret=SECRET,
    )  # fmt: skip
    host_unsampled.without_transport(profiler)
    logging.getLogger("profiler_host").setLevel(logging.ERROR)  # it sends nothing, by design
    propagation.LINGER_NS = 10**18 if setup.kept else 0
    return ProfilerMiddleware(imported()).dispatch


async def _serve(app: Any, path: str, requests: int, every: int, first: int) -> None:
    """`requests` GETs of `path`, request k forced when k % every == 0 (every 0: none)."""
    plain = [(b"host", b"127.0.0.1")]
    forced = [*plain, (b"x-profiler-force", SECRET.encode())]
    for k in range(first, first + requests):
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 5000),
            "headers": forced if every and k % every == 0 else plain,
        }  # fmt: skip
        sent: list[dict] = []
        body = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive(body: list[dict] = body) -> dict:
            if body:
                return body.pop()
            await asyncio.Event().wait()  # no disconnect: cancelled as the request ends
            raise AssertionError("unreachable")

        async def send(message: dict, sent: list[dict] = sent) -> None:
            sent.append(message)

        await app(scope, receive, send)
        if sent[0]["status"] != 200:
            raise RuntimeError(f"{path} answered {sent[0]['status']}")


def _hold() -> Any:
    """A forced request begun and left in flight, as a sampled request is while others
    run beside it: the gates open, the propagation patches in. Returns its end."""
    from profiler_host import runtime

    profiler = runtime.STARTED
    request = profiler.begin("/held", "GET", forced=True)
    return lambda: profiler.end(request, 200)


def _child(app_key: str, setup: str, every: int, requests: int, loop: str) -> None:
    """Under callgrind: a warm-up of 5 * every requests, then `requests`, each part a
    phase of its own (`callgrind.end_phase`). The cyclic
    collector is off: a full collection (some 15 million instructions here) falls in one of
    the two runs and not the other, tens of thousands of instructions a request of noise."""
    gc.disable()
    chosen = SETUPS[setup]
    app = _app(app_key, chosen)
    path = APPS[app_key][2]
    every = every if chosen.sampled else 0
    warmup = 5 * max(every, 10)

    async def both() -> None:  # on one loop, its start and end in neither phase
        await _serve(app, path, warmup, warmup if chosen.once else every, 0)
        held = _hold() if chosen.in_flight else None
        callgrind.end_phase()
        await _serve(app, path, requests, 0 if chosen.once else every, warmup)
        callgrind.end_phase()
        if held is not None:
            held()

    if loop == "uvloop":
        import uvloop

        uvloop.run(both())
    else:
        asyncio.run(both())


def _command(app_key: str, setup: str, every: int, requests: int, loop: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.host_recorded", app_key, setup, str(every),
            str(requests), loop]  # fmt: skip


def run(app_key: str, every: int, requests: int, setups: str = "", uvloop: bool = False) -> dict:
    chosen = [setup for setup in setups.split(",") if setup] or list(SETUPS)
    unknown = set(chosen) - set(SETUPS)
    if unknown or not {"none", "off"} <= set(chosen):
        raise SystemExit(f"setups: none, off and any of {', '.join(SETUPS)}")
    # the code cache filled outside callgrind, where rewriting all of django.* is slow
    loop = "uvloop" if uvloop else "asyncio"
    subprocess.run(_command(app_key, "off", every, 1, loop), check=True, cwd=callgrind.ROOT,
                   env={**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    per_request = {
        setup: callgrind.phases(_command(app_key, setup, every, requests, loop), 2)[1] / requests
        for setup in chosen
    }
    none, nothing = per_request["none"], per_request["off"]
    rows = []
    for setup, count in per_request.items():
        label, sampled = SETUPS[setup].label, SETUPS[setup].sampled
        recorded = (count - nothing) * every if sampled and not SETUPS[setup].once else None
        rows.append((
            label.replace("every", str(every)), f"{count:,.0f}", f"{none / count:.4f}",
            f"{recorded:,.0f}" if recorded is not None else "-",
        ))  # fmt: skip
    print(results.table(
        ("setup", "instructions per request", "ratio to none", "per recorded request"), rows
    ))  # fmt: skip
    path = results.save(
        "host-recorded",
        {
            "app": app_key,
            "every": every,
            "requests": requests,
            "loop": loop,
            "per_request": per_request,
        },
    )
    print(f"\nresults: {path}")
    return per_request


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
