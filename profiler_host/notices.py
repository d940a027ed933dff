"""What the host tells when a run records less than it seems to: at exit, wanted modules
with no instrumented function, a process that sampled nothing, calls past the event cap;
as it happens, a first sampled request that ran no instrumented function.

A green run that recorded nothing looks like a profile of nothing: these go through the
`profiler_host` logger (stderr under `profiler-host run`), once per process.
"""

from __future__ import annotations

import logging

from profiler_host.recording import Request

log = logging.getLogger("profiler_host")

NAMED = 10  # modules named per reason; the rest are counted


def uninstrumented(missed: dict[str, str]) -> None:
    """Wanted modules (name -> why) that ran with none of their functions instrumented."""
    if not missed:
        return
    by_reason: dict[str, list[str]] = {}
    for name, reason in sorted(missed.items()):
        by_reason.setdefault(reason, []).append(name)
    log.warning(
        "request-profiler: %d module(s) matching --include ran with no function "
        "instrumented, so none of their calls were recorded:\n%s",
        len(missed),
        "\n".join(f"  {_names(names)}: {reason}" for reason, names in by_reason.items()),
    )


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMED])
    return shown if len(names) <= NAMED else f"{shown} and {len(names) - NAMED} more"


def nothing_sampled() -> None:
    log.warning(
        "request-profiler: nothing was sampled in this process: no request reached the "
        "profiler's middleware or profile_request(). To record a script, job or test run "
        "as one request, run it with --whole-process (PROFILER_WHOLE_PROCESS=true)."
    )


def calls_not_recorded(request: Request) -> None:
    """The whole-process request went over its event cap: the calls after it ran their
    original code, unrecorded."""
    if not request.unrecorded:
        return
    log.warning(
        "request-profiler: the whole-process request reached --max-request-events "
        "(%d events): %d calls after that were not recorded. Raise --max-request-events "
        "(PROFILER_MAX_REQUEST_EVENTS) to record them; the server keeps at most its own "
        "--max-request-events per request.",
        request.event_cap,
        request.unrecorded,
    )


def ran_no_call(request: Request, include: tuple[str, ...]) -> None:
    """When `request` (ended) ran no instrumented function, says which modules are
    instrumented and how to widen them (a Django project whose views sit outside the
    package of its `wsgi.py`, run with `--include` of that package)."""
    if next(request.calls) > 1:  # a call id was handed out (one more changes nothing now)
        return
    log.warning(
        "request-profiler: the sampled request %s ran no instrumented function: only "
        "modules matching --include %r are instrumented. Name the packages of your app's "
        "code (views, endpoints) with --include (PROFILER_INCLUDE), e.g. --include "
        "myproject,myapp.",
        " ".join(filter(None, (request.method, request.route))),
        ",".join(include) or "__main__",
    )
