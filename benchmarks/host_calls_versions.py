"""`host-calls` on each CPython the host supports, side by side: the rewritten code, its gate
and the hook call sequence differ per version (`profiler_host/layouts/`), and so does what
the interpreter charges for a call, for cProfile (on `sys.monitoring` from 3.12) and for the
host's hooks.

Each interpreter runs `python -m benchmarks host-calls` in its own venv, one after the
other (this process's interpreter for its version, `.venvXY` for the others, which
`./dev bench host-calls-versions` makes as `./dev versions` does). A version without its
venv fails the run rather than leaving a column out. Figures are each run's medians; the
sampled pair is also given as a ratio to cProfile's per-call cost on the same interpreter
(run interleaved with it), the comparison that holds across versions and machine speeds.

With valgrind installed, each version's instructions per call of the leaf function come
too, which no speed swing blurs: callgrind counts a process making `calls` calls and one
making twice as many (`benchmarks.call_instructions`, `PYTHONHASHSEED=0`), and the
difference over `calls` is one call's; the gate's, the sampled pair's and cProfile's figures
are what they add to a plain call, and the sampled pair over cProfile is their ratio.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import callgrind, results
from benchmarks.call_instructions import MODES
from profiler_host.layouts import SUPPORTED

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("bare_call", "closed_added", "open_added", "sampled_added", "cprofile_added")


def interpreters() -> dict[str, str]:
    """Version ("3.12") -> the Python of its venv, for every supported version."""
    found = {}
    for major, minor in SUPPORTED:
        version = f"{major}.{minor}"
        if sys.version_info[:2] == (major, minor):
            found[version] = sys.executable
            continue
        python = ROOT / f".venv{major}{minor}" / "bin" / "python"
        if not python.exists():
            raise SystemExit(
                f"no {python.parent.parent.name} for CPython {version}: "
                "`./dev bench` makes it for a *-versions benchmark"
            )
        found[version] = str(python)
    return found


def run_on(python: str, args: list[str], timeout: float = 3600) -> dict:
    """`python -m benchmarks ARGS` on `python` (a venv's), its output passed on; the result
    it saved."""
    done = subprocess.run(
        [python, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} on {python} failed:\n{done.stdout}\n{done.stderr}")
    print(done.stdout)
    saved = [line for line in done.stdout.splitlines() if line.startswith("results: ")]
    return json.loads(Path(saved[-1].removeprefix("results: ")).read_text())


def _per_call(python: str, mode: str, calls: int) -> float:
    """Instructions a call in `mode` costs (callgrind: the calls' phase)."""
    counted = [python, "-m", "benchmarks.call_instructions", mode, str(calls)]
    return callgrind.phases(counted, 2)[1] / calls


def instructions_per_call(python: str, calls: int) -> dict[str, float]:
    """Instructions of a plain call of the leaf, what the gate closed and open, a sampled
    enter+exit and cProfile add, and the sampled pair over cProfile."""
    per_call = {mode: _per_call(python, mode, calls) for mode in MODES}
    plain = per_call["plain"]
    added = {mode: per_call[mode] - plain for mode in MODES[1:]}
    return {
        "plain_call": round(plain, 1),
        **{f"{mode}_added": round(value, 1) for mode, value in added.items()},
        "sampled_per_cprofile": round(added["sampled"] / added["cprofile"], 2),
    }


def _ratio(figures: dict) -> float:
    """A sampled enter+exit over cProfile's cost per call (nan when a tiny run measured
    cProfile at no cost)."""
    cprofile = figures["cprofile_added"]["median"]
    return figures["sampled_added"]["median"] / cprofile if cprofile > 0 else float("nan")


def run(rounds: int, calls: int, instruction_calls: int) -> dict:
    pythons = interpreters()
    args = ["host-calls", "--rounds", str(rounds), "--calls", str(calls)]
    runs = {version: run_on(python, args) for version, python in pythons.items()}
    versions = list(runs)
    first = runs[versions[0]]
    functions = [
        name for name, value in first.items() if isinstance(value, dict) and FIGURES[1] in value
    ]
    rows = []
    out: dict[str, dict] = {}
    for function in functions:
        for figure in FIGURES:
            medians = [runs[version][function][figure]["median"] for version in versions]
            out.setdefault(function, {})[figure] = dict(zip(versions, medians, strict=True))
            rows.append((function, figure, *(f"{median:.1f}" for median in medians)))
        ratios = [_ratio(runs[version][function]) for version in versions]
        out[function]["sampled_per_cprofile"] = dict(zip(versions, ratios, strict=True))
        rows.append((function, "sampled / cProfile", *(f"{ratio:.2f}" for ratio in ratios)))
    print(results.table(("functions", "ns per call", *versions), rows))
    if instruction_calls and shutil.which("valgrind"):
        counted = {v: instructions_per_call(pythons[v], instruction_calls) for v in versions}
        out["leaf_instructions"] = counted
        figures = list(counted[versions[0]])
        print(
            results.table(
                ("leaf", "instructions per call", *versions),
                [
                    ("leaf", figure, *(f"{counted[v][figure]:.1f}" for v in versions))
                    for figure in figures
                ],
            )
        )
    elif instruction_calls:
        print("instructions per call: no valgrind here")
    hooks = {version: runs[version]["hooks"] for version in versions}
    interpreter = {version: runs[version]["machine"]["python"] for version in versions}
    print(f"hooks: {hooks}; interpreters: {interpreter}")
    saved = {"rounds": rounds, "calls_per_round": calls, "hooks": hooks, "pythons": interpreter}
    path = results.save("host-calls-versions", {**saved, **out})
    print(f"\nresults: {path}")
    return out
