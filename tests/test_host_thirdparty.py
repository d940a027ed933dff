"""Other people's code, instrumented: the test suites of pure-Python packages we did not
write, each run plainly and under `profiler-host run --whole-process true` with the whole
package instrumented and every call recorded. Every test that passes plainly must pass
instrumented, and the server must show that the package's functions really were recorded
(a run that instruments nothing would pass too).

The sdists come from PyPI (`pip download`, pinned) into a cache directory
(`$REQUEST_PROFILER_SDIST_CACHE`, default `~/.cache/request-profiler/sdists`), so a
second run needs no network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.helpers import eventually, stored_requests
from tests.processes import ServerProcess

pytestmark = pytest.mark.slow

CACHE = Path(
    os.environ.get("REQUEST_PROFILER_SDIST_CACHE")
    or Path.home() / ".cache" / "request-profiler" / "sdists"
)
EVENT_CAP = "100000000"  # never truncate: the sampled path must run to the end
RUN_TIMEOUT = 300


@dataclass(frozen=True)
class Suite:
    dist: str  # PyPI name
    version: str
    package: str  # import name; `package.*` is instrumented
    args: tuple[str, ...]  # pytest arguments inside the unpacked sdist
    called: tuple[str, ...]  # functions (module:qualname) its tests certainly call
    min_functions: int  # distinct functions of the package recorded at least
    min_calls: int  # calls recorded at least
    # the server had to repair nothing (no call left open, no exit without its enter)
    complete: bool = True

    @property
    def service(self) -> str:
        return f"thirdparty-{self.dist}"


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
)


def sdist(suite: Suite) -> Path:
    """The pinned sdist from the cache, fetched from PyPI on first use."""
    name = f"{re.sub(r'[-_.]+', '_', suite.dist).lower()}-{suite.version}.tar.gz"
    cached = CACHE / name
    if cached.exists():
        return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:",
            "--no-deps", "--dest", str(CACHE), f"{suite.dist}=={suite.version}",
        ],
        check=True,
        timeout=RUN_TIMEOUT,
    )  # fmt: skip
    assert cached.exists(), f"pip download did not leave {name} in {CACHE}"
    return cached


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    (top,) = dest.iterdir()
    return top


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed/failed/skipped; a test with any failing part (subtests) failed."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            found[key] = "failed"
        elif found.get(key) != "failed":
            found[key] = "skipped" if case.find("skipped") is not None else "passed"
    return found


def run_suite(
    suite: Suite, source: Path, junit: Path, prefix: list[str]
) -> subprocess.CompletedProcess:
    """The suite against the unpacked sources (not an installed copy), plugins pinned:
    nothing autoloaded from this venv, no addopts from the caller's environment."""
    path = os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    command = [
        *prefix, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        f"--junitxml={junit}", *suite.args,
    ]  # fmt: skip
    return subprocess.run(
        command, cwd=source, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    where = tmp_path_factory.mktemp("thirdparty-server")
    proc = ServerProcess(
        f"sqlite:///{where / 'profiles.db'}",
        where / "server.log",
        "--max-request-events", EVENT_CAP, "--max-open-events", EVENT_CAP,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.stop(grace=10)


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: f"{s.dist}-{s.version}")
def test_suite_passes_instrumented(suite: Suite, server: ServerProcess, tmp_path: Path):
    source = unpack(sdist(suite), tmp_path / "src")
    plain = run_suite(suite, source, tmp_path / "plain.xml", [])
    passed = {t for t, o in outcomes(tmp_path / "plain.xml").items() if o == "passed"}
    assert len(passed) > 100, plain.stdout[-3000:]

    host = [
        sys.executable, "-m", "profiler_host", "run", "--server", server.target,
        "--service", suite.service, "--include", f"{suite.package}.*",
        "--whole-process", "true", "--max-request-events", EVENT_CAP,
        "--flush-timeout", "60s", "--",
    ]  # fmt: skip
    instrumented = run_suite(suite, source, tmp_path / "instrumented.xml", host)
    after = outcomes(tmp_path / "instrumented.xml")
    broken = sorted(t for t in passed if after.get(t) != "passed")
    assert not broken, (broken[:20], instrumented.stdout[-5000:])
    assert "request-profiler" not in instrumented.stderr, instrumented.stderr[-3000:]

    (request,) = eventually(lambda: stored_requests(server.http, service=suite.service), 60)
    if suite.complete:
        assert request["truncated"] is False
    assert request["calls"] >= suite.min_calls, request
    functions = httpx.get(
        f"{server.http}/api/functions", params={"service": suite.service}, timeout=30
    ).json()["functions"]
    calls = {f["function"]: f["calls"] for f in functions}
    ours = [name for name in calls if name.partition(":")[0].split(".")[0] == suite.package]
    assert len(ours) >= suite.min_functions, len(ours)
    assert len(ours) == len(calls), sorted(set(calls) - set(ours))[:20]
    missing = [name for name in suite.called if not calls.get(name)]
    assert not missing, (missing, sorted(ours)[:50])
