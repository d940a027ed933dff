"""Instructions a process runs, counted by valgrind's callgrind: no speed swing of a
shared machine blurs them. A process's run is cut into phases, each counted on its own, so
what is measured (N requests after a warm-up, say) is counted alone: start-up, imports and
warm-up, which vary between runs of the same command by far more than a request costs,
are left out, and one run gives every phase. The process ends a phase itself
(`end_phase`, for `phases`) or is told to from outside (`Phases`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["valgrind", "--tool=callgrind"]


# What a process under callgrind calls to end a phase: callgrind, told `DUMP_AT`, then
# writes what it counted since the last phase ended (or since the start) to a file of its
# own and counts afresh. Nothing else the benchmarks run calls it (a process with no
# threads to switch between, or the servers, never asks for the switch interval).
DUMP_AT = "--dump-before=sys_getswitchinterval"
end_phase = sys.getswitchinterval
# The signal on which `benchmarks.served` ends a phase in the server it runs
PHASE_SIGNAL = signal.SIGRTMIN + 4
DUMP_TIMEOUT = 300.0  # s for a dump to be written, the signal sent


def phases(command: list[str], count: int, timeout: float = 1800) -> list[int]:
    """The instructions of each of the `count` phases `command` runs under callgrind (from
    the repository's root, hash seed 0), each ended by the process itself (`end_phase`);
    what follows the last is not counted."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "out"
        done = subprocess.run(
            [*COMMAND, DUMP_AT, f"--callgrind-out-file={out}", *command],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"callgrind on {command} failed:\n{done.stderr[-3000:]}")
        files = [_numbered(out, number) for number in range(1, count + 1)]
        missing = [path.name for path in files if not path.exists()]
        if missing:
            raise RuntimeError(f"{command} ended fewer than {count} phases: {missing}")
        return [summary(path) for path in files]


class Phases:
    """The phases of one app server process under callgrind (with `DUMP_AT`), each ended
    from outside by `end`. What comes before the first end (start-up, warm-up) is left
    out, so what varies between runs there (imports, threads starting at their own pace)
    blurs nothing, and one process gives every phase."""

    def __init__(self, out_file: Path, pid: int) -> None:
        self.out_file, self.pid, self.ended = out_file, pid, 0

    def end(self) -> Path:
        """Ends a phase: the file holding its counts."""
        os.kill(self.pid, PHASE_SIGNAL)
        self.ended += 1
        return dumped(self.out_file, self.ended)


def dumped(out_file: Path, number: int) -> Path:
    """The `number`th phase's file of the process writing `out_file`, once written whole."""
    path = _numbered(out_file, number)
    deadline = time.monotonic() + DUMP_TIMEOUT
    while not (path.exists() and "\ntotals:" in path.read_text(errors="replace")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"callgrind wrote no {path}")
        time.sleep(0.2)
    return path


def _numbered(out_file: Path, number: int) -> Path:
    return out_file.with_name(f"{out_file.name}.{number}")


def summary(path: Path) -> int:
    """The instructions a callgrind file holds (the phase's, for a phase's file)."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary in {path}")


def annotated(path: Path, option: str) -> list[str]:
    """callgrind_annotate's lines for a callgrind file, every function listed. A phase's
    file holds the calls still open when it ended as arcs of no call (`calls=0`), whose
    cost callgrind_annotate would count as the caller's own: they are read as one call."""
    with tempfile.NamedTemporaryFile("w", suffix=".callgrind") as copy:
        with path.open(errors="replace") as counts:
            copy.writelines(
                "calls=1 " + line[len("calls=0 ") :] if line.startswith("calls=0 ") else line
                for line in counts
            )
        copy.flush()
        return subprocess.run(
            ["callgrind_annotate", option, "--threshold=100", copy.name],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout.splitlines()
