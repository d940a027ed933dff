"""Instructions a whole process runs, counted by valgrind's callgrind: no speed swing of a
shared machine blurs them. A benchmark counts a process doing N units of work and one doing
2N; the difference over N is one unit's, start-up and imports cancelled out."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["valgrind", "--tool=callgrind"]


def instructions(command: list[str], timeout: float = 1800) -> int:
    """What callgrind counts for `command` (run from the repository's root, hash seed 0)."""
    with tempfile.TemporaryDirectory() as scratch:
        done = subprocess.run(
            [*COMMAND, f"--callgrind-out-file={scratch}/out", *command],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind on {command} failed:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def per_unit(command: list[str], units: int, twice: list[str]) -> float:
    """Instructions per unit of work: `command` does `units`, `twice` does twice as many."""
    return (instructions(twice) - instructions(command)) / units
