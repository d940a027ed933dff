"""Work handed to threads in a sampled request sees what it sees plainly (issue 14).

Each script runs twice, plainly and under `profiler-host run` inside a forced request, and
prints what its work saw in other threads: context variables, the names in
`copy_context()` apart from the profiler's own, the stack, tracebacks, whether a user value
outlived the caller's hold on it, whether an event loop could start there. Both runs must
print the same; the profiled one's stored tree must show that work as lanes under the calls
that handed it over.

The work runs with the lane through `InLane`, in C (`profiler_host._hotpath`) and in
Python (its twin, `PROFILER_PURE_PYTHON=1`): the tests of it run under both.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import inspect
import json
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from profiler_core.model import EventKind, LaneKind
from profiler_host import hooks, propagation, recording, runtime
from profiler_host.instrumenter import set_code
from profiler_host.recording import CURRENT
from profiler_host.settings import HostSettings
from tests import torture_cases
from tests.helpers import eventually, nodes, stored_requests
from tests.processes import ServerProcess, host
from tests.test_host_e2e import tree
from tests.test_host_rewriter import ENTER, assert_nested, request

COMMON = """
import asyncio
import contextvars
import gc
import inspect
import json
import threading
import traceback
import weakref
from concurrent.futures import ThreadPoolExecutor

import profiler_host

cvar = contextvars.ContextVar("cvar", default="unset")


class Value:
    \"\"\"A user value that a context holds.\"\"\"


def get():
    return cvar.get()


def put(value):
    cvar.set(value)


def visible():
    \"\"\"What the work sees: its value, its context's variables apart from the profiler's,
    the functions of its stack.\"\"\"
    names = sorted(v.name for v in contextvars.copy_context() if v.name != "request_profiler_lane")
    return {"value": cvar.get(), "vars": names, "stack": [f.function for f in inspect.stack()]}


def fails():
    raise ValueError("expected")


def traceback_of(error):
    return [frame.name for frame in traceback.extract_tb(error.__traceback__)]


def report(run):
    with profiler_host.profile_request("handed-over", force=True):
        seen = run()
    print(json.dumps(seen, sort_keys=True))
"""

THREADS = """
def thread_work(seen):
    seen.update(visible())


def thread_sees():
    seen = {}
    thread = threading.Thread(target=thread_work, args=(seen,))
    thread.start()
    thread.join()
    return seen


def pool_sees():
    with ThreadPoolExecutor(1) as pool:
        pool.submit(put, "set by work item 1").result()
        return pool.submit(visible).result()


def tracebacks():
    caught = []
    threading.excepthook = lambda args: caught.append(traceback_of(args.exc_value))
    thread = threading.Thread(target=fails)
    thread.start()
    thread.join()
    threading.excepthook = threading.__excepthook__
    with ThreadPoolExecutor(1) as pool:
        caught.append(traceback_of(pool.submit(fails).exception()))
    return caught


def finished_thread():
    thread = threading.Thread(target=get)
    thread.start()
    thread.join()
    return thread


def idle_pool():
    pool = ThreadPoolExecutor(1)
    pool.submit(get).result()
    return pool


def kept_alive(start):
    \"\"\"Whether a value the caller's context held outlives the caller's hold on it while
    what `start` handed work to (a finished thread, a pool with its idle worker) lives on.\"\"\"
    value = Value()
    alive = weakref.ref(value)
    token = cvar.set(value)
    handed_to = start()
    cvar.reset(token)
    del value
    gc.collect()
    held = alive() is not None
    if isinstance(handed_to, ThreadPoolExecutor):
        handed_to.shutdown()
    return held


def run():
    cvar.set("main")
    return {
        "thread": thread_sees(),
        "pool": pool_sees(),
        "tracebacks": tracebacks(),
        "kept alive by a finished thread": kept_alive(finished_thread),
        "kept alive by an idle pool": kept_alive(idle_pool),
    }


report(run)
"""

ASYNCIO = """
import asyncio


async def kept_alive_by_the_executor(loop):
    value = Value()
    alive = weakref.ref(value)
    token = cvar.set(value)
    await loop.run_in_executor(None, get)  # the executor's worker starts here
    cvar.reset(token)
    del value
    gc.collect()
    return alive() is not None


async def handler():
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    cvar.set("task")
    seen = {"kept alive by the loop's executor": await kept_alive_by_the_executor(loop)}
    seen["executor"] = await loop.run_in_executor(None, visible)
    await loop.run_in_executor(None, put, "set by work item 1")
    seen["executor after a set"] = await loop.run_in_executor(None, visible)
    seen["to_thread"] = await asyncio.to_thread(visible)
    await asyncio.to_thread(put, "set in to_thread")
    seen["to_thread after a set"] = await asyncio.to_thread(visible)
    seen["task after the work"] = cvar.get()
    return seen


report(lambda: asyncio.run(handler()))
"""

ANYIO = """
import anyio
import anyio.to_thread
from anyio.from_thread import start_blocking_portal
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient


def portal_runs():
    try:
        with start_blocking_portal() as portal:
            portal.call(anyio.sleep, 0)
        return "ran"
    except RuntimeError as error:
        return str(error)


async def hello(request):
    return PlainTextResponse("hello")


def client_gets():
    try:
        with TestClient(Starlette(routes=[Route("/", hello)])) as client:
            return client.get("/").text
    except RuntimeError as error:
        return str(error)


def in_a_thread(work, seen):
    seen[work.__name__] = work()


def thread_runs(work):
    seen = {}
    thread = threading.Thread(target=in_a_thread, args=(work, seen))
    thread.start()
    thread.join()
    return seen


async def task_group_error_referrers():
    \"\"\"What refers to an error a task group raised once the group is gone (anyio's own
    refcycle tests: a frame kept by a traceback keeps a loop callback's task alive).\"\"\"
    inner = anyio.create_task_group()

    async def fails_in_group():
        async with inner:
            fails()

    try:
        async with anyio.create_task_group() as outer:
            outer.start_soon(fails_in_group)
    except BaseExceptionGroup as group:
        error = group.exceptions[0].exceptions[0]
    return [type(one).__name__ for one in gc.get_referrers(error)]


async def handler():
    cvar.set("task")
    seen = {"run_sync": await anyio.to_thread.run_sync(visible)}
    seen["task group error referrers"] = await task_group_error_referrers()
    await anyio.to_thread.run_sync(put, "set in run_sync")
    seen["run_sync after a set"] = await anyio.to_thread.run_sync(visible)
    seen["portal in run_sync"] = await anyio.to_thread.run_sync(portal_runs)
    seen["portal in a thread"] = thread_runs(portal_runs)
    seen["test client in a thread"] = thread_runs(client_gets)
    return seen


report(lambda: anyio.run(handler))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("propagation")
    proc = ServerProcess(f"sqlite:///{tmp / 'profiles.db'}", tmp / "server.log")
    try:
        yield proc
    finally:
        proc.stop(grace=10)


def printed(command: list[str], cwd: Path) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def without_twin_frames(seen: Any) -> Any:
    """What a script printed, less the frames of the Python twin's call (`__call__`, one
    per hand-over): with PROFILER_PURE_PYTHON=1 the profiled run has them, the C type adds
    none."""
    if isinstance(seen, dict):
        return {key: without_twin_frames(value) for key, value in seen.items()}
    if isinstance(seen, list):
        return [without_twin_frames(item) for item in seen if item != "__call__"]
    return seen


def both_ways(
    server: ServerProcess, tmp_path: Path, service: str, source: str
) -> tuple[dict, dict, dict]:
    """What the script prints plainly and profiled, and the profiled request's stored tree."""
    script = tmp_path / f"handed_over_{service}.py"  # not named like the modules it imports
    script.write_text(COMMON + source)
    plain = printed([sys.executable, str(script)], tmp_path)
    profiled = printed(
        host(
            "--server", server.target, "--service", service, "--sample-rate", "0",
            "--", sys.executable, str(script),
        ),
        tmp_path,
    )  # fmt: skip
    (stored,) = eventually(lambda: stored_requests(server.http, service=service), timeout=20)
    if recording.IMPLEMENTATION == "python":
        profiled = without_twin_frames(profiled)
    return plain, profiled, tree(server, stored["id"])


def nodes_of(request: dict, function: str) -> list[tuple[dict, dict]]:
    """The nodes of `function` in the request, each with its lane."""
    return [
        (node, lane)
        for lane in request["lanes"]
        for node in nodes(lane["root"])
        if node["function"] == f"__main__:{function}"
    ]


def assert_handed_over(request: dict, work: str, spawner: str, kind: str, count: int) -> None:
    """`work` ran in `count` lanes of `kind`, each hung under a call of `spawner`."""
    spawners = {(lane["id"], node["id"]) for node, lane in nodes_of(request, spawner)}
    lanes = [lane for _, lane in nodes_of(request, work)]
    assert [lane["kind"] for lane in lanes] == [kind] * count
    for lane in lanes:
        assert (lane["parent_lane"], lane["parent_node"]) in spawners


def test_threads_and_pools_see_what_they_see_plainly(server: ServerProcess, tmp_path: Path):
    """A new thread starts in an empty context, a pool's worker keeps its own from one work
    item to the next, and neither keeps the caller's values alive."""
    plain, profiled, request = both_ways(server, tmp_path, "threads", THREADS)
    assert plain["thread"]["value"] == "unset" and plain["thread"]["vars"] == []
    assert plain["pool"]["value"] == "set by work item 1"
    assert plain["kept alive by a finished thread"] is False
    assert profiled == plain
    assert_handed_over(request, "thread_work", "thread_sees", "thread", 1)
    assert_handed_over(request, "put", "pool_sees", "executor", 1)


def test_asyncio_executors_see_what_they_see_plainly(server: ServerProcess, tmp_path: Path):
    """`loop.run_in_executor` runs in the worker's own context, `asyncio.to_thread` in a copy
    of the task's it makes itself."""
    plain, profiled, request = both_ways(server, tmp_path, "asyncio", ASYNCIO)
    assert plain["executor"]["value"] == "unset"
    assert plain["executor after a set"]["value"] == "set by work item 1"
    assert plain["to_thread after a set"]["value"] == "task"
    assert profiled == plain
    assert_handed_over(request, "put", "handler", "executor", 2)  # run_in_executor, to_thread


def test_anyio_worker_threads_see_what_they_see_plainly(server: ServerProcess, tmp_path: Path):
    """anyio's worker threads run in the copy anyio makes; a thread started under
    `anyio.run` can run an event loop of its own (a blocking portal, Starlette's TestClient)."""
    plain, profiled, request = both_ways(server, tmp_path, "anyio", ANYIO)
    assert plain["portal in a thread"] == {"portal_runs": "ran"}
    assert plain["test client in a thread"] == {"client_gets": "hello"}
    assert plain["task group error referrers"] == []
    assert profiled == plain
    assert_handed_over(request, "put", "handler", "executor", 1)
    assert_handed_over(request, "in_a_thread", "thread_runs", "thread", 2)


# -- InLane, in C and in Python -------------------------------------------------------

IN_LANES: dict[str, type] = {"python": propagation._PyInLane}
if recording.IMPLEMENTATION == "c":
    from profiler_host import _hotpath

    IN_LANES["c"] = _hotpath.InLane
EXTRA_FRAMES = {"python": ["__call__"], "c": []}  # the twin's call is a Python frame


@pytest.fixture(params=list(IN_LANES))
def in_lane(request: pytest.FixtureRequest) -> tuple[str, type]:
    return request.param, IN_LANES[request.param]


def test_in_lane_sets_the_lane_for_the_work_alone(in_lane: tuple[str, type]) -> None:
    """The work sees the lane in the context it runs in; after it, that context holds
    nothing of ours and the InLane holds neither lane nor work; it runs once."""
    lane = recording.Request(1, "/r", "GET", 10).main
    seen = []

    def work(*args: object, **kwargs: object) -> str:
        seen.append((CURRENT.get(), args, kwargs))
        return "done"

    run = in_lane[1](lane, work)
    assert gc.is_tracked(run)
    context = contextvars.Context()
    assert context.run(run, 1, two=2) == "done"
    assert seen == [(lane, (1,), {"two": 2})]
    assert CURRENT not in context
    assert not {id(lane), id(work)} & {id(held) for held in gc.get_referents(run)}
    with pytest.raises(RuntimeError, match="ran already"):
        run()
    seen.clear()
    references = sys.getrefcount(lane), sys.getrefcount(work)
    contextvars.Context().run(in_lane[1](lane, work))
    seen.clear()
    assert (sys.getrefcount(lane), sys.getrefcount(work)) == references  # none leaked


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_in_lane_passes_the_work_s_exception_on(in_lane: tuple[str, type], error: type) -> None:
    """The work's exception reaches the caller with the work's own frames (C adds none),
    and the lane is taken out of the context all the same."""

    def fails() -> None:
        raise error("expected")

    def frames(run: object) -> list[str]:
        context = contextvars.Context()
        context.run(CURRENT.set, None)
        with pytest.raises(error, match="expected") as caught:
            context.run(run)
        assert context[CURRENT] is None
        return [frame.name for frame in traceback.extract_tb(caught.tb)]

    name, in_lane_type = in_lane
    lane = recording.Request(1, "/r", "GET", 10).main
    plain = frames(fails)
    assert frames(in_lane_type(lane, fails)) == [plain[0], *EXTRA_FRAMES[name], *plain[1:]]


HOOKS_OF = {"python": hooks.PYTHON_HOOKS, "c": hooks.HOOKS}


def test_work_run_in_a_context_copied_before_the_hand_over_records_in_its_lane(
    in_lane: tuple[str, type],
) -> None:
    """asgiref's `sync_to_async` copies the task's context (which holds the task's lane),
    hands the work to a thread, and there runs the view in that copy: the view's calls
    nest in the lane handed over, under the work's own, with no thread lane of their own.
    A context of another lane stays apart."""
    name, in_lane_type = in_lane
    enter, exit_ = HOOKS_OF[name].enter, HOOKS_OF[name].exit
    request = recording.Request(1, "/r", "GET", 100)
    other = recording.Request(2, "/o", "GET", 100)
    handed = request.spawn(request.main, LaneKind.EXECUTOR, "work")
    handed.thread = hooks.UNCLAIMED
    copied, apart = contextvars.Context(), contextvars.Context()
    copied.run(CURRENT.set, request.main)
    apart.run(CURRENT.set, other.main)

    def call(function: int) -> None:
        token = enter(function)
        assert token is not None
        exit_(token)

    def work() -> None:
        token = enter(1)
        copied.run(call, 2)
        apart.run(call, 3)
        exit_(token)

    thread = threading.Thread(target=lambda: contextvars.Context().run(in_lane_type(handed, work)))
    thread.start()
    thread.join()
    assert [(kind, function) for kind, function, *_ in handed.events] == [
        (EventKind.ENTER, 1), (EventKind.ENTER, 2), (EventKind.EXIT, 2), (EventKind.EXIT, 1)
    ]  # fmt: skip
    assert handed.thread == thread.ident
    assert request.lanes == [request.main, handed]
    (thread_lane,) = other.lanes[1:]  # the other request's context: a thread lane of its own
    assert [(kind, function) for kind, function, *_ in thread_lane.events] == [
        (EventKind.ENTER, 3), (EventKind.EXIT, 3)
    ]  # fmt: skip


@contextlib.contextmanager
def in_flight(request: recording.Request) -> Iterator[None]:
    """`request` sampled and in flight in this context, with the patches in."""
    propagation.install()
    hooks.ACTIVE.append(request)
    token = CURRENT.set(request.main)
    try:
        yield
    finally:
        CURRENT.reset(token)
        hooks.ACTIVE.remove(request)
        propagation.uninstall()


def test_a_finished_thread_holds_nothing_of_the_request() -> None:
    """A thread started in a sampled request runs in a lane of its own, under the starting
    one; once it is done, the Thread holds neither that lane nor a stand-in."""
    request = recording.Request(1, "/r", "GET", 100)
    ids = []
    with in_flight(request):
        thread = threading.Thread(target=lambda: ids.append(CURRENT.get().id))
        thread.start()
        thread.join()
    (lane,) = [lane for lane in request.lanes if lane.id in ids]
    assert (lane.kind, lane.parent) == (LaneKind.THREAD, request.main)
    assert "_bootstrap" not in vars(thread)
    gc.collect()
    assert gc.get_referrers(lane) == [request.lanes]


def test_work_still_running_at_the_end_is_listed_and_pool_threads_are_no_lanes() -> None:
    """At a request's end the host names the lanes whose thread, task or pool work still
    runs (the server cuts their open calls there without calling them lost); the threads a
    pool starts to serve the request's work belong to the pool, not to the request."""
    request = recording.Request(1, "/r", "GET", 100)
    release = threading.Event()
    with in_flight(request):
        quick = threading.Thread(target=lambda: None, name="quick")
        quick.start()
        quick.join()
        slow = threading.Thread(target=release.wait, name="slow")
        slow.start()
        with ThreadPoolExecutor(2, thread_name_prefix="pool") as pool:
            pool.submit(len, "work").result()
            blocked = pool.submit(release.wait)
            request.finish()
            release.set()
            blocked.result()
        slow.join()
    names = {lane.id: lane.name for lane in request.lanes[1:]}
    assert sorted(names.values()) == ["Event.wait", "len", "quick", "slow"]
    assert sorted(names[lane_id] for lane_id in request.running_lanes) == ["Event.wait", "slow"]


def test_patches_work_only_while_a_sampled_request_is_in_flight() -> None:
    """The first sampled request in flight puts the propagation patches in. As the last one
    ends, the originals go back at once: module functions, and the Python methods of
    classes, whose code was swapped (the class keeps its attributes): requests that are not
    sampled run asyncio and threading as they are, whatever was sampled before them, even
    in a context that still holds an ended request's lane."""
    import anyio.to_thread

    settings = HostSettings.load({"server": "127.0.0.1:9", "code_cache": "off"})
    profiler = runtime.Profiler(settings)
    start, run_sync = threading.Thread.start, anyio.to_thread.run_sync
    own = start.__code__
    try:
        first = profiler.begin("/a", "GET", forced=True)
        second = profiler.begin("/b", "GET", forced=True)
        assert first and second and start.__code__ is not own
        assert anyio.to_thread.run_sync is not run_sync
        profiler.end(first)
        assert start.__code__ is not own
        profiler.end(second)
        assert anyio.to_thread.run_sync is run_sync
        assert threading.Thread.start is start and start.__code__ is own
        assert profiler._unpatch is None  # nothing lingers
        token = CURRENT.set(second.main)
        try:
            thread = threading.Thread(target=lambda: None)
            thread.start()
            thread.join()
        finally:
            CURRENT.reset(token)
        assert second.lanes == [second.main]  # the original ran: no lane
    finally:
        propagation.uninstall()
        profiler.transport.stop(0)


def test_a_method_someone_else_patched_since_keeps_their_patch() -> None:
    """Someone who sets the method's code while ours is in keeps theirs when ours goes out
    (`set_code`, as `function.__code__ = code` without 3.13's lost version);
    one who wraps the method on its class calls ours inside, which runs the method's own
    body once ours is out, and their wrapper stays."""
    start = threading.Thread.start
    own = start.__code__
    calls: list[str] = []

    def theirs(self: threading.Thread) -> None:
        calls.append("theirs")
        start(self)

    def run_a_thread() -> None:
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()

    try:
        propagation.install()
        threading.Thread.start = theirs  # type: ignore[method-assign]
        propagation.uninstall()
        assert threading.Thread.start is theirs and start.__code__ is own
        run_a_thread()
        assert calls == ["theirs"]
        threading.Thread.start = start  # type: ignore[method-assign]
        propagation.install()
        gated = start.__code__
        assert gated is not own
        replaced = own.replace()  # someone else's code, as another tool would set it
        set_code(start, replaced)
        propagation.uninstall()
        assert start.__code__ is replaced
        propagation.install()  # ours goes in over what is there now
        assert start.__code__ not in (replaced, own)
        propagation.uninstall()
        assert start.__code__ is replaced
        run_a_thread()
    finally:
        threading.Thread.start = start  # type: ignore[method-assign]
        set_code(start, own)
        propagation.uninstall()


@pytest.mark.skipif(propagation._hotpath is None, reason="patches linger with the C hot path")
def test_a_wrapper_set_on_a_class_lingers_and_a_restarted_profiler_takes_it_out() -> None:
    """uvloop's compiled `call_soon` is wrapped on its class: the wrapper stays in until it
    has been in for `LINGER_NS`, calling the original meanwhile, then goes out with no
    other request to end. stop() cancels that timer; after start() again, the next sampled
    request's patches get a timer of their own."""
    import uvloop

    settings = HostSettings.load({"server": "127.0.0.1:9", "code_cache": "off"})
    profiler = runtime.Profiler(settings)
    original = uvloop.Loop.call_soon
    try:
        for _ in range(2):
            profiler.start()
            request = profiler.begin("/a", "GET", forced=True)
            assert request and uvloop.Loop.call_soon is not original
            profiler.end(request)
            assert uvloop.Loop.call_soon is not original and profiler._unpatch is not None
            profiler.stop()
            assert uvloop.Loop.call_soon is original
        profiler.start()
        request = profiler.begin("/a", "GET", forced=True)
        assert request
        profiler.end(request)
        assert eventually(lambda: uvloop.Loop.call_soon is original, timeout=10)
    finally:
        profiler.stop()
        propagation.uninstall()


UVLOOP_PATCHED = ("call_soon", "call_soon_threadsafe", "call_later")


@pytest.mark.skipif(propagation._hotpath is None, reason="the C stand-ins")
def test_a_class_wrapper_runs_only_for_the_calls_that_concern_a_sampled_lane() -> None:
    """The C stand-in of a wrapper set on a class (uvloop's compiled methods) calls the
    wrapper only while a sampled request is in flight, and then only for a call whose
    `context=` holds a lane or, without one, made where a lane is current: a request not
    sampled goes straight to the original (what the wrapper's `_laneless` would decide)."""
    went: list[str] = []

    def original(*args: Any, **kwargs: Any) -> str:
        went.append("original")
        return "original"

    def wrapper(*args: Any, **kwargs: Any) -> str:
        went.append("wrapper")
        return "wrapper"

    stand_in = propagation._hotpath.gated(original, wrapper)
    sampled = recording.Request(1, "/t", "GET", 1000)
    in_lane = contextvars.copy_context()
    in_lane.run(CURRENT.set, sampled.main)
    laneless = contextvars.copy_context()
    assert stand_in(1, context=in_lane) == "original"  # nothing in flight
    hooks.ACTIVE.append(sampled)
    try:
        assert stand_in(1, context=laneless) == "original"
        assert stand_in(1) == "original"
        assert stand_in(1, context=None) == "original"
        assert stand_in(1, context=in_lane) == "wrapper"
        assert in_lane.run(stand_in, 1) == "wrapper"
        assert in_lane.run(stand_in, 1, context=None) == "wrapper"
        assert in_lane.run(stand_in, 1, context=laneless) == "original"
        assert stand_in(1, context="not a context") == "wrapper"  # it decides, as it would
    finally:
        hooks.ACTIVE.remove(sampled)
    assert went == ["original"] * 4 + ["wrapper"] * 3 + ["original", "wrapper"]


def test_uvloop_tasks_get_lanes_through_a_chained_task_factory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvloop's `create_task` is compiled: while a sampled request is in flight the loop
    gets a task factory of ours, chained to the one it had, and gets that one back after,
    as its `call_soon` family gets its originals back (here at once)."""
    import uvloop

    monkeypatch.setattr(propagation, "LINGER_NS", 0)

    originals = [getattr(uvloop.Loop, name) for name in UVLOOP_PATCHED]

    settings = HostSettings.load({"server": "127.0.0.1:9", "code_cache": "off"})
    profiler = runtime.Profiler(settings)
    made_by_theirs: list[str] = []

    def theirs(loop: Any, coro: Any, **kwargs: Any) -> Any:
        made_by_theirs.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def child() -> Any:
        return CURRENT.get()

    async def handler() -> tuple:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(theirs)
        request = profiler.begin("/r", "GET", forced=True)
        assert request is not None
        patched = [getattr(uvloop.Loop, name) for name in UVLOOP_PATCHED]
        token = CURRENT.set(request.main)
        try:
            lane = await asyncio.create_task(child())
        finally:
            CURRENT.reset(token)
            profiler.end(request)
        assert not set(patched) & set(originals)
        return request, lane, loop.get_task_factory()

    loop = uvloop.new_event_loop()
    try:
        request, lane, factory_after = loop.run_until_complete(handler())
    finally:
        loop.close()
        profiler.transport.stop(0)
    assert (lane.kind, lane.parent, lane.done) == (LaneKind.TASK, request.main, True)
    assert made_by_theirs == [
        "test_uvloop_tasks_get_lanes_through_a_chained_task_factory.<locals>.child"
    ]
    assert factory_after is theirs
    assert [getattr(uvloop.Loop, name) for name in UVLOOP_PATCHED] == originals


LATE_ANYIO = """
import sys
import profiler_host

assert "anyio" not in sys.modules
profiler_host.start(server="127.0.0.1:9", whole_process=True, code_cache="off")
import anyio.to_thread

print(hasattr(anyio.to_thread.run_sync, "__wrapped__"))
"""


def test_anyio_imported_after_the_request_began_is_followed() -> None:
    """A whole-process request begins before the app imports anyio: anyio's thread pool
    is patched right after its import, so its work still gets executor lanes."""
    done = subprocess.run(
        [sys.executable, "-c", LATE_ANYIO], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True"


CALLBACKS = """
import asyncio
import threading

def plain_step(log):
    log.append("callback ran")

async def waiter(future):
    return await future

async def main(log):
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    # each runs while main awaits, in main's context (the last in the thread's lane)
    loop.call_soon(plain_step, log)
    loop.call_later(0.001, plain_step, log)
    loop.call_at(loop.time(), plain_step, log)
    thread = threading.Thread(target=loop.call_soon_threadsafe, args=(plain_step, log))
    thread.start()
    thread.join()
    await asyncio.sleep(0.02)
    loop.call_soon(future.set_result, 7)
    return await waiter(future)
"""


def _uvloop() -> asyncio.AbstractEventLoop:
    import uvloop

    return uvloop.new_event_loop()


LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": _uvloop}


def instrumented(source: str, filename: str) -> tuple[dict[str, Any], dict[int, Any]]:
    """`source` run with its functions instrumented: its namespace, its functions by id."""
    functions: dict[int, Any] = {}
    code = torture_cases.instrument_tree(compile(source, filename, "exec"), hooks.HOOKS, functions)
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    return namespace, functions


SCHEDULINGS = {"python": (propagation._call_soon, propagation._handle_run)}
if recording.IMPLEMENTATION == "c":
    SCHEDULINGS["c"] = (propagation.CALL_SOON, propagation.HANDLE_RUN)


@pytest.fixture(params=list(SCHEDULINGS))
def scheduling(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """asyncio's `call_soon` and `Handle._run` stood in for by the C stand-ins and by their
    Python twins, in turn."""
    call_soon, handle_run = SCHEDULINGS[request.param]
    chosen = {"call_soon": call_soon, "_run": handle_run}
    patches = [(owner, name, chosen.get(name, wrap)) for owner, name, wrap in propagation._PATCHES]
    monkeypatch.setattr(propagation, "_PATCHES", patches)
    return request.param


@contextlib.contextmanager
def recorded_run(loop: str) -> Iterator[tuple[recording.Request, asyncio.Runner]]:
    """A sampled request with the propagation patches in, and a runner on `loop`."""
    propagation.install()
    try:
        with request(sampled=True) as req, asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            yield req, runner
    finally:
        propagation.uninstall()


@pytest.mark.parametrize("loop", LOOPS)
def test_loop_callbacks_do_not_nest_under_suspended_coroutines(loop: str, scheduling: str) -> None:
    """A loop callback runs in the context it was scheduled from, the lane of a task whose
    coroutines gave control away by `await` (no hook saw it): it runs with no lane, so
    nothing nests under frames that are not running (anyio's cancellation delivery)."""
    namespace, functions = instrumented(CALLBACKS, "<callbacks>")
    log: list[str] = []
    with recorded_run(loop) as (req, runner):
        assert runner.run(namespace["main"](log)) == 7
    assert log == ["callback ran"] * 4
    recorded = [functions[fid].co_qualname for lane in req.lanes for _, fid, _, _ in lane.events]
    assert "main" in recorded and "waiter" in recorded and "plain_step" not in recorded
    for lane in req.lanes:
        assert_nested(lane.id, lane.events, functions)


# uvloop runs protocol and reader callbacks in the lane they were made in: a ready mark
# from inside one records a suspension that does not nest (docs/limits.md)
NOT_ON_UVLOOP = [
    "asyncio",
    pytest.param(
        "uvloop",
        marks=pytest.mark.xfail(strict=True, reason="no ready mark on uvloop (docs/limits.md)"),
    ),
]


@pytest.mark.parametrize("loop", NOT_ON_UVLOOP)
def test_a_woken_task_is_marked_ready(loop: str, scheduling: str) -> None:
    """The step of a task whose awaited future is done is scheduled through the loop's
    `call_soon`: on either loop its lane learns it is ready from then on."""
    marked: list[recording.Lane] = []
    original = propagation.ready
    propagation.ready = marked.append  # type: ignore[assignment]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        loop.call_soon(future.set_result, None)
        await future

    try:
        with recorded_run(loop) as (req, runner):
            runner.run(main())
    finally:
        propagation.ready = original  # type: ignore[assignment]
    assert req.main in marked


def test_the_patched_methods_stay_the_loop_s_own_with_their_errors(scheduling: str) -> None:
    """While the patches are in, asyncio's methods are the same function objects, with the
    same signatures, their code swapped; a callback's exception, in a sampled lane or not,
    reaches the loop's handler as it does plainly, and a call with the wrong arguments fails
    with the original's message."""
    errors: list[BaseException] = []
    methods = (asyncio.BaseEventLoop.call_soon, asyncio.BaseEventLoop.create_task)
    plain = [(method.__code__, inspect.signature(method)) for method in methods]
    messages: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: errors.append(context["exception"]))
        loop.call_soon(lambda: 1 / 0)
        loop.call_soon(lambda: 1 / 0, context=contextvars.Context())
        with pytest.raises(TypeError) as raised:
            loop.call_soon()  # type: ignore[call-arg]
        messages.append(str(raised.value))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    with recorded_run("asyncio") as (_, runner):
        assert (asyncio.BaseEventLoop.call_soon, asyncio.BaseEventLoop.create_task) == methods
        for method, (code, signature) in zip(methods, plain, strict=True):
            assert method.__code__ is not code and inspect.signature(method) == signature
        runner.run(main())
    assert [type(error) for error in errors] == [ZeroDivisionError] * 4
    assert messages[0] == messages[1]
    assert [method.__code__ for method in methods] == [code for code, _ in plain]


READER = """
import asyncio
import socket

def on_readable(reader, future):
    reader.recv(1)
    future.set_result(7)

async def waiter(future):
    return await future

async def main():
    loop = asyncio.get_running_loop()
    reader, writer = socket.socketpair()
    future = loop.create_future()
    loop.add_reader(reader, on_readable, reader, future)
    writer.send(b"x")
    try:
        return await waiter(future)
    finally:
        loop.remove_reader(reader)
        reader.close()
        writer.close()
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_a_task_woken_by_a_callback_in_its_own_lane_still_nests(loop: str, scheduling: str) -> None:
    """uvloop runs a reader (and a transport's protocol) in the context it was added in,
    the lane of the task that waits, on top of the task's suspended frames: no ready mark
    records their suspension inside that call, where it would not nest (anyio's streams)."""
    namespace, functions = instrumented(READER, "<reader>")
    with recorded_run(loop) as (req, runner):
        assert runner.run(namespace["main"]()) == 7
    recorded = [functions[fid].co_qualname for lane in req.lanes for _, fid, _, _ in lane.events]
    assert "waiter" in recorded
    for lane in req.lanes:
        assert_nested(lane.id, lane.events, functions)


DIRECT_TASKS = """
import asyncio

async def child(n):
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return n

async def parent():
    loop = asyncio.get_running_loop()
    # made without create_task (anyio's task groups do it under the eager task factory):
    # each runs in a copy of parent's context, so in parent's lane
    tasks = [asyncio.Task(child(n), loop=loop) for n in range(3)]
    await asyncio.sleep(0)
    return [await task for task in tasks]

def eager(loop, coro, *, eager_start=None, **kwargs):
    # asyncio's eager_task_factory, which also takes the eager_start uvloop hands a
    # factory on 3.13
    return asyncio.Task(coro, loop=loop, eager_start=True, **kwargs)

async def main(eager_start, follow_loop):
    loop = asyncio.get_running_loop()
    loop.set_task_factory(eager if eager_start else None)
    follow_loop()  # as a request sampled on this loop does (uvloop's tasks get lanes)
    # under the eager factory, parent's first step runs inside create_task, before it
    # returns the task: the tasks it makes there step in its lane first
    return await loop.create_task(parent())
"""
# the eager task factory is 3.12's
FACTORIES = ["default", pytest.param("eager", marks=pytest.mark.skipif(
    sys.version_info < (3, 12), reason="no eager task factory before 3.12"
))]  # fmt: skip


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("factory", FACTORIES)
def test_tasks_made_without_create_task_get_lanes_of_their_own(loop: str, factory: str) -> None:
    """A task built directly (`asyncio.Task(...)`) starts in a copy of its creator's
    context, in the creator's lane: it gets a task lane of its own as its first step is
    scheduled, so the two tasks' calls never interleave in one lane (they did in anyio's
    suite under the eager task factory: exits without an enter, missing exits)."""
    namespace, functions = instrumented(DIRECT_TASKS, "<direct>")
    with recorded_run(loop) as (req, runner):
        main = namespace["main"](factory == "eager", propagation.follow_loop)
        assert runner.run(main) == [0, 1, 2]
    holding: dict[str, list[recording.Lane]] = {}
    for lane in req.lanes:
        assert_nested(lane.id, lane.events, functions)
        names = {functions[fid].co_qualname for kind, fid, _, _ in lane.events if kind == ENTER}
        for name in names:
            holding.setdefault(name, []).append(lane)
    assert [lane.kind for lane in holding["parent"]] == [LaneKind.TASK]
    children = holding["child"]
    assert len(children) == 3 and holding["parent"][0] not in children
    assert all(lane.kind == LaneKind.TASK and lane.done for lane in children)
    entered = [[fid for kind, fid, _, _ in lane.events if kind == ENTER] for lane in children]
    assert all(len(enters) == 1 for enters in entered), entered


def test_requests_still_in_flight_when_the_profiler_stops_are_ended_truncated() -> None:
    """A request the server's shutdown cut (its task cancelled, never finished) goes out
    with what it recorded, marked truncated, instead of waiting on the server for an end
    that never comes."""
    settings = HostSettings.load({"server": "127.0.0.1:9", "code_cache": "off"})
    profiler = runtime.Profiler(settings)
    profiler.started = True
    submitted: list[recording.Request] = []
    profiler.transport.submit = submitted.append  # type: ignore[method-assign]
    request = profiler.begin("/cut", "GET", forced=True)
    profiler.stop()
    assert submitted == [request] and request.truncated and request.end_ns is not None
    assert not hooks.ACTIVE
