"""Runs the demo: server, both apps under `profiler-host run`, traffic, summary; then keeps
everything running until Ctrl-C (or stops at once with `--exit`, as the tests do)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from profiler_server.demo import report, traffic
from profiler_server.demo.children import Child, DemoError

FLASK, STARLETTE = "shop-flask", "shop-starlette"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__)
    parser.add_argument("--output", default="demo-output", help="logs, flame graph, database")
    parser.add_argument("--db", help="SQLAlchemy URL [default: sqlite:///OUTPUT/profiler.db]")
    parser.add_argument("--grpc", default="127.0.0.1:50051", help="server's gRPC address")
    parser.add_argument("--http", default="127.0.0.1:9999", help="server's HTTP address")
    parser.add_argument("--flask-port", type=int, default=8000)
    parser.add_argument("--starlette-port", type=int, default=8001)
    parser.add_argument("--rounds", type=int, default=25, help="times each route is requested")
    parser.add_argument("--sample-rate", default="25", help="per second per app process")
    parser.add_argument("--exit", action="store_true", help="stop everything after the summary")
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C


class Demo:
    def __init__(self, args: argparse.Namespace, output: Path, scratch: Path) -> None:
        self.args = args
        self.output = output
        self.scratch = scratch
        self.base = f"http://{args.http}"
        self.children: list[Child] = []

    def spawn(self, name: str, args: list[str], **env: str) -> Child:
        child = Child(name, args, self.output / f"{name}.log", {**os.environ, **env})
        self.children.append(child)
        return child

    def ports(self) -> tuple[int, int]:
        """The apps' HTTP ports: Flask's, Starlette's."""
        return self.args.flask_port, self.args.starlette_port

    def start_server(self) -> None:
        db = self.args.db or f"sqlite:///{self.output / 'profiler.db'}"
        server = self.spawn(
            "profiler-server",
            [sys.executable, "-m", "profiler_server", "--db", db,
             "--listen", self.args.grpc, "--http", self.args.http],
        )  # fmt: skip
        server.wait_until_answering(self.base + "/healthz")

    def start_app(self, service: str, command: list[str]) -> Child:
        """The app under `profiler-host run`, with a fresh shop database of its own."""
        host = [
            sys.executable, "-m", "profiler_host", "run", "--server", self.args.grpc,
            "--service", service, "--sample-rate", self.args.sample_rate, "--",
        ]  # fmt: skip
        shop = str(self.scratch / f"{service}.sqlite3")
        return self.spawn(service, [*host, *command], PROFILING_TARGET_DB=shop)

    def run(self) -> None:
        started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        t0 = time.monotonic()
        self.start_server()
        flask_url, starlette_url = (f"http://127.0.0.1:{port}" for port in self.ports())
        apps = [
            (self.start_app(FLASK, [
                sys.executable, "-m", "gunicorn", "-w", "2",
                "-b", f"127.0.0.1:{self.args.flask_port}", "profiling_target.wsgi:app",
            ]), flask_url, traffic.FLASK),
            (self.start_app(STARLETTE, [
                sys.executable, "-m", "uvicorn", "profiling_target.asgi:app",
                "--host", "127.0.0.1", "--port", str(self.args.starlette_port),
            ]), starlette_url, traffic.STARLETTE),
        ]  # fmt: skip
        for app, url, _ in apps:
            app.wait_until_answering(url + "/health")
        up = time.monotonic() - t0
        print(f"server and apps up in {up:.1f} s; sending traffic ...", flush=True)
        for app, url, calls in apps:
            statuses = traffic.drive(url, calls, self.args.rounds)
            shown = ", ".join(f"{n}x {status}" for status, n in sorted(statuses.items()))
            print(f"  {app.name:15} {url}  {sum(statuses.values())} requests: {shown}")
        stored = report.wait_settled(self.base, [FLASK, STARLETTE])
        folded = self.output / "flamegraph.folded"
        lines = report.save_flamegraph(self.base, folded, started)
        slowest = [r for s in (FLASK, STARLETTE) for r in report.slowest(self.base, s, started)]
        self.summary(stored, folded, lines, slowest)
        print(f"(demo took {time.monotonic() - t0:.1f} s)", flush=True)

    def summary(self, stored: dict, folded: Path, lines: int, slowest: list[dict]) -> None:
        base = self.base
        counts = ", ".join(f"{service} {n}" for service, n in sorted(stored.items()))
        print(f"\nSampled requests stored: {counts}. Where to look:")
        for service in (FLASK, STARLETTE):
            if not stored.get(service):
                print(f"  (nothing stored for {service} yet: see {self.output}/{service}.log)")
        print(f"  web UI          {base}/")
        print(f"  requests        {base}/api/requests?order=duration")
        print(f"  one request     {base}/api/requests/<id>  (its whole call tree)")
        print(f"  functions       {base}/api/functions")
        print(f"  flame graph     {folded}  ({lines} stacks; flamegraph.pl or speedscope.app)")
        print(f"                  from {base}/api/flamegraph?format=folded")
        print(f"  metrics         {base}/metrics  (deploy/: Prometheus config, Grafana dashboard)")
        print(f"  logs            {self.output}/*.log")
        apps = (f"http://127.0.0.1:{port}/products" for port in self.ports())
        print(f"  the apps        {'  '.join(apps)}")
        print("\nSlowest sampled requests of each app:")
        print("\n".join(report.slowest_lines(base, slowest)))

    def wait(self) -> None:
        """Until Ctrl-C or until a process ends by itself (then says which)."""
        print("\nThe server and both apps keep running; press Ctrl-C to stop them.", flush=True)
        while True:
            for child in self.children:
                if not child.alive():
                    raise child.exited()
            time.sleep(0.5)

    def stop(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut it short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for child in reversed(self.children):  # apps flush to the server, then it drains
            child.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    signal.signal(signal.SIGTERM, _interrupt)
    with tempfile.TemporaryDirectory(prefix="profiler-demo-") as scratch:
        demo = Demo(args, output, Path(scratch))
        try:
            demo.run()
            if not args.exit:
                demo.wait()
        except DemoError as exc:
            print(f"demo failed: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\nstopping ...", flush=True)
        finally:
            demo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
