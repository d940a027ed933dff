"""Coverage coexists with the host: coverage.py reports the same lines (and branches) of an
instrumented program as of the plain one, with its C tracer (`ctrace`) and, from 3.12, with
its `sys.monitoring` core (`sysmon`). The instrumented run goes through both copies of each
function: the original behind the closed gate, and the instrumented copy in a request forced
past sampling (which a watched process otherwise skips)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import asyncio


class Basket:
    def __init__(self, prices):
        self.prices = list(prices)

    def total(self, discount=0):
        if not self.prices:
            return 0
        subtotal = sum(price for price in self.prices)
        return subtotal - discount if discount < subtotal else 0


def parse(text):
    try:
        return int(text)
    except ValueError:
        return None
    finally:
        pass


def countdown(n):
    while n > 0:
        yield n
        n -= 1


def chained(n):
    yield from countdown(n)
    return "done"


async def fetch(delay):
    await asyncio.sleep(delay)
    return [value * 2 for value in range(3) if value]


async def gather():
    first, second = await asyncio.gather(fetch(0), fetch(0))
    return first + second


def never_called():
    return "unreached"


def main():
    results = [Basket([3, 4]).total(1), Basket([]).total(), parse("12"), parse("x")]
    results.append(list(chained(3)))
    results.append(asyncio.run(gather()))
    results.append(sorted(map(lambda x: -x, [1, 2])))
    with open(__file__) as source:
        results.append(bool(source.readline()))
    return results
"""

PLAIN = """
import covered

print(covered.main() == covered.main())
"""

INSTRUMENTED = """
import profiler_host
from profiler_host import gates, hooks, recording

profiler_host.start(server="127.0.0.1:9", include=["covered"], code_cache="off")
import covered

assert gates.gated(covered.main.__code__), "not instrumented"
unsampled = covered.main()  # the original instructions behind the closed gate
with profiler_host.profile_request("coverage", force=True):  # the instrumented copy
    sampled = covered.main()
    assert recording.CURRENT.get().buffer, "the instrumented copy recorded nothing"
profiler_host.stop()
print(unsampled == sampled)
"""

CORES = ["ctrace"] + (["sysmon"] if sys.version_info >= (3, 12) else [])
# coverage measures branches with sys.monitoring from 3.14 on only
BRANCH = {"ctrace": [False, True], "sysmon": [False]}
CHECK_CORE = """
import sys
monitoring = getattr(sys, "monitoring", None)
in_use = monitoring is not None and any(monitoring.get_tool(i) for i in range(6))
print({"ctrace": sys.gettrace() is not None and not in_use,
       "sysmon": sys.gettrace() is None and in_use}[%r])
"""


def _coverage(tmp_path: Path, name: str, driver: str, core: str, branch: bool) -> dict:
    """coverage.py's JSON report of `covered.py` after running `driver` under `core`."""
    run = tmp_path / name
    run.mkdir()
    (run / "covered.py").write_text(textwrap.dedent(PROGRAM))
    (run / "driver.py").write_text(CHECK_CORE % core + driver)
    env = {
        **os.environ,
        "COVERAGE_CORE": core,
        "COVERAGE_FILE": str(run / ".coverage"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(run)]),
    }
    env.pop("PROFILER_PURE_PYTHON", None)
    options = ["--branch"] if branch else []
    done = subprocess.run(
        [sys.executable, "-m", "coverage", "run", *options, "--include=*/covered.py", "driver.py"],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr  # core; results
    assert "CoverageWarning" not in done.stderr, done.stderr
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", "-o", "report.json"],
        cwd=run,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    files = json.loads((run / "report.json").read_text())["files"]
    assert list(files) == ["covered.py"]
    report = files["covered.py"]
    return {
        key: report[key]
        for key in ("executed_lines", "missing_lines", "executed_branches", "missing_branches")
        if key in report
    }


@pytest.mark.parametrize(
    ("core", "branch"), [(core, branch) for core in CORES for branch in BRANCH[core]]
)
def test_coverage_reports_instrumented_code_as_plain_code(
    tmp_path: Path, core: str, branch: bool
) -> None:
    plain = _coverage(tmp_path, "plain", PLAIN, core, branch)
    instrumented = _coverage(tmp_path, "instrumented", INSTRUMENTED, core, branch)
    assert plain["missing_lines"], "the program has a line it never runs: a report can differ"
    assert instrumented == plain
