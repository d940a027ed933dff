"""request-profiler's in-process half: instrument, sample, record, stream.

import profiler_host
profiler_host.start(server="127.0.0.1:50051", service="shop", include="shop.*")
with profiler_host.profile_request("nightly-report"):
    run_report()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from profiler_host.runtime import active, start, stop


@contextmanager
def profile_request(name: str, force: bool = False) -> Iterator[None]:
    """A unit of work that is not an HTTP request (a job, a script's step) as one request,
    subject to sampling unless `force`. Works as `with` block and as decorator."""
    profiler = active()
    if profiler is None:
        yield
        return
    with profiler.recording(profiler.begin(name, "", force)):
        yield


__all__ = ["profile_request", "start", "stop"]
