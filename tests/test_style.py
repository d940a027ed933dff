"""The code stays ruff clean (lint and format), checked with the pinned ruff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"]
)
def test_ruff(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
