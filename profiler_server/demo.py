"""`./dev demo`: the profiling server on SQLite, fed with traffic, then where to look.

Until the host library exists the traffic is synthetic (profiler_server.loadgen): real
gRPC streams carrying requests of nested calls, as an instrumented app would send.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from profiler_core.wire.builder import BatchBuilder
from profiler_server.loadgen import CallShape, HostStream, hello, synthetic_batch

ROUTES = [
    ("/items/{id}", "GET", CallShape(200, 10, 40)),
    ("/checkout", "POST", CallShape(600, 14, 60)),
]


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"profiler-server exited with {proc.returncode}")
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("profiler-server did not become healthy in time")


def _traffic(target: str, seconds: float) -> int:
    """Streams batches of whole requests for `seconds`; returns requests acked."""
    stream = HostStream(target)
    stream.send_hello(hello("demo-shop"))
    deadline = time.monotonic() + seconds
    seq = 0
    next_id = 1
    while time.monotonic() < deadline and seq < 10_000:
        seq += 1
        builder = BatchBuilder()
        for route, method, shape in ROUTES:
            synthetic_batch(builder, shape, range(next_id, next_id + 5), route, method, seq == 1)
            next_id += 5
        stream.send_batch(builder.build(seq))
        if not stream.wait_acked({seq}, timeout=10):
            break
        time.sleep(0.05)
    stream.close()
    return len(stream.stored) * 5 * len(ROUTES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__)
    parser.add_argument("--db", default="sqlite:///profiler.db")
    parser.add_argument("--grpc", default="127.0.0.1:50051")
    parser.add_argument("--http", default="127.0.0.1:9999")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--exit", action="store_true", help="stop the server after the summary")
    args = parser.parse_args(argv)
    base = f"http://{args.http}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "profiler_server",
            "--db",
            args.db,
            "--listen",
            args.grpc,
            "--http",
            args.http,
        ],
        env=os.environ.copy(),
    )
    try:
        _wait_healthy(base, server)
        print(f"profiler-server is up; sending {args.seconds:.0f} s of traffic ...", flush=True)
        sent = _traffic(args.grpc, args.seconds)
        folded = httpx.get(base + "/api/flamegraph", params={"format": "folded"}, timeout=30).text
        Path("flamegraph.folded").write_text(folded)
        slowest = httpx.get(base + "/api/requests", params={"limit": 5}, timeout=30).json()
        print(f"\n{sent} requests stored. Where to look:")
        print(f"  requests        {base}/api/requests?order=duration")
        print(f"  one request     {base}/api/requests/<id>")
        print(f"  flame graph     {base}/api/flamegraph?format=folded  (saved: flamegraph.folded)")
        print(f"  functions       {base}/api/functions")
        print(f"  metrics         {base}/metrics")
        print("\nSlowest sampled requests:")
        for r in slowest["requests"]:
            print(
                f"  {r['duration_ms']:8.2f} ms  {r['method']} {r['route']}  {r['calls']} calls"
                f"  {base}/api/requests/{r['id']}"
            )
        if not args.exit:
            print("\nThe server keeps running; press Ctrl-C to stop it.", flush=True)
            server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(30)


if __name__ == "__main__":
    main()
