"""`python -m benchmarks table`: the overhead table in markdown, from the newest `host-app`
and `host-instructions` result of each app, so the figures in docs/benchmarks.md and the
README are the files' own, with the command that produced each.

Per app and setup it sets the CPU-time ratio (`host_app`, median over interleaved rounds
with the median's 90% interval) beside the instruction ratio (`host_instructions`) and the
p99 latency ratio, and says whether the goal is met. A goal is `met` only when the
instructions and the CPU-time median both reach it; `not met` when the instructions miss
it or CPU time's whole interval lies below it and below the A/A row's (the run's noise);
otherwise it is not claimed. p99's goal cannot be told when the A/A row's p99 interval is
wider than the goal's tolerance. Higher ratios are better for CPU and instructions (1.0
free); for p99, lower (1.05 is 5% slower)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import host_app, host_instructions, results
from benchmarks.overhead import NONE


@dataclass(frozen=True)
class Row:
    """A setup as both benchmarks name it, and the goals it is held to (None: reported)."""

    label: str
    cpu: str  # host_app's setup name
    instructions: str  # host_instructions' setup name
    goal: float | None = None  # CPU and instruction ratio at least
    p99_goal: float | None = None  # p99 ratio at most


OFF_ROW = Row("sampling off", host_app.OFF, host_app.OFF, 0.99, 1.05)
DEFAULT_ROW = Row(
    "default (10/s)", host_app.DEFAULT, host_instructions.DEFAULT_COMPOSED, 0.97, 1.05
)
AA_ROW = Row("none (A/A)", "none (A/A)", "none (A/A)")
CPROFILE_ROW = Row("cProfile", "cProfile", "cProfile")
YAPPI_ROW = Row("yappi", "yappi", "yappi")
ROWS = (
    AA_ROW,
    OFF_ROW,
    # the unsampled path at any rate: a request the default sampler let pass (instructions)
    Row("default, a request not sampled", "", host_instructions.UNSAMPLED),
    Row("default, not sampled, patches in", "", host_instructions.LINGERING),
    DEFAULT_ROW,
    Row("every request", host_app.EVERY, host_app.EVERY),
    CPROFILE_ROW,
    YAPPI_ROW,
)


THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def newest(directory: Path, benchmark: str, app: str, version: str = THIS_PYTHON) -> dict | None:
    """The newest result file of `benchmark` for `app` measured on CPython `version` (this
    interpreter's by default; names end in a sortable time; `host-app-versions` leaves the
    other versions' runs beside them)."""
    for path in sorted(directory.glob(f"{benchmark}-{app}-2*.json"), reverse=True):
        result = json.loads(path.read_text())
        if result["machine"]["python"].startswith(f"{version}."):
            return result
    return None


def command(result: dict) -> str:
    """How the result was produced: as `./dev bench` takes it, or for a run on another
    CPython than `.venv`'s, with the Python of that version's venv."""
    args = " ".join(result["command"][1:])
    version = ".".join(result.get("machine", {}).get("python", THIS_PYTHON).split(".")[:2])
    if version == THIS_PYTHON:
        return f"./dev bench {args}"
    return f".venv{version.replace('.', '')}/bin/python -m benchmarks {args}"


def _interval(figure: dict) -> str:
    low, high = figure["median_ci90"]
    return f"{figure['median']:.3f} ({low:.3f}-{high:.3f})"


def instruction_cell(ratio: float | None, cpu: dict | None, digits: int = 4) -> str:
    """The instruction ratio, marked when CPU time contradicts it: when the CPU ratio's
    interval lies wholly on the other side of it (so no figure stands that CPU time
    contradicts)."""
    if ratio is None:
        return "-"
    cell = f"{ratio:.{digits}f}"
    if cpu is not None:
        low, high = cpu["median_ci90"]
        if high < ratio or low > ratio:
            cell += " (CPU contradicts)"
    return cell


def verdict(row: Row, cpu: dict | None, instructions: float | None, aa: dict | None) -> str:
    """`met`, `not met`, or what is missing to tell (see the module's docstring). CPU time
    shows a cost only when its interval lies wholly below the goal and below the A/A
    row's interval too (the run's noise)."""
    if row.goal is None:
        return ""
    floor = min(row.goal, aa["median_ci90"][0] if aa else 0.0)
    if cpu is not None and cpu["median_ci90"][1] < floor:
        return "not met"
    if instructions is not None and instructions < row.goal:
        return "not met"
    if instructions is None or cpu is None:
        return "not measured"
    if cpu["median"] >= row.goal:
        return "met"
    return "CPU time cannot tell"


def _p99_verdict(row: Row, p99: dict | None, aa: dict | None) -> str:
    """As `verdict`, and `cannot tell` whenever the A/A row's interval reaches beyond the
    goal's tolerance either side of 1.0: p99 is then noisier than the goal."""
    if row.p99_goal is None or p99 is None:
        return ""
    low, high = aa["median_ci90"] if aa else (0.0, float("inf"))
    if low < 2 - row.p99_goal or high > row.p99_goal:
        return "A/A too wide"
    if p99["median"] <= row.p99_goal:
        return "met"
    return "not met" if p99["median_ci90"][0] > row.p99_goal else "cannot tell"


def _sampled(cpu: dict | None, counted: dict | None) -> str:
    """The share of requests recorded: stored per loaded second over the median request
    rate in the CPU run; the share the instruction run composed its default row with."""
    shares = []
    if cpu and "sampled_per_loaded_second" in cpu:
        shares.append(f"{cpu['sampled_per_loaded_second'] / cpu['rate']['median']:.1%}")
    if counted and "sampled_share" in counted:
        shares.append(f"{counted['sampled_share']:.1%}")
    return " / ".join(shares)


def overhead_table(directory: Path) -> str:
    """Markdown: one line per app and setup measured by either benchmark."""
    lines = [
        "| app | setup | CPU ratio (90% CI) | CPU ratio at half rate (90% CI) "
        "| instruction ratio | goal | p99 ratio (90% CI) | p99 goal "
        "| sampled (CPU run / instructions) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    commands = []
    for app in host_app.APPS:
        cpu_run = newest(directory, "host-app", app)
        instructions_run = newest(directory, "host-instructions", app)
        commands += [command(one) for one in (cpu_run, instructions_run) if one]
        cpu_setups = cpu_run["setups"] if cpu_run else {}
        instruction_setups = instructions_run["setups"] if instructions_run else {}
        for row in ROWS:
            cpu = cpu_setups.get(row.cpu)
            counted = instruction_setups.get(row.instructions)
            if cpu is None and counted is None:
                continue
            ratio = counted["ratio"] if counted else None
            cpu_ratio = cpu["cpu_ratio"] if cpu else None
            p99 = cpu.get("p99_ratio") if cpu else None
            open_loop = cpu.get("cpu_ratio_at_latency_rate") if cpu else None
            aa = cpu_setups.get("none (A/A)", {})
            cells = (
                app,
                row.label,
                _interval(cpu_ratio) if cpu_ratio else "-",
                _interval(open_loop) if open_loop else "-",
                instruction_cell(ratio, cpu_ratio),
                verdict(row, cpu_ratio, ratio, aa.get("cpu_ratio")),
                _interval(p99) if p99 else "-",
                _p99_verdict(row, p99, aa.get("p99_ratio")),
                _sampled(cpu, counted),
            )
            lines.append(f"| {' | '.join(cells)} |")
    return "\n".join([*lines, "", "Commands:", "", *(f"    {one}" for one in commands)])


# the host's own threads and its relay process, as host_app's thread breakdown names them:
# its transport, writer and acks threads, and the relay that holds its gRPC stream
HOST_THREADS = ("request-profiler", "relay process")


def threads_table(directory: Path) -> str:
    """Markdown: CPU µs per request by thread, per app and setup: the app's main thread, the
    host's threads (also as ms of CPU per second at the median request rate: their cost is
    mostly per second, not per request) and the rest (from 1 µs per request; what the
    process's CPU clock and the threads' sum differ by is left out)."""
    lines = [
        "| app | setup | requests/s | user / system µs/request | main thread µs/request "
        "| host threads µs/request | host threads ms/s | other threads µs/request |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for app in host_app.APPS:
        run = newest(directory, "host-app", app)
        if run is None:
            continue
        for name in (NONE, host_app.OFF, host_app.DEFAULT):
            figure = run["setups"].get(name, {})
            threads = figure.get("thread_cpu_ms_per_request")
            if threads is None:
                continue
            rate = figure["rate"]["median"]
            host = sum(ms for label, ms in threads.items() if label.startswith(HOST_THREADS))
            others = ", ".join(
                f"{label} {ms * 1000:.1f}"
                for label, ms in threads.items()
                if label != "main" and not label.startswith(HOST_THREADS) and ms >= 1e-3
            )
            split = figure.get("user_system_us_per_request")
            lines.append(
                f"| {app} | {name} | {rate:.0f} | {' / '.join(map(str, split or ['-']))} "
                f"| {threads['main'] * 1000:.1f} "
                f"| {host * 1000:.1f} | {host * rate:.2f} | {others or '-'} |"
            )
    return "\n".join(lines)


def brief_table(directory: Path) -> str:
    """Markdown for the README: per app, the A/A row's CPU ratio (the run's noise), the off
    and default rows' CPU ratios (at full speed, and at half rate under open-loop load)
    and instruction ratios side by side, and the default's p99 ratio (medians)."""
    lines = [
        "| app | A/A: CPU | off: CPU | off: CPU, half rate | off: instructions | default: CPU "
        "| default: CPU, half rate | default: instructions | default: p99 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for app in host_app.APPS:
        cpu_run = newest(directory, "host-app", app) or {"setups": {}}
        counted_run = newest(directory, "host-instructions", app) or {"setups": {}}
        aa = cpu_run["setups"].get("none (A/A)")
        cells = [f"{aa['cpu_ratio']['median']:.3f}" if aa else "-"]
        for row in (OFF_ROW, DEFAULT_ROW):
            cpu = cpu_run["setups"].get(row.cpu)
            counted = counted_run["setups"].get(row.instructions)
            cells.append(f"{cpu['cpu_ratio']['median']:.3f}" if cpu else "-")
            half = cpu.get("cpu_ratio_at_latency_rate") if cpu else None
            cells.append(f"{half['median']:.3f}" if half else "-")
            ratio = counted["ratio"] if counted else None
            cells.append(instruction_cell(ratio, cpu["cpu_ratio"] if cpu else None, 3))
        p99 = cpu_run["setups"].get(DEFAULT_ROW.cpu, {}).get("p99_ratio")
        cells.append(f"{p99['median']:.2f}" if p99 else "-")
        lines.append(f"| {app} | {' | '.join(cells)} |")
    return "\n".join(lines)


# the setups the versions' table sets side by side: the run's noise, the host's (held to
# the goals) and the peers
VERSION_ROWS = (AA_ROW, OFF_ROW, DEFAULT_ROW, CPROFILE_ROW, YAPPI_ROW)


def versions_table(directory: Path, brief: bool = False) -> str:
    """Markdown from the newest `host-app-versions` result of each sample app: per app and
    setup, the CPU ratio at full speed and at half rate on each supported CPython (each
    version's ratio against the app uninstrumented on that version, in the same rounds),
    beside the instruction ratio of the app's newest `host-instructions` run on that
    version, and the commands that produced them (`brief`: not, as in the README)."""
    runs: dict[str, tuple[dict, dict]] = {}  # app -> (by version, the result holding it)
    for path in sorted(directory.glob("host-app-versions-2*.json")):
        result = json.loads(path.read_text())
        for app, by_version in result["apps"].items():
            runs[app] = (by_version, result)
    if not runs:
        return "No host-app-versions result."
    versions = sorted({v for by_version, _ in runs.values() for v in by_version})
    counted = {  # the newest instruction count of each app on each version, if any
        (app, v): newest(directory, "host-instructions", app, v) for app in runs for v in versions
    }
    lines = [
        f"| app | setup | {' | '.join(f'CPU {v}: full / half rate' for v in versions)} "
        f"| {' | '.join(f'instructions {v}' for v in versions)} |",
        f"| --- | --- |{' --- |' * 2 * len(versions)}",
    ]
    for app, (by_version, _) in runs.items():
        for row in VERSION_ROWS:
            cells = []
            for version in versions:
                figure = by_version.get(version, {}).get("setups", {}).get(row.cpu, {})
                full, half = figure.get("cpu_ratio"), figure.get("cpu_ratio_at_latency_rate")
                cells.append(" / ".join("-" if r is None else f"{r:.3f}" for r in (full, half)))
            for version in versions:
                count = counted[app, version]
                ratio = count and count["setups"].get(row.instructions, {}).get("ratio")
                cells.append("-" if ratio is None else f"{ratio:.4f}")
            lines.append(f"| {app} | {row.label} | {' | '.join(cells)} |")
    used = [result for _, result in runs.values()] + [c for c in counted.values() if c]
    commands = dict.fromkeys(f"    {command(result)}" for result in used)
    return "\n".join(lines if brief else [*lines, "", *commands])


def run(directory: Path = results.RESULTS, brief: bool = False) -> str:
    """The tables (`brief`: the README's), printed and returned."""
    if brief:
        text = f"{brief_table(directory)}\n\n{versions_table(directory, brief=True)}"
    else:
        text = "\n\n".join(
            (overhead_table(directory), threads_table(directory), versions_table(directory))
        )
    print(text)
    return text
