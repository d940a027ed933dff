"""`python -m benchmarks.call_instructions MODE CALLS`: CALLS calls of `host_calls`' leaf
function, plain, instrumented with the gate `closed` or `open`, `sampled` (enter and exit
recorded), or plain under `cprofile`; or, gate closed, the plain function with its code
swapped for the instrumented one after it was made, as the sweep swaps the functions of
modules imported before the profiler started: by the instrumenter's `set_code` (`swapped`)
or by assigning `__code__` (`assigned`, which on 3.13 leaves the function without the
version its calls specialise on). For callgrind to count: the calls alone are a phase of
their own (`callgrind.end_phase` before and after), so neither start-up nor the recorded
events' draining nor the interpreter's finalisation is counted. Both versions of the
function are made in every mode, so only the calls differ."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from benchmarks import callgrind, host_calls
from profiler_host.instrumenter import _set_code_in_python, set_code

MODES = ("plain", "closed", "open", "sampled", "cprofile", "swapped", "assigned")
SWAPS = {"swapped": set_code, "assigned": _set_code_in_python}


def _counted(func: Callable[[int], object], calls: int) -> int:
    """`host_calls._drive`'s loop as a phase of its own."""
    callgrind.end_phase()
    host_calls._drive(func, calls)
    callgrind.end_phase()
    return 0


def main() -> None:
    mode, calls = sys.argv[1], int(sys.argv[2])
    if mode not in MODES:
        raise SystemExit(f"MODE is one of {', '.join(MODES)}")
    plain = host_calls._namespace(False)["leaf"]
    instrumented = host_calls._namespace(True)["leaf"]
    if mode in SWAPS:
        SWAPS[mode](plain, instrumented.__code__)
        _counted(plain, calls)
    elif mode in ("plain", "cprofile"):
        host_calls._time(mode, plain, instrumented, calls, _counted)
    else:
        with host_calls._requests(sampled=int(mode == "sampled"), others=int(mode != "closed")):
            _counted(instrumented, calls)
            os._exit(0)
    os._exit(0)


if __name__ == "__main__":
    main()
