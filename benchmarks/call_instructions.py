"""`python -m benchmarks.call_instructions MODE CALLS`: CALLS calls of `host_calls`' leaf
function, plain, instrumented with the gate `closed` or `open`, `sampled` (enter and exit
recorded), or plain under `cprofile`, for callgrind to count (`host_calls_versions` takes the
difference of two counts, so start-up cancels out). Both versions of the function are made
in every mode, so only the calls differ; the process ends right after the calls, so neither
the recorded events' draining nor the interpreter's finalisation is counted."""

from __future__ import annotations

import os
import sys

from benchmarks import host_calls

MODES = ("plain", "closed", "open", "sampled", "cprofile")


def main() -> None:
    mode, calls = sys.argv[1], int(sys.argv[2])
    if mode not in MODES:
        raise SystemExit(f"MODE is one of {', '.join(MODES)}")
    plain = host_calls._namespace(False)["leaf"]
    instrumented = host_calls._namespace(True)["leaf"]
    if mode in ("plain", "cprofile"):
        host_calls._time(mode, plain, instrumented, calls, host_calls._drive)
    else:
        with host_calls._requests(sampled=int(mode == "sampled"), others=int(mode != "closed")):
            host_calls._drive(instrumented, calls)
            os._exit(0)
    os._exit(0)


if __name__ == "__main__":
    main()
