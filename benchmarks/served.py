"""`python -m benchmarks.served -m MODULE ARGS...`: runs an app server (uvicorn, gunicorn)
as `python -m MODULE ARGS...` would, so that the benchmark can name its threads.

Python 3.11 gives a Python thread no OS name: every one shows the process's. On
`THREAD_NAMES` (a real-time signal, which neither server handles) the process writes
`{native thread id: Python thread name}` of its live threads to
`$BENCH_THREAD_NAMES/<pid>.json`, once, at the end of a run: nothing runs per request.
On `callgrind.PHASE_SIGNAL` it ends a counted phase (`callgrind.Phases`), a no-op when not
under callgrind. The handlers are installed before the server starts, so gunicorn's forked
worker has them too.
With `$BENCH_PEER` set (and a module other than gunicorn, whose worker starts it from
`benchmarks.peers` as its config), that profiler starts first (`benchmarks.peers`).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
from pathlib import Path

from benchmarks import callgrind, peers

THREAD_NAMES = signal.SIGRTMIN + 3
DIRECTORY = "BENCH_THREAD_NAMES"
# set: the profiler's class patches, once a sampled request put them in, stay in for the
# run (as at a steady sampling rate, where they go out at most once a second)
PATCHES_KEPT = "BENCH_PATCHES_KEPT"


def _write_names(signum: int, frame: object) -> None:
    directory = os.environ.get(DIRECTORY)
    if not directory:
        return
    names = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id}
    path = Path(directory) / f"{os.getpid()}.json"
    path.with_suffix(".tmp").write_text(json.dumps(names))
    path.with_suffix(".tmp").rename(path)


def _end_phase(signum: int, frame: object) -> None:
    callgrind.end_phase()


def _keep_patches() -> None:
    propagation = sys.modules.get("profiler_host.propagation")
    if propagation is None:
        raise SystemExit(f"{PATCHES_KEPT} is set but the profiler is not loaded")
    propagation.LINGER_NS = 10**18


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: python -m benchmarks.served -m MODULE [ARGS...]")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    signal.signal(THREAD_NAMES, _write_names)
    signal.signal(callgrind.PHASE_SIGNAL, _end_phase)
    if os.environ.get(PATCHES_KEPT):
        _keep_patches()
    if os.environ.get(peers.ENV) and module != "gunicorn":
        peers.start(os.environ[peers.ENV])
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
