"""`python -m benchmarks NAME [options]` (`./dev bench ...`): NAME is ingest, stages, depth,
memory, queries, fleet, host-calls, host-calls-versions, host-unsampled, host-recorded,
host-app, host-app-versions, host-instructions, host-startup, ui-render or all; `table` prints the
overhead table in markdown from the results files.

This process is the load client: it pins itself to core 1 before any thread exists (gRPC's
threads inherit it) and starts the server pinned to core 0."""

from __future__ import annotations

import argparse
import os

from benchmarks import (
    depth,
    fleet,
    host_app,
    host_app_versions,
    host_calls,
    host_calls_versions,
    host_instructions,
    host_recorded,
    host_script,
    host_startup,
    host_unsampled,
    ingest,
    memory,
    queries,
    stages,
    table,
    ui_render,
)
from benchmarks.server import CLIENT_CORE
from profiler_server import pipeline

DBS = ("sqlite", "postgresql")


def _keys(setups: list) -> str:
    return ",".join(setup.key for setup in setups)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def setups_option(parser: argparse.ArgumentParser, known: str) -> None:
    parser.add_argument(
        "--setups",
        default="",
        help=f"only these, comma-separated (none is always measured): {known}",
    )


def app_load_options(p: argparse.ArgumentParser) -> None:
    """host-app's load: the same for one interpreter and for each (host-app-versions)."""
    p.add_argument("--rounds", type=int, default=20, help="interleaved CPU rounds")
    p.add_argument("--seconds", type=int, default=2, help="measured load per CPU window")
    p.add_argument("--warmup", type=int, default=1, help="load before each CPU window")
    p.add_argument(
        "--latency-rounds", type=int, default=10, help="interleaved open-loop rounds (0: none)"
    )
    p.add_argument(
        "--latency-seconds", type=float, default=4.0, help="measured open-loop load per window"
    )
    p.add_argument(
        "--paired",
        action="store_true",
        help="CPU rounds load each setup at the same time as the unprofiled app, on one core",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks for the profiling server; results also go to benchmarks/results/.",
    )
    sub = parser.add_subparsers(dest="benchmark")

    def load_options(p: argparse.ArgumentParser, seconds: float) -> None:
        p.add_argument("--db", choices=DBS, default="sqlite")
        p.add_argument("--seconds", type=float, default=seconds, help="sending time")
        p.add_argument("--streams", type=int, default=4, help="parallel host sessions")
        p.add_argument("--window", type=int, default=8, help="unacked batches per stream")
        p.add_argument(
            "--batches", type=int, default=100, help="prebuilt batches per session (20k events)"
        )

    p = sub.add_parser("ingest", help="events/s acked end to end (optionally under cProfile)")
    load_options(p, 30.0)
    p.add_argument("--profile", action="store_true", help="run the server under cProfile")
    p = sub.add_parser("fleet", help="batches/s and ack latency from many small host streams")
    p.add_argument("--db", choices=DBS, default="sqlite")
    p.add_argument("--streams", type=int, default=1000, help="concurrent host streams")
    p.add_argument(
        "--rate", type=float, default=1.0, help="batches/s per stream (0: as fast as acks allow)"
    )
    p.add_argument("--seconds", type=float, default=30.0, help="sending time")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds not measured")
    p.add_argument("--profile", action="store_true", help="run the server under cProfile")
    p.add_argument(
        "--servers",
        type=int,
        default=1,
        help="servers on one PostgreSQL, the hosts split between them, all on the server core",
    )
    p.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the baseline run against benchmarks/grpc_floor.py (gRPC and decoding alone)",
    )
    p = sub.add_parser("stages", help="ingest time per stage, in-process, without a profiler")
    p.add_argument("--db", choices=DBS, default="sqlite")
    p.add_argument(
        "--shape",
        choices=("ingest", "fleet"),
        default="ingest",
        help="ingest: one session's batches of 20k events; fleet: many sessions' batches of "
        "one 20-event request",
    )
    p.add_argument(
        "--batches", type=int, help="batches (ingest: 40) or batches per session (fleet: 20)"
    )
    p.add_argument("--group", type=int, help="batches per transaction (ingest 8, fleet 256)")
    p.add_argument("--sessions", type=int, default=1000, help="sessions of the fleet shape")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per batch under callgrind (twice more batches, ~50x slower)",
    )
    p = sub.add_parser("depth", help="ingest time and memory per event: depth 10 to 16,000, width")
    p.add_argument("--db", choices=DBS, default="sqlite")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of every shape")
    p.add_argument("--events", type=int, default=64_000, help="events per depth shape")
    p.add_argument("--depths", type=_ints, default=depth.DEPTHS, help="comma-separated")
    p.add_argument("--widths", type=_ints, default=depth.WIDTHS, help="distinct stacks")
    p = sub.add_parser("memory", help="server RSS over a sustained ingest")
    load_options(p, 300.0)
    p.add_argument("--warmup", type=float, default=20.0, help="seconds before the start RSS")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    p = sub.add_parser(
        "queries", help="API latency: a 10k-call request, flame graph of 100k, routes overview"
    )
    p.add_argument("--db", choices=DBS, default="sqlite")
    p.add_argument("--requests", type=int, default=100_000, help="stored small requests")
    p.add_argument("--routes", type=int, default=500, help="routes in the routes overview")
    p.add_argument("--days", type=int, default=7, help="days of per-minute route counts")
    p = sub.add_parser(
        "host-calls", help="ns added per instrumented call: gate closed/open, sampled"
    )
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds of every mode")
    p.add_argument(
        "--calls", type=int, default=200_000, help="instrumented calls per mode and round"
    )
    p = sub.add_parser(
        "host-calls-versions", help="host-calls on each supported CPython, side by side"
    )
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds of every mode")
    p.add_argument(
        "--calls", type=int, default=200_000, help="instrumented calls per mode and round"
    )
    p.add_argument(
        "--instruction-calls",
        type=int,
        default=20_000,
        help="calls callgrind counts per mode (0: no instruction counts)",
    )
    p = sub.add_parser(
        "host-recorded", help="instructions a recorded request costs a framework's app threads"
    )
    p.add_argument("--app", default="django", choices=sorted(host_recorded.APPS))
    p.add_argument("--every", type=int, default=10, help="one request in this many sampled")
    p.add_argument("--requests", type=int, default=300, help="requests per callgrind run")
    p.add_argument("--uvloop", action="store_true", help="on uvloop's loop, not asyncio's")
    p.add_argument(
        "--setups",
        default="",
        help="comma-separated, none and off among them (default all: "
        + ",".join(host_recorded.SETUPS)
        + ")",
    )
    p = sub.add_parser(
        "host-unsampled", help="ns and instructions per request not sampled, piece by piece"
    )
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds of every piece")
    p.add_argument("--requests", type=int, default=100_000, help="requests per piece and round")
    p.add_argument(
        "--instructions", action="store_true", help="also count instructions under callgrind"
    )
    p.add_argument(
        "--instruction-requests", type=int, default=20_000, help="requests per callgrind run"
    )
    p.add_argument("--pieces", default="", help="only these, comma-separated (default all)")
    p = sub.add_parser(
        "host-app",
        help="CPU per request, throughput and p99 latency: host vs none (vs other profilers)",
    )
    p.add_argument("--app", choices=(*host_app.APPS, "script", "all"), default="flask")
    app_load_options(p)
    p.add_argument("--carts", type=int, default=15_000, help="carts the script prices per run")
    setups_option(
        p,
        f"apps {_keys(host_app.SETUPS)} (default {host_app.DEFAULT_SETUPS}); "
        f"script {_keys(host_script.SETUPS)}",
    )
    p = sub.add_parser(
        "host-app-versions", help="host-app on each supported CPython, ratios side by side"
    )
    p.add_argument(
        "--apps",
        default=",".join(host_app_versions.APPS),
        help=f"comma-separated, of {','.join(host_app.APPS)}",
    )
    app_load_options(p)
    setups_option(p, f"{_keys(host_app.SETUPS)} (default {host_app_versions.SETUPS})")
    p = sub.add_parser(
        "host-instructions",
        help="instructions per request under callgrind: host vs none vs cProfile and yappi",
    )
    p.add_argument("--app", choices=(*host_app.APPS, "all"), default="flask")
    p.add_argument("--warmup", type=int, default=40, help="requests before counting")
    p.add_argument("--requests", type=int, default=200, help="requests counted")
    p.add_argument(
        "--sparse",
        type=float,
        default=host_instructions.SPARSE,
        help=f"s the sparse life serves, a request every {host_instructions.SPARSE_GAP:g} s",
    )
    setups_option(
        p,
        f"{_keys(host_instructions.SETUPS)} (default {host_instructions.DEFAULT_SETUPS})",
    )
    p = sub.add_parser("host-startup", help="import time of a big package: plain, cold, warm")
    p.add_argument("--functions", type=int, default=3000, help="functions in the package")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds of every setup")
    p = sub.add_parser(
        "ui-render",
        help="web UI in headless Chromium: 10k-call timeline, 5k-stack flame graph, "
        "opening a 2M-call request",
    )
    p.add_argument("--rounds", type=int, default=5, help="page loads and redraws per chart")
    p.add_argument(
        "--huge-tops",
        type=int,
        default=ui_render.HUGE_TOPS,
        help=f"the huge request's outer calls, {ui_render.HUGE_WIDTH + 1:,} calls each",
    )
    p = sub.add_parser(
        "table",
        help="markdown: CPU, instruction and p99 ratios per app and setup, from the newest "
        "host-app and host-instructions results",
    )
    p.add_argument("--brief", action="store_true", help="the README's short table")
    sub.add_parser("all", help="everything with default options (about 15 minutes)")
    return parser


ALL = (
    ["ingest", "--db", "sqlite"],
    ["ingest", "--db", "postgresql"],
    ["ingest", "--db", "sqlite", "--seconds", "20", "--profile"],
    ["fleet", "--db", "sqlite"],
    ["fleet", "--db", "sqlite", "--rate", "0"],
    ["fleet", "--db", "postgresql", "--rate", "0"],
    ["stages", "--db", "sqlite"],
    ["stages", "--db", "postgresql"],
    ["depth", "--db", "sqlite"],
    ["queries", "--db", "sqlite"],
    ["memory", "--db", "sqlite"],
    ["host-calls"],
    ["host-unsampled", "--instructions"],
    ["host-recorded"],
    ["host-app", "--app", "all"],
    ["host-instructions", "--app", "all"],
    ["host-startup"],
    ["ui-render"],
)


def _run(args: argparse.Namespace) -> None:
    if args.benchmark == "ingest":
        ingest.run(args.db, args.seconds, args.streams, args.window, args.batches, args.profile)
    elif args.benchmark == "fleet":
        fleet.run(
            args.db,
            args.streams,
            args.rate,
            args.seconds,
            args.warmup,
            args.profile,
            args.floor,
            args.servers,
        )
    elif args.benchmark == "stages":
        fleet_shape = args.shape == "fleet"
        stages.run(
            args.db,
            args.batches or (20 if fleet_shape else 40),
            args.group or (pipeline.GROUP_MAX if fleet_shape else 8),
            args.shape,
            args.sessions,
            args.instructions,
        )
    elif args.benchmark == "depth":
        depth.run(args.db, args.rounds, args.events, args.depths, args.widths)
    elif args.benchmark == "memory":
        memory.run(
            args.db,
            args.seconds,
            args.streams,
            args.window,
            args.batches,
            args.warmup,
            args.interval,
        )
    elif args.benchmark == "queries":
        queries.run(args.db, args.requests, args.routes, args.days)
    elif args.benchmark == "host-calls":
        host_calls.run(args.rounds, args.calls)
    elif args.benchmark == "host-calls-versions":
        host_calls_versions.run(args.rounds, args.calls, args.instruction_calls)
    elif args.benchmark == "host-recorded":
        host_recorded.run(args.app, args.every, args.requests, args.setups, args.uvloop)
    elif args.benchmark == "host-unsampled":
        host_unsampled.run(
            args.rounds, args.requests, args.instructions, args.instruction_requests, args.pieces
        )
    elif args.benchmark == "host-app":
        for app in [*host_app.APPS, "script"] if args.app == "all" else [args.app]:
            if app == "script":
                if args.paired:
                    raise SystemExit("--paired: app servers only, not --app script")
                host_script.run(args.rounds, args.carts, args.setups)
            else:
                host_app.run(
                    app,
                    args.rounds,
                    args.seconds,
                    args.warmup,
                    args.setups,
                    args.latency_rounds,
                    args.latency_seconds,
                    args.paired,
                )
    elif args.benchmark == "host-app-versions":
        options = [
            *("--rounds", str(args.rounds), "--seconds", str(args.seconds)),
            *("--warmup", str(args.warmup), "--latency-rounds", str(args.latency_rounds)),
            *("--latency-seconds", str(args.latency_seconds)),
            *(("--setups", args.setups) if args.setups else ()),
            *(("--paired",) if args.paired else ()),
        ]
        host_app_versions.run([a for a in args.apps.split(",") if a], options)
    elif args.benchmark == "host-instructions":
        for app in host_app.APPS if args.app == "all" else [args.app]:
            host_instructions.run(app, args.warmup, args.requests, args.setups, args.sparse)
    elif args.benchmark == "host-startup":
        host_startup.run(args.functions, args.rounds)
    elif args.benchmark == "ui-render":
        ui_render.run(args.rounds, args.huge_tops)
    elif args.benchmark == "table":
        table.run(brief=args.brief)


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if CLIENT_CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {CLIENT_CORE})
    if args.benchmark in (None, "all"):
        for one in ALL:
            print(f"\n=== python -m benchmarks {' '.join(one)}")
            _run(parser.parse_args(one))
    else:
        _run(args)


if __name__ == "__main__":
    main()
