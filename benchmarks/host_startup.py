"""Start-up cost of instrumentation: importing a package of a few thousand functions plainly,
instrumented with an empty code cache (every function rewritten) and with a warm one.

Each import runs in a fresh interpreter (so nothing is imported yet) on warm `.pyc` files;
the three setups are interleaved round by round and compared by median.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from benchmarks.results import save, table

PACKAGE = "startup_bench_pkg"
FUNCTIONS_PER_MODULE = 100

MODULE = """
import functools


def helper_{n}_{i}(values, factor=2):
    total = 0
    for value in values:
        if value % 3 == 0:
            total += value * factor
        else:
            total -= value
    return total


def make_adder_{n}_{i}(step):
    def add(x):
        return x + step
    return add


def numbers_{n}_{i}(limit):
    for i in range(limit):
        yield i * i


class Model_{n}_{i}:
    def __init__(self, name):
        self.name = name

    @property
    def label(self):
        return self.name.upper()

    @functools.lru_cache(maxsize=None)
    def cost(self, quantity):
        return quantity * 3

    @staticmethod
    def parse(text):
        return text.strip().split(",")

    @classmethod
    def build(cls, name):
        return cls(name)
"""  # 10 function code objects per block: helper, make_adder, add, numbers, 6 in the class


def write_package(root: Path, functions: int) -> int:
    """The package under `root`; returns how many function code objects it holds."""
    package = root / PACKAGE
    package.mkdir(parents=True)
    blocks = FUNCTIONS_PER_MODULE // 10
    modules = max(1, functions // FUNCTIONS_PER_MODULE)
    for n in range(modules):
        source = "".join(MODULE.format(n=n, i=i) for i in range(blocks))
        (package / f"m{n}.py").write_text(textwrap.dedent(source))
    imports = "".join(f"from {PACKAGE} import m{n}\n" for n in range(modules))
    (package / "__init__.py").write_text(imports)
    return modules * blocks * 10


SNIPPET = """
import sys, time
sys.path.insert(0, {root!r})
if {instrumented!r}:
    import profiler_host
    profiler_host.start(include="{package}.*", code_cache={cache!r}, sample_rate="0",
                        server="127.0.0.1:9")
started = time.perf_counter()
import {package}
print(time.perf_counter() - started)
"""


def _import_seconds(root: Path, instrumented: bool, cache: str) -> float:
    code = SNIPPET.format(root=str(root), instrumented=instrumented, cache=cache, package=PACKAGE)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def run(functions: int = 3000, rounds: int = 9) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "src"
        count = write_package(root, functions)
        cache = Path(tmp) / "cache"
        _import_seconds(root, False, "off")  # writes the .pyc files
        times: dict[str, list[float]] = {"plain": [], "cold": [], "warm": []}
        for round_no in range(rounds):
            times["plain"].append(_import_seconds(root, False, "off"))
            cold_cache = Path(tmp) / f"cold{round_no}"  # empty: every function is rewritten
            times["cold"].append(_import_seconds(root, True, str(cold_cache)))
            if round_no == 0:
                _import_seconds(root, True, str(cache))  # fills the warm cache
            times["warm"].append(_import_seconds(root, True, str(cache)))
    medians = {name: statistics.median(values) for name, values in times.items()}
    plain = medians["plain"]
    rows = [
        [
            name,
            f"{medians[name] * 1000:.1f}",
            f"{min(v) * 1000:.1f}-{max(v) * 1000:.1f}",
            f"{medians[name] / plain:.2f}",
        ]
        for name, v in times.items()
    ]
    print(f"import of a package of {count} functions, {rounds} interleaved rounds")
    print(table(["setup", "median ms", "range ms", "vs plain"], rows))
    per_function_us = (medians["cold"] - plain) / count * 1e6
    print(f"rewrite cost per function (cold - plain): {per_function_us:.0f} us")
    warm_ratio = medians["warm"] / plain
    print(f"warm start: {warm_ratio:.2f}x plain ({'meets' if warm_ratio <= 2 else 'ABOVE'} <= 2x)")
    path = save(
        "host-startup",
        {
            "functions": count,
            "rounds": rounds,
            "seconds": times,
            "median_seconds": medians,
            "rewrite_us_per_function": per_function_us,
            "warm_ratio": warm_ratio,
            "goal_warm_ratio": 2.0,
        },
    )
    print(f"saved {path}")
