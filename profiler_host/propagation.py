"""Carries a sampled request into the tasks and threads it starts, each as a lane of its own,
and marks when a task waiting in a sampled request becomes runnable.

A task runs in a copy of its creator's context, as asyncio does, with a new lane set
there. Work handed to another thread (`Thread.start`, an executor's `submit`, anyio's
`to_thread.run_sync` behind Starlette's `run_in_threadpool`) runs in the context it runs
in plainly (a new thread's empty one, a pool worker's own, the copy `asyncio.to_thread` or
anyio make): `InLane` sets the new lane there for the work and takes it out after, so the
thread sees the variables and keeps alive the values it would unprofiled. The lane starts
at the hand-over, so time spent queued in a pool shows before the lane's first call. The
patches do their work only while a sampled request is in flight (`runtime` installs them
as the first begins and settles them as the last ends): a request that is not sampled
runs the originals whatever was sampled before it. A class's Python method is patched in
its code (`_Swap`: one closed gate a call while it is in, nothing once it is out); a
wrapper set on a class (uvloop's compiled methods) may stay in for up to a second, as a C
stand-in that calls the original (`settle`), and the wrapper only for a call that
concerns a sampled lane (`_gated`). While a sampled request is in flight, every patch
costs one ContextVar read outside it. `install()`, `settle()` and
`uninstall()` are idempotent; `install()` also patches the modules of the list below that
the app has imported since (anyio and uvloop are not imported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import CodeType, FunctionType, ModuleType
from typing import Any, TypeGuard

from profiler_core.model import LaneKind
from profiler_host import gates, integrations, native, recording, rewriter, stackdepth
from profiler_host.hooks import ACTIVE, HANDED, UNCLAIMED, ready
from profiler_host.instrumenter import set_code
from profiler_host.recording import CURRENT, Lane

_originals: dict[tuple[object, str], Callable] = {}  # what we wrapped
_wrappers: dict[tuple[object, str], Callable] = {}  # our wrapper of it
_made_by: dict[tuple[object, str], Callable] = {}  # the wrap that made it
_swaps: dict[tuple[object, str], _Swap] = {}  # the Python methods patched in their code
_installed = False  # between install() and settle() or uninstall()
LINGER_NS = 1_000_000_000  # the least time class patches stay in (see settle)
_classes_since: int | None = None  # when the class patches went in, while they are


class _PyInLane:
    """Python twin of `_hotpath.InLane` (see there): the work runs once with CURRENT set to
    the lane in the context it runs in anyway (and the lane handed to this thread, see
    `hooks.Handed`), and finds CURRENT as it was after. Its call is one Python frame on the
    work's stack, which the C type does not add."""

    __slots__ = ("lane", "work")

    def __init__(self, lane: Lane, work: Callable) -> None:
        self.lane: Lane | None = lane
        self.work: Callable | None = work

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lane, work = self.lane, self.work
        if lane is None or work is None:
            raise RuntimeError("InLane: its work ran already")
        self.lane = self.work = None
        token = CURRENT.set(lane)
        saved, HANDED.lane = HANDED.lane, lane
        try:
            return work(*args, **kwargs)
        finally:
            HANDED.lane = saved
            CURRENT.reset(token)
            lane.done = True


# the C hot path's module when it is used (its InLane and stand-ins), else None
_hotpath = native.extension("_hotpath") if recording.IMPLEMENTATION == "c" else None
InLane = _PyInLane if _hotpath is None else _hotpath.InLane


def _child_lane(kind: LaneKind, name: str) -> Lane | None:
    """A new lane under the current one (None: not sampled). Work for another thread is
    claimed by the thread that runs it."""
    parent = CURRENT.get()
    if parent is None:
        return None
    child = parent.request.spawn(parent, kind, name)
    if kind != LaneKind.TASK:
        child.thread = UNCLAIMED
    return child


def _brings_context(func: Callable) -> TypeGuard[functools.partial]:
    """Whether `func` runs its work in a context it brings: asyncio.to_thread hands over
    `partial(context.run, work, ...)`."""
    return (
        isinstance(func, functools.partial)
        and isinstance(getattr(func.func, "__self__", None), contextvars.Context)
        and bool(func.args)
    )


def _in_lane(lane: Lane, func: Callable) -> Callable:
    """`func` run with `lane` set in the context it runs in anyway: the worker's own, or
    the one it brings."""
    if _brings_context(func):
        work, *args = func.args
        return functools.partial(func.func, InLane(lane, work), *args, **func.keywords)
    return InLane(lane, func)


def _name_of(func: Callable) -> str:
    """The work's own name, also through partials."""
    while isinstance(func, functools.partial):
        func = func.args[0] if _brings_context(func) else func.func
    return getattr(func, "__qualname__", None) or type(func).__name__


def _in_executor_lane(func: Callable) -> Callable:
    """Pool work handed over in a sampled request, to run in an executor lane of its own;
    elsewhere `func` itself (one ContextVar read, the work not even named)."""
    if CURRENT.get() is None:
        return func
    lane = _child_lane(LaneKind.EXECUTOR, _name_of(func))
    return func if lane is None else _in_lane(lane, func)


class _Unborn:
    """The owner of a task lane while its task is being made: the task whose step is
    scheduled in the context made for it claims the lane; another task stepping in the lane
    meanwhile (one an eager task makes in its first step, in a copy of that context) is
    not it, and gets a lane of its own."""

    __slots__ = ("context",)

    def __init__(self, context: contextvars.Context) -> None:
        self.context = context

    def __call__(self) -> None:
        return None


def _task_context(name: str) -> tuple[contextvars.Context, Lane] | None:
    """A copy of the current context, as a task gets plainly, with a new task lane set."""
    lane = _child_lane(LaneKind.TASK, name)
    if lane is None:
        return None
    context = contextvars.copy_context()
    context.run(CURRENT.set, lane)
    lane.task = _Unborn(context)
    return context, lane


def _lane_done(lane: Lane, task: asyncio.Future) -> None:
    lane.done = True


def _coro_name(coro: Any) -> str:
    return getattr(coro, "__qualname__", None) or "task"


def _spawned_task(
    create: Callable[[contextvars.Context | None], asyncio.Task], coro: Any, name: str | None
) -> asyncio.Task:
    """`create(context)` for a task created in a sampled request: it runs in a lane of its
    own, marked done when the task is."""
    made = _task_context(name or _coro_name(coro))
    if made is None:
        return create(None)
    context, lane = made
    task = create(context)
    lane.task = weakref.ref(task)
    task.add_done_callback(functools.partial(_lane_done, lane))
    return task


def task_owner() -> weakref.ref[asyncio.Task] | None:
    """The task running now, as the owner of a request's main lane: an ASGI request's task
    owns it before any task the request starts steps in it (see `task_lane`)."""
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return None if task is None else weakref.ref(task)


def task_lane(lane: Lane, task: asyncio.Task, context: contextvars.Context) -> Lane:
    """The lane a step of `task` runs in, scheduled in `context`, which holds `lane`.

    A task made without `create_task` runs in a copy of its creator's context, so in its
    creator's lane (anyio's task groups build `Task` directly when the loop has the eager
    task factory; any library may): two tasks' calls would interleave in one lane. So a
    lane belongs to the first task that steps in it (or the one it was made for), and
    another task stepping in it gets a task lane of its own, set in its context, as it
    would from `create_task`."""
    owner = lane.task
    if owner is None or (type(owner) is _Unborn and owner.context is context):
        lane.task = weakref.ref(task)
        return lane
    # a task that ran already (its step schedules itself, or an eager task built directly
    # ran its first step in its creator's lane) has its open calls in the lane: it stays
    if (
        owner() is task
        or asyncio.current_task(task.get_loop()) is task
        or getattr(task.get_coro(), "cr_suspended", False)
    ):
        return lane
    child = lane.request.spawn(lane, LaneKind.TASK, _coro_name(task.get_coro()))
    child.task = weakref.ref(task)
    try:
        context.run(CURRENT.set, child)
    except RuntimeError:  # entered in another thread: it keeps its lane; this one stays empty
        child.done = True
        return lane
    task.add_done_callback(functools.partial(_lane_done, child))
    return child


def _create_task(original: Callable) -> Callable:
    @functools.wraps(original)
    def create_task(
        self: asyncio.AbstractEventLoop,
        coro: Any,
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task:
        if context is not None or CURRENT.get() is None:  # else: one ContextVar read
            return original(self, coro, name=name, context=context)
        return _spawned_task(lambda made: original(self, coro, name=name, context=made), coro, name)

    return create_task


def _task_factory(previous: Callable | None) -> Callable:
    """A task factory for loops not built on asyncio's `BaseEventLoop` (uvloop), whose
    `create_task` cannot be patched: the same lanes through the loop's own hook, chained to
    the factory it had."""

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future:
        def create(context: contextvars.Context | None) -> asyncio.Task:
            if context is not None:
                kwargs["context"] = context
            if previous is None:
                return asyncio.Task(coro, loop=loop, **kwargs)
            return previous(loop, coro, **kwargs)

        if kwargs.get("context") is not None or CURRENT.get() is None:
            return create(None)
        return _spawned_task(create, coro, kwargs.get("name"))

    return factory


# loops given our task factory -> (the factory they had, ours)
_factories: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Callable | None, Callable]]
_factories = weakref.WeakKeyDictionary()


def follow_loop() -> None:
    """Called as each request is sampled: a running loop that is not a `BaseEventLoop`
    (uvloop, whose `create_task` is compiled) gets our task factory, until `uninstall`."""
    loop = asyncio._get_running_loop()
    if loop is None or isinstance(loop, asyncio.BaseEventLoop) or loop in _factories:
        return
    previous = loop.get_task_factory()
    ours = _task_factory(previous)
    _factories[loop] = (previous, ours)
    loop.set_task_factory(ours)


def _thread_start(original: Callable) -> Callable:
    """The new thread runs what `start` reads as `self._bootstrap` (3.11 to 3.13), which
    runs `run` in the thread's own context: an `InLane` stands in for it while `start`
    runs, so the lane is set there and the Thread keeps no attribute, cycle or lane of ours.
    (3.14 runs `run` inside `Thread._context`, where a lane set here would not show.)"""

    @functools.wraps(original)
    def start(self: threading.Thread) -> None:
        parent = CURRENT.get()
        if parent is not None and parent.handing_over:  # a pool's own worker thread
            original(self)
            return
        lane = _child_lane(LaneKind.THREAD, self.name)
        if lane is None:
            original(self)
            return
        self._bootstrap = InLane(lane, self._bootstrap)  # type: ignore[attr-defined]
        try:
            original(self)
        finally:
            del self._bootstrap  # type: ignore[attr-defined]

    return start


def _submit(original: Callable) -> Callable:
    @functools.wraps(original)
    def submit(self: ThreadPoolExecutor, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
        parent = CURRENT.get()
        if parent is None:
            return original(self, fn, *args, **kwargs)
        with _handing_over(parent):
            return original(self, _in_executor_lane(fn), *args, **kwargs)

    return submit


@contextlib.contextmanager
def _handing_over(lane: Lane) -> Iterator[None]:
    """While `lane` hands work to a pool, the threads the pool starts for it are the pool's
    (long-lived, serving later requests too): no lanes of this request. The work itself
    runs in an executor lane."""
    lane.handing_over += 1
    try:
        yield
    finally:
        lane.handing_over -= 1


def _is_task_step(callback: Callable) -> bool:
    """A task's step or wakeup (a method of the task): the task's own coroutines run in
    it, in the task's lane."""
    return isinstance(getattr(callback, "__self__", None), asyncio.Task)


def _call_soon(original: Callable) -> Callable:
    """A task's step scheduled (the future it awaited is done): its coroutines are ready
    from now on, though the loop may run other callbacks first (the ready wait)."""

    @functools.wraps(original)
    def call_soon(
        self: asyncio.AbstractEventLoop,
        callback: Callable,
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if ACTIVE and context is not None:
            lane = context.get(CURRENT)
            if lane is not None and _is_task_step(callback):
                _on_step(lane, callback.__self__, context)  # type: ignore[attr-defined]
        return original(self, callback, *args, context=context)

    return call_soon


def _on_step(lane: Lane, task: asyncio.Task, context: contextvars.Context) -> None:
    """`task`'s step was scheduled in `context`, which holds `lane`: its lane is ready."""
    ready(task_lane(lane, task, context))


def _handle_run(original: Callable) -> Callable:
    """A loop callback that is not a task's step (a future's done callback, a timer, anyio's
    cancellation delivery) runs in the context it was scheduled from, so in the lane of a
    task whose coroutines are suspended (unrecorded, if they gave control away by `await`).
    Its calls would nest under them: it runs with no lane instead, in that same context."""

    @functools.wraps(original)
    def _run(self: asyncio.Handle) -> None:
        # Like asyncio's own `Handle._run`, this frame lets go of the handle (and through it
        # the callback, a task, its exception) before it returns: a traceback that keeps a
        # frame called from here keeps this frame too (`f_back`), and with it a cycle.
        context = self._context  # type: ignore[attr-defined]
        if context.get(CURRENT) is None or _is_task_step(self._callback):  # type: ignore[attr-defined]
            context = None
            try:
                original(self)
            finally:
                self = None  # type: ignore[assignment]
            return
        token = context.run(CURRENT.set, None)
        try:
            original(self)
        finally:
            self = None  # type: ignore[assignment]
            context.run(CURRENT.reset, token)
            context = token = None

    return _run


class _Laneless:
    """A loop callback run with no lane, in the context it runs in anyway (uvloop's twin of
    `_handle_run`, whose handles are compiled): a different object from the callback,
    which the loop only calls."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable) -> None:
        self.callback = callback

    def __call__(self, *args: Any) -> Any:
        token = CURRENT.set(None)
        try:
            return self.callback(*args)
        finally:
            CURRENT.reset(token)
            self = args = None  # type: ignore[assignment]  # as `_handle_run`'s frame


def _laneless(callback: Callable, context: contextvars.Context | None) -> Callable:
    """`callback` to run with no lane if it would run in one and is not a task's step; a
    task's step runs in the task's own lane (`task_lane`)."""
    lane = CURRENT.get() if context is None else context.get(CURRENT)
    if lane is None:
        return callback
    if _is_task_step(callback):
        if context is not None:
            task_lane(lane, callback.__self__, context)  # type: ignore[attr-defined]
        return callback
    return _Laneless(callback)


def _uvloop_call_soon(original: Callable) -> Callable:
    """uvloop's `call_soon` and `call_soon_threadsafe`: `_handle_run`'s work, done as the
    callback is handed over. No ready mark, unlike `_call_soon`: uvloop runs a
    transport's protocol and a reader in the lane they were made in, calls open above a
    task's suspended frames, which a suspension recorded then would not nest around
    (docs/limits.md)."""

    @functools.wraps(original)
    def call_soon(
        self: asyncio.AbstractEventLoop,
        callback: Callable,
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        return original(self, _laneless(callback, context), *args, context=context)

    return call_soon


def _uvloop_call_later(original: Callable) -> Callable:
    """Also `call_at`, which uvloop runs through `self.call_later`."""

    @functools.wraps(original)
    def call_later(
        self: asyncio.AbstractEventLoop,
        delay: float,
        callback: Callable,
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        return original(self, delay, _laneless(callback, context), *args, context=context)

    return call_later


def _anyio_run_sync(original: Callable) -> Callable:
    @functools.wraps(original)
    async def run_sync(func: Callable, *args: Any, **kwargs: Any) -> Any:
        parent = CURRENT.get()
        if parent is None:
            return await original(func, *args, **kwargs)
        with _handing_over(parent):
            return await original(_in_executor_lane(func), *args, **kwargs)

    return run_sync


Wrap = Callable[[Callable], Callable]


def _scheduling() -> tuple[Wrap, Wrap]:
    """The stand-ins for asyncio's `call_soon` and `Handle._run`, which every callback of
    every request passes through while they are in: the C ones with the C hot path (no
    Python frame unless a sampled lane is concerned), else their Python twins."""
    if _hotpath is None:
        return _call_soon, _handle_run
    _hotpath.configure_loop(asyncio.Task, _on_step, ACTIVE)
    return _hotpath.call_soon, _hotpath.handle_run


CALL_SOON, HANDLE_RUN = _scheduling()
_PATCHES: list[tuple[object, str, Wrap]] = [
    (asyncio.BaseEventLoop, "create_task", _create_task),
    (asyncio.BaseEventLoop, "call_soon", CALL_SOON),
    (asyncio.Handle, "_run", HANDLE_RUN),
    (threading.Thread, "start", _thread_start),
    (ThreadPoolExecutor, "submit", _submit),
]
# module -> (class in it, or "" for the module itself; attribute; wrapper), patched once
# the module is imported. uvloop's tasks get lanes from `follow_loop`; its Python-level
# scheduling methods stand in for `Handle._run` (its handles are compiled)
_MODULE_PATCHES: dict[str, list[tuple[str, str, Wrap]]] = {
    "anyio.to_thread": [("", "run_sync", _anyio_run_sync)],
    "uvloop": [
        ("Loop", "call_soon", _uvloop_call_soon),
        ("Loop", "call_soon_threadsafe", _uvloop_call_soon),
        ("Loop", "call_later", _uvloop_call_later),
    ],
}


def _patch(owner: object, name: str, wrap: Wrap) -> None:
    """Puts our patch in (made once per original: a later install reuses it): a class's
    Python method gets a gated code (`_Swap`), anything else a wrapper on its owner."""
    key = (owner, name)
    current = getattr(owner, name)
    swap = _swaps.get(key)
    made = _made_by.get(key) is wrap
    if swap is not None and made and swap.function is current and swap.put_in():
        return
    if current is _wrappers.get(key):
        return
    if not made or swap is not None or current is not _originals.get(key):
        _make(owner, name, wrap, current)  # first time, or patched by someone else since
    if key in _swaps:
        _swaps[key].put_in()
    else:
        setattr(owner, name, _wrappers[key])


def _make(owner: object, name: str, wrap: Wrap, original: Callable) -> None:
    key = (owner, name)
    _originals[key], _made_by[key] = original, wrap
    _swaps.pop(key, None)
    _wrappers.pop(key, None)
    swap = _Swap.of(owner, original, wrap)
    if swap is None:
        _wrappers[key] = _gated(owner, wrap(original), original)
    else:
        _swaps[key] = swap


class _Swap:
    """A class's Python method patched in its code, not on its class: while it is in, the
    function's code is `gated` (`rewriter.forwarding`), which runs the function's own body
    while no sampled request is in flight and otherwise hands its arguments to the wrapper,
    which calls a copy of the function with its own code. The class is not touched, so
    CPython keeps what it specialised for the class and its instances (see `settle`), and a
    request that is not sampled pays one closed gate a call, inside the function's own
    frame, where a stand-in on the class would cost a call from C into Python."""

    __slots__ = ("function", "gated", "own")

    def __init__(self, function: FunctionType, own: CodeType, gated: CodeType) -> None:
        self.function, self.own, self.gated = function, own, gated

    @classmethod
    def of(cls, owner: object, function: object, wrap: Wrap) -> _Swap | None:
        """The swap for `function`, or None where one cannot be made (not a class's plain
        Python function, or code the rewriter cannot gate)."""
        if not isinstance(owner, type) or type(function) is not FunctionType:
            return None
        own = function.__code__
        copy = FunctionType(
            own, function.__globals__, function.__name__, function.__defaults__,
            function.__closure__,
        )  # fmt: skip
        copy.__kwdefaults__ = function.__kwdefaults__
        copy.__qualname__ = function.__qualname__
        copy.__dict__.update(function.__dict__)
        try:
            gated = rewriter.forwarding(own, wrap(copy), gates.OPEN)
        except (rewriter.NotInstrumentable, stackdepth.StackDepthError):
            return None
        return cls(function, own, gated)

    def put_in(self) -> bool:
        """The gated code in, unless someone else has set the function's code since."""
        if self.function.__code__ is self.own:
            set_code(self.function, self.gated)
        return self.function.__code__ is self.gated

    def take_out(self) -> None:
        if self.function.__code__ is self.gated:
            set_code(self.function, self.own)


def _gated(owner: object, wrapper: Callable, original: Callable) -> Callable:
    """A class's Python wrapper of a method that is not a Python function (uvloop's are
    compiled) behind a C stand-in that calls the original, with no Python frame, while no
    sampled request is in flight (class patches linger: `settle`) and, while one is, for
    every call that concerns no sampled lane (what `_laneless` tests first): a request not
    sampled pays one ContextVar read a call then, not the wrapper's frames."""
    if _hotpath is None or not isinstance(owner, type) or not inspect.isfunction(wrapper):
        return wrapper
    return _hotpath.gated(original, wrapper)


def install() -> None:
    """Called as a request is sampled while none is in flight: a few setattr. A module of
    the list not imported yet is patched right after its import, if still installed then
    (a whole-process request begins before the app imports anyio)."""
    global _installed, _classes_since
    _installed = True
    if _classes_since is None:
        _classes_since = time.monotonic_ns()
    for owner, name, wrap in _PATCHES:
        _patch(owner, name, wrap)
    for module_name in _MODULE_PATCHES:
        module = sys.modules.get(module_name)
        if module is None:
            integrations.after_import(module_name, _imported)
        else:
            _patch_module(module)


def _imported(module: ModuleType) -> None:
    if _installed:
        _patch_module(module)


def _patch_module(module: ModuleType) -> None:
    for owner_name, name, wrap in _MODULE_PATCHES[module.__name__]:
        owner = getattr(module, owner_name) if owner_name else module
        if hasattr(owner, name):
            _patch(owner, name, wrap)


def settle() -> int:
    """Called as the last sampled request in flight ends (and again when what it returns
    has passed, with none in flight): the originals go back, so a process that sampled once
    runs asyncio and threading as before. Module functions, loops' task factories and the
    Python methods patched in their code (`_Swap`) go out at once. A wrapper set on a
    class (uvloop's compiled methods) stays in until it has been in for `LINGER_NS`:
    setting a class's attribute makes CPython drop what it specialised for every
    instruction that touches the class or its instances, and learning it again costs a
    Django app 0.2 to 0.9 million instructions, where putting the patches in and out costs
    little else. So at a steady sampling rate they go in and out at most once a
    `LINGER_NS`, and meanwhile a request not sampled passes through their C stand-ins to
    the originals (`_gated`). Without the C hot path, whose stand-ins they need, everything
    goes out at once. Returns the ns left before the class patches can go out (0: all are
    out)."""
    left = 0
    if _hotpath is not None and _classes_in():
        left = (_classes_since or 0) + LINGER_NS - time.monotonic_ns()
    if left > 0:
        _take_out(classes=False)
        return left
    uninstall()
    return 0


def _classes_in() -> bool:
    """A wrapper of ours is set on a class."""
    return any(
        isinstance(owner, type) and getattr(owner, name) is wrapper
        for (owner, name), wrapper in _wrappers.items()
    )


def uninstall() -> None:
    """Every patch out now (the profiler stops, a fork, tests)."""
    global _classes_since
    _take_out(classes=True)
    _classes_since = None


def _take_out(classes: bool) -> None:
    """Puts the originals back, those of classes only when `classes`. A wrapper that someone
    else has wrapped since stays (taking ours out would take theirs out too)."""
    global _installed
    _installed = False
    for swap in _swaps.values():
        swap.take_out()
    for (owner, name), wrapper in _wrappers.items():
        if (classes or not isinstance(owner, type)) and getattr(owner, name) is wrapper:
            setattr(owner, name, _originals[(owner, name)])
    for loop, (previous, ours) in list(_factories.items()):
        if loop.get_task_factory() is ours:
            loop.set_task_factory(previous)
        del _factories[loop]
