"""`profiler-server`: flags mirror PROFILER_* env vars."""

from __future__ import annotations

import asyncio
import logging
import sys

from profiler_core.config import InvalidOption, build_parser, resolve
from profiler_server.settings import OPTIONS, Settings


def parse(argv: list[str] | None = None) -> Settings:
    parser = build_parser(
        "profiler-server",
        "Receives profiles from request-profiler hosts, stores call trees, exports metrics.",
        OPTIONS,
    )
    try:
        return Settings.from_values(resolve(OPTIONS, parser.parse_args(argv)))
    except InvalidOption as exc:
        raise SystemExit(str(exc)) from None


def main(argv: list[str] | None = None) -> None:
    settings = parse(argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from profiler_server.app import ProfilingServer

    asyncio.run(ProfilingServer(settings).run())


if __name__ == "__main__":
    main()
