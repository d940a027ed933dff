"""Other profilers, run the way they are usually left on in production: started inside the
worker for its whole life (cProfile, yappi, pyinstrument), or attached from outside
(py-spy), so their cost per request can be set beside the host's.

In-process peers are chosen with `$BENCH_PEER`: gunicorn loads this module as its config
(`-c python:benchmarks.peers`) and starts the peer in the forked worker
(`post_worker_init`); any other server is run by `python -m benchmarks.served -m MODULE
ARGS...`, which starts the peer and then runs the module as `__main__`. Profiles stay in
memory and are never written: the benchmark measures the cost of collecting them.
"""

from __future__ import annotations

import cProfile
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ENV = "BENCH_PEER"
IN_PROCESS = ("cprofile", "cprofile-threads", "yappi", "pyinstrument")
PYSPY_START_TIMEOUT = 30.0

_running: list[Any] = []  # keeps the profiler objects alive for the process's life


def start(name: str) -> None:
    """Profiles the calling thread (cProfile, pyinstrument) or every thread (yappi,
    cprofile-threads) until exit.

    cProfile and pyinstrument see only the thread that starts them, which is the thread that
    serves requests in a gunicorn sync worker and runs the event loop under uvicorn (not
    anyio's worker threads, where Starlette runs sync endpoints and `run_in_threadpool`).
    `cprofile-threads` also gives every thread started later a cProfile of its own, so it
    covers what the host records."""
    if name in ("cprofile", "cprofile-threads"):
        profiler = cProfile.Profile()
        profiler.enable()
        if name == "cprofile-threads":
            threading.setprofile(_profile_this_thread)
    elif name == "yappi":
        import yappi

        yappi.set_clock_type("cpu")
        yappi.start()
        profiler = yappi
    elif name == "pyinstrument":
        from pyinstrument import Profiler

        # its default 1 ms interval; no async tracking, as for a whole process
        profiler = Profiler(async_mode="disabled")
        profiler.start()
    else:
        raise ValueError(f"unknown in-process profiler {name!r}")
    _running.append(profiler)


def _profile_this_thread(frame: object, event: str, arg: object) -> None:
    """A new thread's first profile event: from here on a cProfile of its own records it."""
    profiler = cProfile.Profile()
    _running.append(profiler)
    profiler.enable()


def post_worker_init(worker: object) -> None:
    """gunicorn config hook: runs in each worker after it forked and loaded the app."""
    start(os.environ[ENV])


def attach_pyspy(pid: int, core: int, output: Path) -> subprocess.Popen:
    """`py-spy record --nonblocking` on a running process (its default 100 samples/s), pinned
    to `core`; returns once it samples. It needs ptrace on the target (root here)."""
    log = output.with_suffix(".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["taskset", "-c", str(core), os.path.join(os.path.dirname(sys.executable), "py-spy"),
             "record", "--nonblocking", "--pid", str(pid), "--format", "raw", "-o", str(output)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + PYSPY_START_TIMEOUT
    while b"Sampling process" not in log.read_bytes():  # "py-spy> Sampling process 100 ..."
        if proc.poll() is not None or time.monotonic() > deadline:
            detach_pyspy(proc)
            raise RuntimeError(f"py-spy could not attach to {pid}: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def detach_pyspy(proc: subprocess.Popen) -> None:
    """Ctrl-C: py-spy stops sampling and writes its file."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(PYSPY_START_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
