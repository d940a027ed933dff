"""What a request that is not sampled pays, piece by piece, in the app's own thread: the WSGI
and ASGI middlewares around a trivial app (against the same app bare and behind a plain
pass-through middleware of the same shape), the sampler's decision, and asyncio's task
creation with the propagation patches in and out. The `after` rows run once a request has
been sampled and has ended: a process that sampled once must be no slower than before.

Two measures: thread CPU time (pieces interleaved, shuffled per round, median of rounds)
and, with `--instructions`, instructions under callgrind, which no other thread or drift
disturbs: each piece runs in a child under callgrind, and the phase of its `n` runs
after a warm-up (`callgrind.phases`) over `n` is its count per request. The sampler's
chance is fixed at 1.0 (no request is sampled by chance) and its route rule is spent
before counting.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import callgrind, results

PIECES = (
    "wsgi_bare",
    "wsgi_layer",
    "wsgi_host",
    "wsgi_host_after",
    "asgi_bare",
    "asgi_layer",
    "asgi_host",
    "asgi_host_after",
    "decide",
    "task",
    "task_patched",
)
ROUTE = "/orders/17"


def _wsgi_app(environ: dict, start_response: Callable) -> list[bytes]:
    return [b"ok"]


async def _asgi_app(scope: dict, receive: Any, send: Any) -> None:
    return None


class _WsgiLayer:
    def __init__(self, app: Callable) -> None:
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        return self.app(environ, start_response)


class _AsgiLayer:
    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def _profiler() -> Any:
    """The host started as in an app, with a sampler that samples nothing from now on."""
    import profiler_host
    from profiler_host import native, sampler

    profiler = profiler_host.start(
        server="127.0.0.1:9", code_cache="off", include="benchmarks_host_unsampled_nothing"
    )
    without_transport(profiler)
    native_sampling = native.extension("_sampling")
    kind = native_sampling.Sampler if native_sampling is not None else sampler.Sampler
    profiler.sampler = kind(10.0, 1e9, None, itertools.repeat(1.0).__next__)
    profiler.decide = profiler.sampler.decide
    profiler.decide(ROUTE)  # the route rule's first sample, spent
    return profiler


def without_transport(profiler: Any) -> None:
    """The profiler's transport never starts its thread (neither for a sampled request nor
    for the counts of those not sampled) and takes no request: no server listens, and
    callgrind would count its retries for as long as the run lasts, more per request the
    slower the machine runs."""
    profiler.transport._ensure_thread = lambda: None
    profiler.transport.submit = lambda request: None


def _sample_once(profiler: Any) -> None:
    """One request sampled and ended: what the `after` pieces run behind (the transport
    does not take it: `without_transport`)."""
    from profiler_host import recording, runtime

    request = profiler.begin(ROUTE, "GET", forced=True)
    token = recording.CURRENT.set(request.main)
    runtime.reset(token)
    profiler.end(request, 200)


def _drive(coroutine: Any) -> None:
    """One ASGI call to its end, without a loop: these apps never wait."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    raise RuntimeError("the app waited for something")


def _pieces(profiler: Any) -> dict[str, Callable[[int], None]]:
    """Each piece as `run(n)`: n requests (or n tasks), in a plain loop."""
    from profiler_host import asgi, propagation, wsgi

    environ = {"PATH_INFO": ROUTE, "REQUEST_METHOD": "GET"}
    scope = {"type": "http", "path": ROUTE, "method": "GET", "headers": []}

    def start_response(status: str, headers: list, exc_info: Any = None) -> None:
        return None

    def wsgi_loop(app: Callable) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                app(environ, start_response)

        return run

    def asgi_loop(app: Callable) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                _drive(app(scope, None, None))

        return run

    def decide(n: int) -> None:
        call = profiler.decide
        for _ in range(n):
            call(ROUTE)

    async def nothing() -> None:
        return None

    async def tasks(n: int) -> None:
        for _ in range(n):
            await asyncio.create_task(nothing())

    def task(patched: bool) -> Callable[[int], None]:
        def run(n: int) -> None:
            if patched:
                propagation.install()
            try:
                asyncio.run(tasks(n))
            finally:
                if patched:
                    propagation.uninstall()

        return run

    host_wsgi, host_asgi = wsgi.ProfilerMiddleware(_wsgi_app), asgi.ProfilerMiddleware(_asgi_app)
    return {
        "wsgi_bare": wsgi_loop(_wsgi_app),
        "wsgi_layer": wsgi_loop(_WsgiLayer(_wsgi_app)),
        "wsgi_host": wsgi_loop(host_wsgi),
        "wsgi_host_after": wsgi_loop(host_wsgi),
        "asgi_bare": asgi_loop(_asgi_app),
        "asgi_layer": asgi_loop(_AsgiLayer(_asgi_app)),
        "asgi_host": asgi_loop(host_asgi.dispatch),  # what the servers the host wraps call
        "asgi_host_after": asgi_loop(host_asgi.dispatch),
        "decide": decide,
        "task": task(False),
        "task_patched": task(True),
    }


def _cpu_ns(run: Callable[[int], None], n: int) -> float:
    started = time.thread_time_ns()
    run(n)
    return (time.thread_time_ns() - started) / n


def _times(rounds: int, n: int, chosen: list[str], seed: int = 1) -> dict[str, list[float]]:
    """ns of thread CPU per request (or task), per round; the `after` pieces in a second
    phase, after one sampled request, interleaved with the rest again (baselines are
    measured in both phases)."""
    profiler = _profiler()
    pieces = _pieces(profiler)
    rng = random.Random(seed)
    before = [p for p in chosen if not p.endswith("_after")]
    after = [p for p in chosen if p != "wsgi_host" and p != "asgi_host"]
    figures: dict[str, list[float]] = {piece: [] for piece in chosen}
    for phase in (before, after):
        if phase is after:
            _sample_once(profiler)
        for piece in phase:
            pieces[piece](n // 10)  # warm-up: specialised bytecode, free lists
        for _ in range(rounds):
            order = list(phase)
            rng.shuffle(order)
            for piece in order:
                figures[piece].append(_cpu_ns(pieces[piece], n))
    return figures


def _child(piece: str, n: int) -> None:
    """Under callgrind: `piece` run n times (and its warm-up) in a fresh process."""
    profiler = _profiler()
    pieces = _pieces(profiler)
    if piece.endswith("_after"):
        _sample_once(profiler)
    pieces[piece](100)
    callgrind.end_phase()
    pieces[piece](n)
    callgrind.end_phase()


def _per_request(piece: str, n: int) -> float:
    """Instructions per request of `piece` (callgrind: the n requests' phase)."""
    counted = [sys.executable, "-m", "benchmarks.host_unsampled", piece, str(n)]
    return callgrind.phases(counted, 2)[1] / n


def run(
    rounds: int, requests: int, instructions: bool, instruction_requests: int, pieces: str = ""
) -> dict:
    chosen = [p for p in pieces.split(",") if p] or list(PIECES)
    unknown = set(chosen) - set(PIECES)
    if unknown:
        raise SystemExit(f"unknown pieces: {', '.join(sorted(unknown))} (known: {PIECES})")
    times = _times(rounds, requests, chosen)
    counts = (
        {piece: _per_request(piece, instruction_requests) for piece in chosen}
        if instructions
        else {}
    )
    out = {
        piece: {
            "cpu_ns_median": round(statistics.median(values), 1),
            "cpu_ns_min": round(min(values), 1),
            "cpu_ns_max": round(max(values), 1),
            **({"instructions": round(counts[piece])} if counts else {}),
        }
        for piece, values in times.items()
    }
    rows = [
        (
            piece,
            f"{f['cpu_ns_median']:.0f}",
            f"{f['cpu_ns_min']:.0f}-{f['cpu_ns_max']:.0f}",
            f"{f['instructions']}" if counts else "-",
        )
        for piece, f in out.items()
    ]
    print(results.table(("piece", "ns per request", "range", "instructions"), rows))
    settings = {
        "rounds": rounds,
        "requests": requests,
        "instruction_requests": instruction_requests,
    }
    path = results.save("host-unsampled", {**settings, "pieces": out})
    print(f"\nresults: {path}")
    return out


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
