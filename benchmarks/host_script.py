"""What profiling costs a call-heavy script (`call_heavy.py`): CPU seconds of its work
(all threads, as the script counts them) and of the whole process (start-up, the work,
whatever the profiler does at exit, and for the host the `profiler-host run` wrapper's own
start before it execs the command), plain, under
`profiler-host run` (nothing sampled, and `--whole-process`: every call recorded and sent)
and under the other profilers' own command lines (`python -m cProfile -o FILE`,
`python -m yappi -o FILE`, `python -m pyinstrument -o FILE`; py-spy attached to the pid).

The script runs on core 0; it waits after its imports until told to go, so py-spy (core 1)
is attached before the work starts. The CPU comes from `wait4()`'s rusage of the script's
own process, reported as runs per CPU second in the second column. See `overhead` for rounds
and ratios.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import overhead, peers
from benchmarks.overhead import NONE, Setup
from benchmarks.server import CLIENT_CORE, ROOT, SERVER_CORE, ServerProcess

SCRIPT = Path(__file__).resolve().parent / "call_heavy.py"
# the whole run is one request: keep every event of it
WHOLE = ("--whole-process", "true", "--max-request-events", str(1 << 29))
SETUPS = [
    Setup("none", NONE),
    Setup("aa", "none (A/A)"),
    Setup("off", "host, nothing sampled", host=()),
    Setup("whole", "host, --whole-process", host=WHOLE),
    Setup("cprofile", "cProfile", peer="cprofile"),
    Setup("yappi", "yappi", peer="yappi"),
    Setup("pyinstrument", "pyinstrument", peer="pyinstrument"),
    Setup("pyspy", "py-spy --nonblocking", peer="py-spy"),
]
PEER_CLI = {"cprofile": "cProfile", "yappi": "yappi", "pyinstrument": "pyinstrument"}


def _command(setup: Setup, carts: int, server: str, out: Path) -> list[str]:
    script = [sys.executable, str(SCRIPT), str(carts)]
    if setup.host is not None:
        return [
            sys.executable, "-m", "profiler_host", "run", "--server", server,
            "--service", "bench-script", "--include", "profiling_target.*", *setup.host,
            "--", *script,
        ]  # fmt: skip
    if setup.peer in PEER_CLI:
        return [sys.executable, "-m", PEER_CLI[setup.peer], "-o", str(out), *script[1:]]
    return script


def once(setup: Setup, carts: int, server: str, tmp: Path) -> tuple[float, float]:
    """(CPU seconds of the work, runs per CPU second of the whole process) of one run."""
    out = tmp / "profile.out"
    proc = subprocess.Popen(
        ["taskset", "-c", str(SERVER_CORE), *_command(setup, carts, server, out)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    pyspy = None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{setup.name}: the script did not start")
        if setup.peer == "py-spy":
            pyspy = peers.attach_pyspy(proc.pid, CLIENT_CORE, out)
        proc.stdin.write("go\n")
        proc.stdin.close()
        work = float(proc.stdout.read().split()[-1])
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if pyspy is not None:
            peers.detach_pyspy(pyspy)
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{setup.name}: the script exited with {proc.returncode}")
    return work, 1 / (usage.ru_utime + usage.ru_stime)


def run(rounds: int, carts: int, keys: str = "") -> dict:
    if CLIENT_CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {CLIENT_CORE})
    started_load = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="profiler-bench-script-") as name,
        ServerProcess(f"sqlite:///{name}/profiles.db", core=CLIENT_CORE) as profiler,
    ):
        setups = overhead.choose(SETUPS, keys)
        print(f"script: {len(setups)} setups, {rounds} rounds of {carts} carts")
        samples = overhead.interleave(
            setups, rounds, lambda s: once(s, carts, profiler.target, Path(name))
        )
    data = {
        "app": "script",
        "rounds": rounds,
        "carts": carts,
        "load_average_at_start": started_load,
        "samples": samples,
    }
    figures = overhead.ratios(samples)
    return overhead.report("host-app-script", "run", "whole-process CPU ratio", figures, {}, data)
