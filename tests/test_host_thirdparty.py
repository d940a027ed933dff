"""Other people's code, instrumented: the test suites of pure-Python packages we did not
write, of different kinds, each run plainly and then twice under `profiler-host run
--whole-process true --propagate true` with the whole package instrumented and every call
recorded (one sampled request, carried into every thread, task and pool work the tests
start):

- instrumented (`test_suite_passes_instrumented`): every test that passes plainly passes;
  the host rewrote every module of the package afresh (a code cache of its own, empty at
  the start) and left nothing uninstrumented by an error, not one module loaded past its
  import hook (its counters and the live functions, read inside the run by
  `tests/thirdparty/request_profiler_probe.py`, and its log on stderr); the server shows
  the package's functions recorded, counted by name (a run that instruments nothing fails);
  for the suites whose tests start threads, lanes of their own that hold the package's
  calls (the request crossed into the threads);
- traced (`test_suite_passes_traced_under_debug_malloc`): the same under
  `PYTHONMALLOC=debug` with coverage.py's C tracer set from the process's start (`coverage
  run -m pytest`). CPython builds a code object's per-instruction line array from its line
  table at the first trace event on it, so a rewritten code object whose tables disagree
  with its code makes it write past the buffer, which the debug allocator turns into an
  abort; the process must end as plainly, with the same tests passing.

The sdists come from PyPI (`pip download`, pinned), and the wheels their tests import
that this venv lacks are installed beside them (`pip install --target`, pinned, nothing
resolved), into a cache directory (`$REQUEST_PROFILER_SDIST_CACHE`, default
`~/.cache/request-profiler/sdists`), so a second run needs no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
from coverage import CoverageData
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine

from profiler_core.model import LaneKind
from profiler_server.storage import queries
from tests.helpers import eventually, stored_requests
from tests.processes import ServerProcess

pytestmark = pytest.mark.slow

CACHE = Path(
    os.environ.get("REQUEST_PROFILER_SDIST_CACHE")
    or Path.home() / ".cache" / "request-profiler" / "sdists"
)
PROBE_DIR = Path(__file__).resolve().parent / "thirdparty"
EVENT_CAP = "100000000"  # never truncate: the sampled path must run to the end
RUN_TIMEOUT = 600
# The instrumenter's counters that the probe reads count work done; every other one (code
# left uninstrumented by an error: a rewrite that raised, or whose result failed
# validation; and the hooks' own failures) must stay zero, whatever it is named.
WORK_COUNTERS = ("functions_instrumented",)
# The share of rewritten code objects that may outlive the traced run's release (held by a
# generator suspended for good, say): the debug allocator checks only what is freed.
MAY_OUTLIVE_RELEASE = 0.05


@dataclass(frozen=True)
class Suite:
    dist: str  # PyPI name
    version: str
    package: str  # import name; `package.*` is instrumented
    args: tuple[str, ...]  # pytest arguments inside the unpacked sdist
    called: tuple[str, ...]  # functions (module:qualname) its tests certainly call
    min_functions: int  # distinct functions of the package recorded at least
    min_calls: int  # calls recorded at least
    src: str = "."  # the directory of the package inside the sdist
    # wheels its tests import that the venv lacks: pinned, every one (no dependency is
    # resolved), installed beside the sdist
    deps: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # more environment for its runs
    min_passed: int = 100  # tests passing plainly at least
    # lanes of kind thread or executor in which the package's functions were recorded
    min_thread_lanes: int = 0
    # the test files the traced run takes in place of the directory argument they are in
    # (empty: the whole suite), where the suite is long: the instrumented run takes it all
    traced_files: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.dist}-{self.version}"


# Each test here runs more than 700,000 calls of the package (more than the rest of its
# suite together): recorded, they alone would take minutes. The two concurrency tests are
# recorded since their threads inherit the request (10**5 items through 100 threads: 10M
# calls).
MORE_ITERTOOLS_HEAVY = (
    "tests/test_more.py::TestConcurrentTee::test_concurrent_consumers",
    "tests/test_more.py::TestSerialize::test_concurrent_calls",
    "tests/test_recipes.py::PrimeFunctionTests::test_primes",
    "tests/test_recipes.py::PrimeFunctionTests::test_nth_prime_approximate",
    "tests/test_recipes.py::PrimeFunctionTests::test_nth_prime_tightened_bound",
    "tests/test_recipes.py::PolynomialFromRootsTests::test_large",
    "tests/test_recipes.py::FactorTests::test_cross_check",
    "tests/test_more.py::DiscreteFourierTransformTests::test_roundtrip",
    "tests/test_more.py::TestRandomOrderedRange::test_lcg_mitigation",
)
# Measures the process's traced allocations: the recorded events are allocations too.
MORE_ITERTOOLS_MEASURES_THE_PROFILER = (
    "tests/test_more.py::SeekableTest::test_repeated_zero_cache_peek_has_bounded_memory",
)

# anyio's own addopts name its pytest plugin by entry point, which plugin autoloading (off
# here, so that nothing of this venv loads) would find: the plugins are named as modules.
ANYIO_PLUGINS = (
    *("-o", "addopts=", "-p", "anyio.pytest_plugin", "-p", "pytest_mock", "-p", "timeout"),
    *("--strict-config", "--strict-markers"),
)
ANYIO_LEFT_OUT = (
    # loopback sockets under deadlines (happy eyeballs' delays, resets) and IPv6, which
    # this machine may lack: timing and network, not the package
    "--ignore=tests/test_sockets.py",
    # what a fresh interpreter imports: a profiled one has imported the host first
    "--ignore=tests/test_lazyimport.py",
    # Python worker processes, each of which would start a host and stream a request
    "--ignore=tests/test_to_process.py",
    "--ignore=tests/test_subprocesses.py",
    # counts the process's live threads before and after: a portal thread of an earlier
    # round may still be ending in between (it fails plainly too, now and then)
    "--deselect=tests/test_to_thread.py::TestBlockingPortalProvider::test_single_thread",
    # counts the process's live threads around five calls: the host's stream threads (gRPC's
    # two and its ack reader) start or end in between whenever the stream opens or closes
    # (docs/limits.md, threads)
    "--deselect=tests/test_from_thread.py::TestRunAsyncFromThread::test_run_sync_from_thread_pooling",
    # collect garbage right after the work's result arrives (or `anyio.run` returns) and
    # expect no other referrer of the work, its arguments, its context's values or the
    # loop, while anyio's worker thread, which holds them until it takes the next item or
    # exits, may still be ending: a race an instrumented (slower) worker thread loses now
    # and then (tests/test_host_propagation.py checks what the host itself keeps)
    "--deselect=tests/test_to_thread.py::test_asyncio_run_does_not_leak_event_loop",
    "--deselect=tests/test_to_thread.py::test_run_sync_worker_cyclic_references",
    # pytest subprocesses under a 3 s timeout: a profiled child instruments anyio first,
    # which a loaded machine (or the debug allocator) can push past it, and the killed
    # child's stream dies
    "--deselect=tests/test_pytest_plugin.py::test_dynamic_async_fixture_access_does_not_hang",
    "--deselect=tests/test_pytest_plugin.py::test_keyboardinterrupt_during_test",
)

SUITES = (
    Suite(  # generators everywhere: peekable, seekable, windowed, chunked, recipes
        "more-itertools",
        "11.2.1",
        "more_itertools",
        (
            "tests",
            *(f"--deselect={t}" for t in MORE_ITERTOOLS_HEAVY),
            *(f"--deselect={t}" for t in MORE_ITERTOOLS_MEASURES_THE_PROFILER),
        ),
        ("more_itertools.more:peekable.__next__", "more_itertools.recipes:take"),
        min_functions=250,
        min_calls=50_000,
        min_thread_lanes=30,  # tee and serialize across threads, pools
    ),
    Suite(  # closures and callables: curry (a descriptor), compose, juxt, memoize
        "toolz",
        "1.2.0",
        "toolz",
        ("toolz",),
        ("toolz.functoolz:curry.__call__", "toolz.itertoolz:groupby"),
        min_functions=150,
        min_calls=15_000,
    ),
    Suite(  # descriptors, caches, class and dict machinery, plus the modules' doctests
        "boltons",
        "26.2.0",
        "boltons",
        (
            "--doctest-modules",
            "boltons",
            "tests",
            # sends a large message against a 10 ms socket timeout: a timing test, which
            # recording every call (100% sampled) can push past its deadline
            "--deselect=tests/test_socketutils.py::test_socketutils_netstring",
        ),
        ("boltons.cacheutils:LRI.__getitem__", "boltons.dictutils:OrderedMultiDict.add"),
        min_functions=550,
        min_calls=300_000,
        min_thread_lanes=5,  # funcutils across threads, socketutils' servers
    ),
    Suite(  # async generators, coroutines, aclose/athrow, an event loop of its own
        "asyncstdlib",
        "3.14.0",
        "asyncstdlib",
        ("unittests",),
        ("asyncstdlib.builtins:zip", "asyncstdlib.itertools:Tee.__init__"),
        min_functions=150,
        min_calls=150_000,
    ),
    Suite(  # threads and event loops driving each other: to_thread, from_thread, portals,
        # task groups and cancel scopes, memory streams, locks across threads
        "anyio",
        "4.16.0",
        "anyio",
        (*ANYIO_PLUGINS, "tests", *ANYIO_LEFT_OUT),
        ("anyio.to_thread:run_sync", "anyio.from_thread:run"),
        min_functions=450,
        min_calls=100_000,
        src="src",
        deps=(
            "pytest-mock==3.17.0",
            "pytest-timeout==2.4.0",  # its configuration sets a timeout
            "sniffio==1.3.1",  # optional to anyio; its thread detection runs on it then
            "trustme==1.2.1",  # the conftest's TLS fixtures
            "cryptography==50.0.2",
            "cffi==2.1.1",
            "pycparser==3.12",
        ),
        min_passed=700,
        min_thread_lanes=20,
        traced_files=(  # threads, locks, streams, files: all but task groups' many cases
            "tests/test_to_thread.py",
            "tests/test_from_thread.py",
            "tests/test_synchronization.py",
            "tests/test_fileio.py",
            "tests/test_functools.py",
            "tests/test_lowlevel.py",
            "tests/test_contextmanagers.py",
            "tests/test_eventloop.py",
            "tests/test_futures.py",
            "tests/test_concurrency_utils.py",
            "tests/test_debugging.py",
            "tests/test_tempfile.py",
            "tests/streams/test_memory.py",
            "tests/streams/test_buffered.py",
            "tests/streams/test_text.py",
            "tests/streams/test_stapled.py",
            "tests/streams/test_file.py",
        ),
    ),
    Suite(  # a pytest plugin (a pytest11 entry point) whose own tests run through it
        "pytest-mock",
        "3.17.0",
        "pytest_mock",
        ("tests",),
        (
            "pytest_mock.plugin:MockerFixture.spy",
            "pytest_mock.plugin:MockerFixture._Patcher.object",
        ),
        min_functions=25,
        min_calls=200,
        src="src",
        deps=("pytest-asyncio==1.5.0",),
        # loaded as an installed plugin is (pytest imports it by name and marks the package
        # for its assertion rewriter), in this process and in the pytest processes its
        # tests start
        env=(("PYTEST_PLUGINS", "pytest_mock,pytest_asyncio.plugin"),),
        min_passed=150,
    ),
    Suite(  # classes written for you: code generated per class (__init__, __eq__, ...),
        # descriptors, slots, validators and converters, Hypothesis-driven
        "attrs",
        "26.1.0",
        "attr",
        ("-p", "steady_hypothesis", "tests"),
        ("attr._make:_ClassBuilder.build_class", "attr._make:_transform_attrs"),
        min_functions=170,
        min_calls=250_000,
        src="src",
        deps=("hypothesis==6.170.17", "sortedcontainers==2.4.0", "cloudpickle==3.1.3"),
        min_passed=1200,
    ),
    Suite(  # text: a lexer, a parser, a compiler to Python source, sync and async rendering
        "jinja2",
        "3.1.6",
        "jinja2",
        ("tests",),
        ("jinja2.lexer:Lexer.tokeniter", "jinja2.compiler:CodeGenerator.visit_Template"),
        min_functions=600,
        min_calls=800_000,
        src="src",
        deps=(  # trio for the async tests
            "trio==0.35.0",
            "outcome==1.3.0.post0",
            "sniffio==1.3.1",
            "sortedcontainers==2.4.0",
        ),
        min_passed=800,
    ),
)


@contextmanager
def _staged() -> Iterator[Path]:
    """An empty directory in the cache to fill, then move into place whole: a run killed
    half way leaves no half entry, and the suites of other versions may fill the cache at
    the same time. Removed afterwards."""
    CACHE.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".staged-", dir=CACHE))
    try:
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, timeout=RUN_TIMEOUT)


def sdist(suite: Suite) -> Path:
    """The pinned sdist from the cache, fetched from PyPI on first use."""
    name = f"{re.sub(r'[-_.]+', '_', suite.dist).lower()}-{suite.version}.tar.gz"
    cached = CACHE / name
    if not cached.exists():
        with _staged() as staged:
            _pip(
                "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                "--dest", str(staged), f"{suite.dist}=={suite.version}",
            )  # fmt: skip
            assert (staged / name).exists(), f"pip download did not leave {name} in {staged}"
            (staged / name).replace(cached)
    return cached


def dependencies(suite: Suite) -> list[str]:
    """The directory of the suite's pinned wheels, installed into the cache on first use,
    one per interpreter version (a wheel may be compiled for one: hypothesis, cryptography)."""
    if not suite.deps:
        return []
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = hashlib.sha256("\n".join([version, *sorted(suite.deps)]).encode()).hexdigest()[:12]
    target = CACHE / f"deps-{suite.dist}-{key}"
    if not target.exists():
        with _staged() as staged:
            _pip(
                "install", "--quiet", "--no-deps", "--only-binary", ":all:",
                "--target", str(staged), *suite.deps,
            )  # fmt: skip
            staged.rename(target)
    return [str(target)]


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    (top,) = dest.iterdir()
    return top


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed/failed/skipped; a test with any failing part (subtests) failed."""
    found: dict[str, str] = {}
    if not junit.exists():  # the process died before pytest wrote it
        return found
    for case in ET.parse(junit).iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            found[key] = "failed"
        elif found.get(key) != "failed":
            found[key] = "skipped" if case.find("skipped") is not None else "passed"
    return found


@dataclass(frozen=True)
class Checkout:
    """An unpacked suite and what passed in its plain run."""

    suite: Suite
    source: Path  # the unpacked sdist: each run's working directory
    path: tuple[str, ...]  # PYTHONPATH entries its runs need
    passed: frozenset[str]

    def narrowed(self, files: tuple[str, ...]) -> Checkout:
        """The suite's tests in `files` alone (every one: no files), with what passed of
        them plainly."""
        if not files:
            return self
        modules = tuple(file.removesuffix(".py").replace("/", ".") for file in files)
        folders = {file.split("/")[0] for file in files}
        args = [a for a in self.suite.args if a not in folders]
        assert len(args) == len(self.suite.args) - len(folders), (self.suite.args, files)
        suite = replace(self.suite, args=(*args, *files))
        passed = {t for t in self.passed if t.split("::")[0].startswith(modules)}
        return replace(self, suite=suite, passed=frozenset(passed))

    def run(
        self,
        junit: Path,
        host: list[str] | None = None,
        runner: tuple[str, ...] = ("-m", "pytest"),
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """The suite against the unpacked sources (not an installed copy), plugins pinned:
        nothing autoloaded from this venv, no addopts from the caller's environment. A
        host run loads the probe first."""
        probe = ("-p", "request_profiler_probe") if host else ()
        path = [*self.path, str(PROBE_DIR), os.environ.get("PYTHONPATH")]
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, path)),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            **dict(self.suite.env),
            **(env or {}),
        }
        full_env.pop("PYTEST_ADDOPTS", None)
        command = [
            *(host or []), sys.executable, *runner, "-q", "-p", "no:cacheprovider",
            f"--junitxml={junit}", *probe, *self.suite.args,
        ]  # fmt: skip
        return subprocess.run(
            command,
            cwd=self.source,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Suite], Checkout]:
    """Unpacks a suite and runs it plainly, once per module."""
    done: dict[Suite, Checkout] = {}

    def prepare(suite: Suite) -> Checkout:
        if suite not in done:
            where = tmp_path_factory.mktemp(suite.dist)
            source = unpack(sdist(suite), where / "src")
            path = (str(source / suite.src), *dependencies(suite))
            bare = Checkout(suite, source, path, frozenset())
            plain = bare.run(where / "plain.xml")
            passed = {t for t, o in outcomes(where / "plain.xml").items() if o == "passed"}
            assert len(passed) >= suite.min_passed, plain.stdout[-3000:] + plain.stderr[-3000:]
            done[suite] = Checkout(suite, source, path, frozenset(passed))
        return done[suite]

    return prepare


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own per run: what it counts (repairs, streams that died) is that
    run's alone, not a child process of the suite before it ending late."""
    where = tmp_path_factory.mktemp("thirdparty-server")
    proc = ServerProcess(
        f"sqlite:///{where / 'profiles.db'}",
        where / "server.log",
        "--max-request-events", EVENT_CAP, "--max-open-events", EVENT_CAP,
    )  # fmt: skip
    proc.db_url = f"sqlite:///{where / 'profiles.db'}"  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop(grace=10)


def host_command(server: ServerProcess, service: str, suite: Suite, *options: str) -> list[str]:
    return [
        sys.executable, "-m", "profiler_host", "run", "--server", server.target,
        "--service", service, "--include", f"{suite.package}.*",
        "--whole-process", "true", "--propagate", "true", "--max-request-events", EVENT_CAP,
        "--flush-timeout", "60s", *options, "--",
    ]  # fmt: skip


def of_package(function: str, package: str) -> bool:
    """`function` (module:qualname) is defined in `package`; a lane's name is no function."""
    module, colon, _ = function.partition(":")
    return bool(colon) and module.split(".")[0] == package


def repairs(server: ServerProcess) -> Counter[str]:
    """What the server repaired or rejected so far, by reason (all services)."""
    text = httpx.get(server.http + "/metrics", timeout=30).text
    found: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "profiler_ingest_rejected_total":
                found[sample.labels["reason"]] += int(sample.value)
    return found


def check_run(
    checkout: Checkout,
    repaired_before: Counter[str],
    done: subprocess.CompletedProcess,
    junit: Path,
    probe: Path,
    server: ServerProcess,
    service: str,
) -> tuple[dict, dict]:
    """What both host runs prove; returns the probe's report and the main request."""
    suite = checkout.suite
    after = outcomes(junit)
    broken = sorted(t for t in checkout.passed if after.get(t) != "passed")
    assert done.returncode >= 0, (done.returncode, done.stderr[-5000:])
    assert not broken, (broken[:20], done.stdout[-5000:], done.stderr[-2000:])
    # the host says nothing (a warning, a hook's failure, a thread's traceback) where all
    # goes well; the cache's path, in the suites' own warnings, is not the host speaking
    stderr = done.stderr.replace(str(CACHE), "$CACHE")
    assert "request-profiler" not in stderr, stderr[-3000:]

    report = json.loads(probe.read_text())
    counters = report["instrumenter"]
    assert {"failures", "hook_errors", *WORK_COUNTERS} <= set(counters), counters
    failed = {name: n for name, n in counters.items() if n and name not in WORK_COUNTERS}
    assert not failed, counters
    assert counters["functions_instrumented"] >= suite.min_functions, counters
    # a module of the package whose functions all run their original code was loaded past
    # the import hook (or every rewrite of it failed)
    passed_by = {
        name: module
        for name, module in report["modules"].items()
        if module["functions"] and not module["instrumented"]
    }
    assert passed_by == {}
    assert report["tests"]["sampled"] == report["tests"]["run"] > 0, report["tests"]

    # the Python processes its tests start stream requests of their own
    requests = eventually(lambda: stored_requests(server.http, service=service), 60)
    assert requests, f"nothing stored for {service}"
    main = max(requests, key=lambda r: r["calls"])
    truncated = [r for r in requests if r["truncated"]]
    made = repairs(server) - repaired_before
    assert not truncated, (truncated, made)
    assert not made, made
    assert main["calls"] >= suite.min_calls, main
    functions = httpx.get(
        f"{server.http}/api/functions", params={"service": service}, timeout=30
    ).json()["functions"]
    calls = {f["function"]: f["calls"] for f in functions}
    ours = [name for name in calls if of_package(name, suite.package)]
    assert len(ours) >= suite.min_functions, len(ours)
    assert len(ours) == len(calls), sorted(set(calls) - set(ours))[:20]
    missing = [name for name in suite.called if not calls.get(name)]
    assert not missing, (missing, sorted(ours)[:50])
    return report, main


def lanes_holding(db_url: str, request_id: str, package: str) -> Counter[str]:
    """Lanes of the stored request, by kind, in which a function of `package` was recorded
    (a lane's synthetic root, named after the lane, does not count)."""
    engine = create_engine(db_url)
    try:
        found = queries.get_request(engine, request_id)
    finally:
        engine.dispose()
    assert found is not None, request_id
    tree = found[1]
    lane_of = [-1] * len(tree.parent)
    for n, lane in enumerate(tree.lanes):
        lane_of[lane.root] = n
    ours = [of_package(name, package) for name in tree.functions]
    holding: set[int] = set()
    for node, function in enumerate(tree.function):
        if tree.parent[node] < 0 or not ours[function]:
            continue
        path, up = [], node
        while lane_of[up] < 0:
            path.append(up)
            up = tree.parent[up]
        for n in path:
            lane_of[n] = lane_of[up]
        holding.add(lane_of[up])
    return Counter(LaneKind(tree.lanes[n].kind).label for n in holding)


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: s.id)
def test_suite_passes_instrumented(
    suite: Suite, checkout: Callable[[Suite], Checkout], server: ServerProcess, tmp_path: Path
):
    """Plain outcomes kept, every module rewritten afresh (an empty code cache) and
    recorded, the request carried into the threads the tests start."""
    prepared = checkout(suite)
    service = f"thirdparty-{suite.dist}"
    host = host_command(server, service, suite, "--code-cache", str(tmp_path / "code-cache"))
    probe = tmp_path / "probe.json"
    before = repairs(server)
    done = prepared.run(
        tmp_path / "instrumented.xml", host, env={"REQUEST_PROFILER_PROBE": str(probe)}
    )
    junit = tmp_path / "instrumented.xml"
    _, main = check_run(prepared, before, done, junit, probe, server, service)
    if suite.min_thread_lanes:
        lanes = lanes_holding(server.db_url, main["id"], suite.package)  # type: ignore[attr-defined]
        assert lanes["thread"] + lanes["executor"] >= suite.min_thread_lanes, lanes


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: s.id)
def test_suite_passes_traced_under_debug_malloc(
    suite: Suite, checkout: Callable[[Suite], Checkout], server: ServerProcess, tmp_path: Path
):
    """Plain outcomes kept with a tracer on every instrumented frame and the debug
    allocator checking every block it frees: no abort, nothing left uninstrumented."""
    traced_run(checkout(suite).narrowed(suite.traced_files), server, tmp_path)


def traced_run(prepared: Checkout, server: ServerProcess, tmp_path: Path) -> None:
    """The suite under `PYTHONMALLOC=debug` and coverage's C tracer, instrumented.

    How we know it executes the instrumented, recording path with the tracer set: the host
    samples nothing new while `sys.gettrace()` is set, but a whole-process request is begun
    (forced) in sitecustomize, before coverage sets its tracer, and stays open to the end;
    the probe counts the test calls that ran with the tracer set *and* the gate open with
    that request's lane current (every one, asserted), coverage's data shows it traced the
    package's files, and the server stores the package's calls under this run's service.
    How we know a damaged line array would be seen: the probe frees every rewritten code
    object before the process exits (see the probe), and the debug allocator checks each
    block it frees; the share of them that outlived the release is bounded below.
    """
    suite = prepared.suite
    service = f"thirdparty-traced-{suite.dist}"
    # rewritten again in this process (no code cache), under the debug allocator
    host = host_command(server, service, suite, "--code-cache", "off")
    probe = tmp_path / "probe.json"
    data = tmp_path / "coverage.data"
    rc = tmp_path / "coveragerc"  # not the sdist's own configuration
    rc.write_text(f"[run]\ndata_file = {data}\n")
    runner = ("-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest")
    env = {
        "REQUEST_PROFILER_PROBE": str(probe),
        "REQUEST_PROFILER_PROBE_RELEASE": "1",
        "PYTHONMALLOC": "debug",
        "COVERAGE_CORE": "ctrace",  # the C tracer, sys.settrace's: line events on 3.11
    }
    before = repairs(server)
    done = prepared.run(tmp_path / "traced.xml", host, runner, env)
    assert "Debug memory block" not in done.stderr, done.stderr[-5000:]
    assert "Fatal Python error" not in done.stderr, done.stderr[-5000:]
    report, _ = check_run(prepared, before, done, tmp_path / "traced.xml", probe, server, service)
    assert report["tests"]["traced_and_sampled"] == report["tests"]["run"], report
    assert report["tracers"] == ["CTracer"], report["tracers"]
    released = report["released"]
    assert released["alive"] <= released["rewritten"] * MAY_OUTLIVE_RELEASE, released
    covered = CoverageData(basename=str(data))
    covered.read()
    package = str(prepared.source / suite.src / suite.package)
    traced = [f for f in covered.measured_files() if f.startswith(package + os.sep)]
    assert traced, sorted(covered.measured_files())[:20]
