"""`python -m benchmarks.call_instructions MODE CALLS`: CALLS calls of `host_calls`' leaf
function, plain or instrumented with the gate `closed` or `open`, for callgrind to count
(`host_calls_versions` takes the difference of two counts, so start-up cancels out). Both
versions of the function are made in every mode, so only the calls differ."""

from __future__ import annotations

import sys

from benchmarks import host_calls

MODES = ("plain", "closed", "open")


def main() -> None:
    mode, calls = sys.argv[1], int(sys.argv[2])
    if mode not in MODES:
        raise SystemExit(f"MODE is one of {', '.join(MODES)}")
    plain = host_calls._namespace(False)["leaf"]
    instrumented = host_calls._namespace(True)["leaf"]
    with host_calls._requests(sampled=0, others=int(mode == "open")):
        host_calls._drive(plain if mode == "plain" else instrumented, calls)


if __name__ == "__main__":
    main()
