"""`profiler-host`: the wrapper command arrives with the host library (issue 3)."""

from __future__ import annotations

import sys


def main() -> None:
    sys.exit("profiler-host: the host library is not available in this version yet")
