"""The code stays ruff clean (lint and format), and the host package passes the type checker
on each version it supports, checked with the pinned ruff and mypy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from profiler_host.layouts import SUPPORTED

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"]
)
def test_ruff(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", [".".join(map(str, v)) for v in SUPPORTED])
def test_mypy_on_the_host(version: str) -> None:
    """`[tool.mypy]` in pyproject.toml says what is checked and how strictly."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-version", version],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
