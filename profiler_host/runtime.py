"""The profiler in this process: instrumentation, sampling and transport wired together."""

from __future__ import annotations

import atexit
import hmac
import itertools
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import Token
from pathlib import Path

from profiler_host import (
    gates,
    hooks,
    integrations,
    layouts,
    notices,
    observers,
    propagation,
    recording,
    routes,
)
from profiler_host.codecache import CodeCache, default_directory
from profiler_host.filters import ModuleFilter
from profiler_host.functions import FunctionRegistry
from profiler_host.importer import InstrumentingFinder
from profiler_host.instrumenter import Instrumenter
from profiler_host.recording import CURRENT, Request
from profiler_host.sampler import new_sampler
from profiler_host.settings import HostSettings
from profiler_host.transport import Transport, TransportSettings

log = logging.getLogger("profiler_host")

# the started profiler, or None: what the middlewares read for every request
STARTED: Profiler | None = None


class Profiler:
    def __init__(self, settings: HostSettings) -> None:
        self.settings = settings
        self.registry = FunctionRegistry()
        self.filter = ModuleFilter(settings.include or ("__main__",), settings.exclude)
        self.instrumenter = Instrumenter(self.filter, self.registry, cache=_code_cache(settings))
        self.finder = InstrumentingFinder(self.instrumenter)
        self.sampler = new_sampler(settings.sample_rate, settings.route_interval)
        self.force_secret = settings.force_secret or None
        self.transport = Transport(
            TransportSettings(
                server=settings.server,
                service=settings.service,
                buffer_bytes=settings.buffer,
                flush_interval=settings.flush_interval,
                security=settings.security,
            ),
            self.registry,
            running=lambda: list(hooks.ACTIVE),
        )
        # what every request pays, in C where it is built: the middlewares call these
        # straight (`decide` before `open`; `counts.counted` for a request not sampled).
        # They and `force_secret` stay as set here once requests flow: the ASGI C dispatch
        # reads the three once per profiler
        self.decide = self.sampler.decide
        self.counts = self.transport.counts
        self._ids = itertools.count(1)
        # sampled requests in flight change together with the propagation patches
        self._in_flight = threading.Lock()
        self._unpatch: threading.Timer | None = None  # the lingering patches' end (`_settle`)
        self._stopping = False  # from stop() on: no timer, every patch out at once
        self._whole: Request | None = None
        self._instrumenting = False
        self._opened = False  # a unit of work was forced or sampled
        self._judged_include = False  # did the first matched sampled request run calls
        self._forked = False  # a forked child leaves what its parent did to the parent
        self._imported_before_fork: frozenset[str] = frozenset()
        self.started = False

    def start(self) -> None:
        global STARTED
        if self.started:
            return
        self.started = True
        self._stopping = False
        STARTED = self
        if layouts.LAYOUT is None:
            log.warning(
                "request-profiler: Python %d.%d is not supported by the bytecode rewriter yet "
                "(built for %s); nothing is instrumented and the app runs unchanged",
                *sys.version_info[:2],
                ", ".join(f"{major}.{minor}" for major, minor in layouts.SUPPORTED),
            )
        else:
            self.finder.install()
            self.instrumenter.sweep()
            self._instrumenting = True
        routes.install()
        atexit.register(self.stop)
        if self.settings.whole_process:
            self._begin_whole_process()

    def stop(self) -> None:
        global STARTED
        if not self.started:
            return
        self.started = False
        self._stopping = True
        STARTED = None
        atexit.unregister(self.stop)
        if self._whole is not None:
            self.end(self._whole)
            notices.calls_not_recorded(self._whole)
            self._whole = None
        for request in list(hooks.ACTIVE):
            # still running as the process stops (a request cancelled by the server's
            # shutdown): what it recorded goes out now, marked truncated
            request.truncated = True
            self.end(request)
        self._tell_what_was_missed()
        self.finder.uninstall()
        self.instrumenter.uninstrument()
        gates.forget()  # nothing held; code still rewritten (a suspended coroutine) stays open
        if self._unpatch is not None:
            self._unpatch.cancel()
            self._unpatch = None  # a later start() settles with a timer of its own
        propagation.uninstall()
        if not self.transport.stop(self.settings.flush_timeout):
            log.warning("request-profiler: the server did not store everything before exit")

    def _tell_what_was_missed(self) -> None:
        """Modules that ran uninstrumented, and a process that sampled nothing (a server's
        processes sample requests, not runs: a gunicorn master never does)."""
        if self._instrumenting:
            notices.uninstrumented(self.finder.uninstrumented(skip=self._imported_before_fork))
        serving = integrations.serving()
        offered = self._opened or self.sampler.seen > 0  # a unit of work was offered
        if not (self.settings.whole_process or offered or self._forked or serving):
            notices.nothing_sampled()

    def after_fork_in_child(self) -> None:
        """The child streams its own session; the parent's open requests stop recording."""
        for request in list(hooks.ACTIVE):
            request.event_cap = 0
        hooks.ACTIVE.clear()
        self._in_flight = threading.Lock()  # another thread may have held it at the fork
        self._unpatch = None  # its thread is the parent's
        propagation.uninstall()
        CURRENT.set(None)
        self._forked = True
        self._imported_before_fork = frozenset(sys.modules)
        self.transport.after_fork()  # a new session sends every definition again
        if self._whole is not None:
            self._begin_whole_process()
        _stop_with_multiprocessing_child(self)

    def _begin_whole_process(self) -> None:
        self._whole = self.begin(process_name(sys.orig_argv), "", forced=True)
        if self._whole is not None:
            CURRENT.set(self._whole.main)

    def forced(self, header: str | None) -> bool:
        secret = self.settings.force_secret
        return bool(secret and header and hmac.compare_digest(header, secret))

    def begin(self, route: str, method: str, forced: bool = False) -> Request | None:
        """A new sampled request, or None when this one is not recorded."""
        if not (forced or self.decide(route)):
            return None
        return self.open(route, method, forced)

    def open(self, route: str, method: str, forced: bool) -> Request | None:
        """The request the sampler chose (or a forced one), or None when it is not recorded
        after all: another tool watches the process, or the buffer is full. A middleware
        calls `decide` and then this, so a request not sampled pays one C call."""
        self._opened = True
        if not forced and observers.watched():
            return None
        if self.transport.over_budget():
            self.transport.drop("buffer_full")
            return None
        request = Request(next(self._ids), route, method, self.settings.max_request_events)
        with self._in_flight:
            if self.settings.propagate:
                request.main.task = propagation.task_owner()
                if not hooks.ACTIVE:
                    propagation.install()  # anyio is imported by now, if the app uses it
                propagation.follow_loop()
            hooks.ACTIVE.append(request)
        self.transport.start()  # a long request (whole process) streams while it runs
        return request

    def end(self, request: Request, status: int = 0) -> None:
        request.finish(status)
        if request.method:  # an HTTP request, not a job or the whole process
            self.counts.add(request.route, request.method, status, request.duration_ns)
        if not self._judged_include and self._instrumenting and request.route != routes.UNMATCHED:
            self._judged_include = True  # the first sampled request that ran the app's code
            notices.ran_no_call(request, self.settings.include)
        with self._in_flight:
            with suppress(ValueError):  # already removed (a fork, or ended twice)
                hooks.ACTIVE.remove(request)
            if not hooks.ACTIVE:
                self._settle()  # unsampled requests run asyncio and threading as is
        self.transport.submit(request)

    def _settle(self) -> None:
        """With no sampled request in flight (under `_in_flight`): the propagation patches
        out, and a timer for those that linger (`propagation.settle`). A profiler that is
        stopping (at exit, where 3.12 starts no thread) takes them all out at once."""
        if self._stopping:
            propagation.uninstall()
            return
        left = propagation.settle()
        if left and self._unpatch is None:
            timer = threading.Timer(left / 1e9, self._settled)
            timer.name = "request-profiler-unpatch"
            timer.daemon = True
            try:
                timer.start()
            except RuntimeError:  # no new thread now (the interpreter is shutting down)
                propagation.uninstall()
                return
            self._unpatch = timer

    def _settled(self) -> None:
        with self._in_flight:
            self._unpatch = None
            if not hooks.ACTIVE:  # else the last one to end settles them
                self._settle()

    @contextmanager
    def recording(self, request: Request | None) -> Iterator[Request | None]:
        """Runs the block as `request` (when it is sampled) in the current context."""
        if request is None:
            yield None
            return
        token = CURRENT.set(request.main)
        status = 0
        try:
            yield request
        except BaseException:
            status = 1
            raise
        finally:
            reset(token)
            self.end(request, status)


def reset(token: Token[recording.Lane | None]) -> None:
    try:
        CURRENT.reset(token)
    except ValueError:  # ended in another context than it began
        CURRENT.set(None)


def _code_cache(settings: HostSettings) -> CodeCache | None:
    if settings.code_cache == "off":
        return None
    return CodeCache(
        Path(settings.code_cache) if settings.code_cache else default_directory(), hooks.HOOKS
    )


def process_name(argv: list[str]) -> str:
    """What the whole-process request is called: the script, module or program run."""
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] != "-m":
        args = args[1:]
    if args[:2] == ["-m", "profiler_host.script"]:
        args = args[2:]
    if args[:1] == ["-m"] and len(args) > 1:
        return args[1]
    if args:
        return os.path.basename(args[0])
    return os.path.basename(argv[0]) if argv else "python"


def _stop_with_multiprocessing_child(profiler: Profiler) -> None:
    """multiprocessing's forked children leave through os._exit, past atexit, and clear the
    exit finalizers they inherited first; an after-fork callback registers ours after that."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.register_after_fork(profiler, _finalize_at_exit)


def _finalize_at_exit(profiler: Profiler) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, profiler.stop, exitpriority=-100)


_profiler: Profiler | None = None


def active() -> Profiler | None:
    return STARTED


def start(**options: object) -> Profiler:
    global _profiler
    if _profiler is None:
        _profiler = Profiler(HostSettings.load(options))
        os.register_at_fork(after_in_child=_after_fork)
    _profiler.start()
    return _profiler


def stop() -> None:
    if _profiler is not None:
        _profiler.stop()


def _after_fork() -> None:
    if _profiler is not None and _profiler.started:
        _profiler.after_fork_in_child()
