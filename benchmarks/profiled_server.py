"""`python -m benchmarks.profiled_server OUT.prof [server flags]`: the real server under
cProfile. `python -m cProfile` would only see the main thread (the asyncio loop), not the
ingest worker thread where assembly and storage run, so both get a profiler and the
stats are merged into OUT.prof when the server exits (SIGTERM drains, then returns)."""

from __future__ import annotations

import cProfile
import pstats
import sys

from profiler_server import cli
from profiler_server.pipeline import Pipeline


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    profiles: list[cProfile.Profile] = []
    worker_run = Pipeline._run

    def profiled_run(self: Pipeline) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.runcall(worker_run, self)

    Pipeline._run = profiled_run  # type: ignore[method-assign]
    main_profile = cProfile.Profile()
    profiles.append(main_profile)
    main_profile.runcall(cli.main, argv)
    pstats.Stats(*profiles).dump_stats(out)


if __name__ == "__main__":
    main()
