"""The functions injected code calls, and the gate in front of them.

Each hook swallows `Exception` (counted, logged once) so user code never sees one;
`BaseException` (KeyboardInterrupt from a signal handler) passes through unchanged.
Events and tokens are as `events` defines them: a plain call's token is `(lane, function <<
KIND_BITS, call id)`, a generator's or coroutine's a list of the same and `suspended`,
`stamp`.

A frame that gives control away through `await`/`yield from` runs no hook then (nothing
may stand between SEND and YIELD_VALUE), so its suspension is recorded when it resumes,
and the outermost frame of an await chain resumes first. To keep each lane's events
nested, `_RUNNING` lists per lane the resumable calls its events show running; when a hook
runs for one of them, the calls above it there are in fact suspended and get their SUSPEND
first. A token's stamp is a call id taken when it last started running: the calls a plain
call's frame let run are the ones stamped after its own call id, and
when it exits, those still listed gave control away without a hook, so they are suspended.

The functions below are the reference implementation. When `profiler_host._hotpath` is
built (and `PROFILER_PURE_PYTHON` is not set), `HOOKS` holds its C twins instead: the same
events, tokens and failure handling, without Python frames (see `recording.IMPLEMENTATION`).
"""

from __future__ import annotations

import logging
import sys
import threading
from threading import get_ident
from time import monotonic_ns
from typing import Any

from profiler_core.model import LaneKind
from profiler_host import gates, recording
from profiler_host.events import (
    ENTER,
    EXIT,
    EXIT_CANCELLED,
    EXIT_EXCEPTION,
    KIND_BITS,
    READY,
    RESUME,
    SUSPEND,
    TOKEN_CALL,
    TOKEN_FK,
    TOKEN_LANE,
    TOKEN_STAMP,
    TOKEN_SUSPENDED,
)
from profiler_host.rewriter import Hooks

log = logging.getLogger("profiler_host")


ACTIVE = gates.InFlight()
UNCLAIMED = 0  # Lane.thread of a lane made for work that has not started yet
errors = [0]  # hook failures since start
_CURRENT = recording.CURRENT  # the open gate's enter reads it (a module global, not an attribute)

# A plain call's token: (lane, function << KIND_BITS, call id).
PlainToken = tuple[recording.Lane, int, int]
# A resumable call's token: [lane, function << KIND_BITS, call id, suspended, stamp].
ResumableToken = list[Any]

# lane -> tokens of the resumable calls its events show running, oldest first; a lane's
# entry goes when its list empties (tokens never hold the list)
_RUNNING: dict[recording.Lane, list[ResumableToken]] = {}


def _failed(exc: BaseException | None = None) -> None:
    """Counts a hook failure (the C hooks pass the exception, the Python ones handle it)."""
    errors[0] += 1
    if errors[0] == 1:
        log.warning(
            "request-profiler: a hook failed; the call was not recorded",
            exc_info=exc if exc is not None else True,
        )


class Handed(threading.local):
    """The lane an `InLane` runs its work in on this thread (the Python twin of the C hot
    path's thread-local pair): work handed over may run part of itself in a context it
    copied before the hand-over, which holds the lane's parent (asgiref's `sync_to_async`
    runs the view in `context.run`); that part belongs in the handed lane, nested under the
    work's own calls."""

    lane: recording.Lane | None = None


HANDED = Handed()


def _own_lane(lane: recording.Lane) -> recording.Lane:
    """The lane of this thread. A lane handed to another thread (`propagation`) is claimed
    by the first thread that records in it; the parent of the lane handed to this thread
    stands for that lane; a context copied into another thread otherwise gets a lane of its
    own."""
    ident = get_ident()
    handed = HANDED.lane
    if handed is not None and handed.parent is lane and handed.thread in (UNCLAIMED, ident):
        lane = handed
    if lane.thread == UNCLAIMED:
        lane.thread = ident
        return lane
    if lane.thread == ident:
        return lane
    request = lane.request
    for other in request.lanes:
        if other.thread == ident and other.parent is lane:
            return other
    return request.spawn(lane, LaneKind.THREAD, threading.current_thread().name)


def enter(fid: int) -> PlainToken | None:
    """Records the call of `fid` in the lane of this context; None outside a sampled request
    (the open gate then runs the original body)."""
    try:
        lane = _CURRENT.get()
        if lane is None:
            return None
        if lane.thread != get_ident():
            lane = _own_lane(lane)
        request = lane.request
        cid = next(request.calls)
        if cid > request.event_cap >> 1:
            if request.event_cap:  # 0: the request ended, nothing was lost
                request.truncated = True
                request.unrecorded += 1
            return None
        fk = fid << KIND_BITS
        now = monotonic_ns()
        if _RUNNING:
            _resume_thrown(lane, now)
        lane.record((fk | ENTER, cid, now))
        return (lane, fk, cid)
    except Exception:
        _failed()
        return None


def enter_resumable(fid: int) -> ResumableToken | None:
    token = enter(fid)
    if token is None:
        return None
    resumable = [*token, False, token[TOKEN_CALL]]  # not suspended, stamped with its call id
    try:
        _running_push(resumable)
    except Exception:
        _failed()
    return resumable


def _running_push(token: ResumableToken) -> None:
    lane = token[TOKEN_LANE]
    running = _RUNNING.get(lane)
    if running is None:
        _RUNNING[lane] = [token]
    elif token not in running:
        running.append(token)


def _suspend_top(lane: recording.Lane, running: list[ResumableToken], since: int) -> None:
    """Pops the top of a lane's running calls, a frame that gave control away without a
    hook: unless its SUSPEND is recorded already, it is recorded at `since` (its own resume
    hook then records only the RESUME)."""
    top = running.pop()
    if not top[TOKEN_SUSPENDED]:
        top[TOKEN_SUSPENDED] = True
        lane.record((top[TOKEN_FK] | SUSPEND, top[TOKEN_CALL], since))


def _running_pop(token: ResumableToken, now: int) -> None:
    """Takes `token` off its lane's running calls; those above it (awaits that gave
    control away without a hook) are suspended since the lane's last event first."""
    lane = token[TOKEN_LANE]
    running = _RUNNING.get(lane)
    if running is None or token not in running:
        return
    since = _since(lane, now)
    while running[-1] is not token:
        _suspend_top(lane, running, since)
    running.pop()
    if not running:
        _RUNNING.pop(lane, None)


def _resume_thrown(lane: recording.Lane, now: int) -> None:
    """A woken await chain (see `ready`) that runs a hook other than its resume hooks had an
    exception thrown in (a cancellation, a failed await): that resumed it with no hook, so
    its frames resume now, outermost first."""
    running = _RUNNING.get(lane)
    if running and running[-1][TOKEN_SUSPENDED]:
        for token in running:
            if token[TOKEN_SUSPENDED]:
                token[TOKEN_SUSPENDED] = False
                lane.record((token[TOKEN_FK] | RESUME, token[TOKEN_CALL], now))


def _since(lane: recording.Lane, now: int) -> int:
    """When a frame that gave control away without a hook stopped: at the lane's last event."""
    buffer = lane.buffer
    return buffer[-1] if buffer else now  # an event ends with its ns


def _suspend_let_run(lane: recording.Lane, cid: int, now: int) -> None:
    """A plain call `cid` exits: the resumable calls it let run and that gave control away
    without a hook (`yield from` into a generator it called `next()` on) are suspended."""
    running = _RUNNING.get(lane)
    if not running or running[-1][TOKEN_STAMP] <= cid:
        return
    since = _since(lane, now)
    while running and running[-1][TOKEN_STAMP] > cid:
        _suspend_top(lane, running, since)
    if not running:
        _RUNNING.pop(lane, None)


def exit(token: PlainToken) -> None:
    try:
        lane, fk, cid = token
        now = monotonic_ns()
        if _RUNNING:
            _resume_thrown(lane, now)
            _suspend_let_run(lane, cid, now)
        if lane.request.event_cap:  # 0: the request ended (Request.finish)
            lane.record((fk | EXIT, cid, now))
    except Exception:
        _failed()


def _exit_resumable(token: ResumableToken, kind: int) -> None:
    """A frame still marked suspended was resumed by an exception thrown in (or by its
    delegate returning on one) with no hook: its RESUME comes first."""
    now = monotonic_ns()
    lane = token[TOKEN_LANE]
    _resume_thrown(lane, now)
    if token[TOKEN_SUSPENDED]:
        lane.record((token[TOKEN_FK] | RESUME, token[TOKEN_CALL], now))
        token[TOKEN_SUSPENDED] = False
    _running_pop(token, now)
    lane.record((token[TOKEN_FK] | kind, token[TOKEN_CALL], now))


def exit_resumable(token: ResumableToken) -> None:
    try:
        _exit_resumable(token, EXIT)
    except Exception:
        _failed()


def exit_exception(token: PlainToken | ResumableToken, exc: BaseException) -> None:
    """Asyncio's cancellation and `close()` (GeneratorExit) end a call as cancelled, other
    exceptions as raised. (No helper functions: near the recursion limit, each Python frame
    a hook adds is one that can fail.)"""
    try:
        # asyncio is not imported here: until the app imports it, nothing is cancelled
        cancelled = getattr(sys.modules.get("asyncio.exceptions"), "CancelledError", ())
        kind = EXIT_CANCELLED if isinstance(exc, (GeneratorExit, cancelled)) else EXIT_EXCEPTION
        if isinstance(token, list):
            _exit_resumable(token, kind)
        else:
            lane, fk, cid = token
            now = monotonic_ns()
            if _RUNNING:
                _resume_thrown(lane, now)
                _suspend_let_run(lane, cid, now)
            if lane.request.event_cap:
                lane.record((fk | kind, cid, now))
    except Exception:
        _failed()


def suspend(token: ResumableToken) -> None:
    try:
        lane, fk, cid = token[TOKEN_LANE], token[TOKEN_FK], token[TOKEN_CALL]
        now = monotonic_ns()
        _resume_thrown(lane, now)
        if token[TOKEN_SUSPENDED]:  # a throw() caught inside the generator resumed it
            lane.record((fk | RESUME, cid, now))
        else:
            _running_pop(token, now)
        lane.record((fk | SUSPEND, cid, now))
        token[TOKEN_SUSPENDED] = True
    except Exception:
        _failed()


def _set_running(token: ResumableToken) -> None:
    """`token` runs from now: not suspended, stamped with a fresh call id (see the module's
    docstring; ids need only be unique and increasing), listed as running on its lane."""
    token[TOKEN_SUSPENDED] = False
    token[TOKEN_STAMP] = next(token[TOKEN_LANE].request.calls)
    _running_push(token)


def resume(token: ResumableToken) -> None:
    try:
        token[TOKEN_LANE].record((token[TOKEN_FK] | RESUME, token[TOKEN_CALL], monotonic_ns()))
        _set_running(token)
    except Exception:
        _failed()


def resume_delegated(token: ResumableToken) -> None:
    """After `yield from`/`await` gave control away: the frame was suspended since the
    lane's last event (the delegate's own yield, when it is instrumented). A frame marked
    suspended already has its SUSPEND recorded: it was thrown into at a plain yield
    (aclose(), athrow()) and awaited while handling that, or it is the inner part of an
    await chain whose outer frame resumed first (see `_RUNNING`)."""
    try:
        lane, fk, cid = token[TOKEN_LANE], token[TOKEN_FK], token[TOKEN_CALL]
        now = monotonic_ns()
        if not token[TOKEN_SUSPENDED]:
            since = _since(lane, now)
            _running_pop(token, now)
            lane.record((fk | SUSPEND, cid, since))
        lane.record((fk | RESUME, cid, now))
        _set_running(token)
    except Exception:
        _failed()


def thrown(token: ResumableToken) -> None:
    """An exception handler of a generator or coroutine starts. When the frame was suspended,
    the exception thrown in (`throw()`, `athrow()`, `close()`, a cancelled await) resumed it
    without a hook: it runs from now, so what the handler calls nests under it."""
    try:
        if not token[TOKEN_SUSPENDED]:
            return
        lane = token[TOKEN_LANE]
        now = monotonic_ns()
        _resume_thrown(lane, now)  # a woken await chain it belongs to resumes whole
        if token[TOKEN_SUSPENDED]:  # suspended at a plain yield
            lane.record((token[TOKEN_FK] | RESUME, token[TOKEN_CALL], now))
            _set_running(token)
    except Exception:
        _failed()


PYTHON_HOOKS = Hooks(
    gate=gates.OPEN,
    enter=enter,
    enter_resumable=enter_resumable,
    exit=exit,
    exit_resumable=exit_resumable,
    exit_exception=exit_exception,
    suspend=suspend,
    resume=resume,
    resume_delegated=resume_delegated,
    thrown=thrown,
)


def ready(lane: recording.Lane) -> None:
    """The task running in `lane` was woken (what it awaited is done). Its await chain has
    been suspended since the lane's last event, innermost first; from now on it is ready."""
    try:
        running = _RUNNING.get(lane)
        if not running:
            return
        now = monotonic_ns()
        since = _since(lane, now)
        for token in reversed(running):
            if not token[TOKEN_SUSPENDED]:
                lane.record((token[TOKEN_FK] | SUSPEND, token[TOKEN_CALL], since))
                token[TOKEN_SUSPENDED] = True
        for token in running:
            lane.record((token[TOKEN_FK] | READY, token[TOKEN_CALL], now))
    except Exception as exc:
        _failed(exc)


def _c_hooks() -> Hooks:
    from profiler_host import _hotpath

    _hotpath.configure(_own_lane, _failed, _RUNNING, recording.CURRENT)
    return Hooks(
        gate=gates.OPEN,
        enter=_hotpath.enter,
        enter_resumable=_hotpath.enter_resumable,
        exit=_hotpath.exit,
        exit_resumable=_hotpath.exit_resumable,
        exit_exception=_hotpath.exit_exception,
        suspend=_hotpath.suspend,
        resume=_hotpath.resume,
        resume_delegated=_hotpath.resume_delegated,
        thrown=_hotpath.thrown,
    )


# the C hooks need the C lanes (recording picks both, or neither)
HOOKS = _c_hooks() if recording.IMPLEMENTATION == "c" else PYTHON_HOOKS
