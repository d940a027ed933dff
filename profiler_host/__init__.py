"""request-profiler's in-process half: instrument, sample, record, stream.

import profiler_host
profiler_host.start(server="127.0.0.1:50051", service="shop", include="shop.*")
with profiler_host.profile_request("nightly-report"):
    run_report()

The runtime is imported on first use, not with the package: the relay process
(`profiler_host.relay`) imports only what carries the stream, and starts in a fraction of
the time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profiler_host.runtime import active, start, stop

_RUNTIME = ("active", "start", "stop")


def __getattr__(name: str) -> Any:
    if name in _RUNTIME:
        from profiler_host import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'profiler_host' has no attribute {name!r}")


@contextmanager
def profile_request(name: str, force: bool = False) -> Iterator[None]:
    """A unit of work that is not an HTTP request (a job, a script's step) as one request,
    subject to sampling unless `force`. Works as `with` block and as decorator."""
    from profiler_host.runtime import active

    profiler = active()
    if profiler is None:
        yield
        return
    with profiler.recording(profiler.begin(name, "", force)):
        yield


__all__ = ["active", "profile_request", "start", "stop"]
