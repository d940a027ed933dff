"""Assembles well-nested requests with NumPy, all finished requests of a group at once.

Most requests are plain calls on one lane: every exit closes the innermost open call, call
ids grow as calls are entered, times never go back and stay within the request. For those
the tree follows from the event columns alone: the depth is a running sum of enters (+1) and
exits (-1); sorted by (request, depth), each call's enter comes right before its exit; a
call's parent is the last event one level up before its enter; self time is the call's wall
time minus its children's. Other requests go to `builder.assemble`, which repairs input.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from profiler_core.model import EXIT_OUTCOMES, MAIN_LANE, EventKind, LaneKind
from profiler_server.assembly import problems as P
from profiler_server.assembly.calltree import LANE_ROOT, LaneTree, RequestMeta
from profiler_server.assembly.forest import EXTRA_COLUMNS, Forest
from profiler_server.assembly.pending import PendingRequest

ENTER = int(EventKind.ENTER)
EXIT = int(EventKind.EXIT)
EXITS = [int(kind) for kind in EXIT_OUTCOMES]
_OUTCOME_OF_KIND = np.zeros(max(EXITS) + 1, dtype=np.uint8)
_OUTCOME_OF_KIND[EXITS] = list(EXIT_OUTCOMES.values())
_SORT_KEY_LIMIT = 2**62  # (request, depth, event) combined into one int64 while it fits


def _plain(pending: PendingRequest) -> bool:
    """Worth trying here: start and end known, events, all on the main lane, no other lane
    announced (a lane without events still shows, e.g. a task that only awaited a thread)."""
    return (
        not pending.lanes
        and pending.start_ns is not None
        and pending.end_ns is not None
        and pending.events > 0
        and all(run.lane_id == MAIN_LANE for _, run in pending.runs)
    )


@dataclass
class _Events:
    """The events of several requests, concatenated; `request` is the index per event."""

    pendings: list[PendingRequest]
    lengths: np.ndarray
    request: np.ndarray
    kinds: np.ndarray
    functions: np.ndarray
    calls: np.ndarray
    times: np.ndarray

    @classmethod
    def of(cls, pendings: list[PendingRequest]) -> _Events:
        runs = [run for p in pendings for _, run in sorted(p.runs, key=itemgetter(0))]
        lengths = np.array([p.events for p in pendings], dtype=np.int64)
        return cls(
            pendings,
            lengths,
            np.repeat(np.arange(len(pendings)), lengths),
            np.concatenate([r.kinds for r in runs]),
            np.concatenate([r.functions for r in runs]).astype(np.int64),
            np.concatenate([r.calls for r in runs]),
            np.concatenate([r.times for r in runs]),
        )

    def select(self, keep: np.ndarray) -> _Events:
        rows = keep[self.request]
        lengths = self.lengths[keep]
        return _Events(
            [p for p, k in zip(self.pendings, keep.tolist(), strict=True) if k],
            lengths,
            np.repeat(np.arange(len(lengths)), lengths),
            self.kinds[rows],
            self.functions[rows],
            self.calls[rows],
            self.times[rows],
        )

    def per_request(self, flags: np.ndarray) -> np.ndarray:
        """True for requests with any event flagged."""
        return np.bincount(self.request[flags], minlength=len(self.pendings)) > 0


def _depths(ev: _Events) -> tuple[np.ndarray, np.ndarray]:
    """(enter per event, open calls after each event within its request)."""
    enter = ev.kinds == ENTER
    step = np.where(enter, 1, -1)
    running = np.cumsum(step)
    firsts = np.cumsum(ev.lengths) - ev.lengths
    before = running[firsts] - step[firsts]
    return enter, running - np.repeat(before, ev.lengths)


def _well_nested(ev: _Events, enter: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Per request: only enters and exits, in time order within [start, end], never more
    exits than enters and none open at the end, call ids growing as calls are entered."""
    starts = np.array([p.start_ns for p in ev.pendings], dtype=np.int64)
    ends = np.maximum(np.array([p.end_ns for p in ev.pendings], dtype=np.int64), starts)
    times, same = ev.times, ev.request[1:] == ev.request[:-1]
    bad = ~(enter | np.isin(ev.kinds, EXITS))
    bad |= (times < starts[ev.request]) | (times > ends[ev.request]) | (depth < 0)
    bad[1:] |= same & (times[1:] < times[:-1])
    entered = np.flatnonzero(enter)
    calls = ev.calls[entered]
    bad[entered[1:]] |= (calls[1:] <= calls[:-1]) & (
        ev.request[entered[1:]] == ev.request[entered[:-1]]
    )
    unclosed = depth[np.cumsum(ev.lengths) - 1] != 0
    return ~(ev.per_request(bad) | unclosed)


def _pairs(ev: _Events, enter: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Events sorted by (request, level, position): each enter is followed by its exit."""
    level = depth + ~enter
    key = ev.request * (int(level.max()) + 1) + level
    return key, np.argsort(key, kind="stable")


def _forest(ev: _Events, problems: Counter) -> Forest | None:
    """The trees of well-nested requests; None if some exit names another call than the
    one it would close (those requests then take the general path)."""
    enter, depth = _depths(ev)
    key, order = _pairs(ev, enter, depth)
    opened, closed = order[0::2], order[1::2]
    if not np.array_equal(ev.calls[opened], ev.calls[closed]):
        return None
    requests = len(ev.pendings)
    enters = np.bincount(ev.request[enter], minlength=requests)
    offsets = np.concatenate([[0], np.cumsum(enters + 1)])
    roots = offsets[:-1]
    node_of = np.cumsum(enter) + ev.request  # an enter event's node (roots come first)
    nodes = node_of[opened]
    owner = ev.request[opened]

    # A call's parent: the last event one level up before its enter (an enter, still open).
    events = len(ev.kinds)
    position = key[order] * events + order  # ascending
    up = np.searchsorted(position, (key[opened] - 1) * events + opened) - 1
    top_level = depth[opened] == 1
    parent = np.empty(offsets[-1], dtype=np.int64)
    parent[roots] = -1
    parent[nodes] = np.where(top_level, roots[owner], node_of[order[np.maximum(up, 0)]])

    start = np.empty(offsets[-1], dtype=np.int64)
    end = np.empty(offsets[-1], dtype=np.int64)
    start[roots] = [p.start_ns for p in ev.pendings]
    end[roots] = np.maximum([p.end_ns for p in ev.pendings], start[roots])
    start[nodes] = ev.times[opened]
    end[nodes] = ev.times[closed]
    wall = end - start
    children = np.zeros(offsets[-1], dtype=np.int64)
    np.add.at(children, parent[nodes], wall[nodes])
    function = np.full(offsets[-1], LANE_ROOT, dtype=np.int64)
    function[nodes] = ev.functions[opened]
    mismatched = int(np.count_nonzero(function[nodes] != ev.functions[closed]))
    if mismatched:
        problems[P.EXIT_MISMATCH] += mismatched

    raised = ev.kinds[closed] != EXIT
    order = np.argsort(nodes[raised])
    outcome_node = nodes[raised][order]
    return Forest(
        requests=[_meta(p) for p in ev.pendings],
        lanes=[[LaneTree(MAIN_LANE, LaneKind.MAIN, p.main_name, 0)] for p in ev.pendings],
        offsets=offsets,
        function=function,
        parent=parent,
        start=start,
        end=end,
        self_ns=wall - children,
        extra_node=np.zeros(0, dtype=np.int64),
        extras=np.zeros((len(EXTRA_COLUMNS), 0), dtype=np.int64),
        outcome_node=outcome_node,
        outcome=_OUTCOME_OF_KIND[ev.kinds[closed][raised][order]],
    )


def _meta(p: PendingRequest) -> RequestMeta:
    assert p.start_ns is not None and p.end_ns is not None
    return RequestMeta(
        session_id=p.session_id,
        request_id=p.request_id,
        route=p.route,
        method=p.method,
        status=p.status,
        start=p.start_ns,
        end=max(p.end_ns, p.start_ns),
        truncated=p.host_truncated or p.dropped_events > 0,
        events=p.events,
    )


def assemble_nested(
    pendings: list[PendingRequest], problems: Counter
) -> tuple[Forest | None, list[PendingRequest]]:
    """The well-nested requests' forest (None if there are none), and the other requests."""
    candidates = [p for p in pendings if _plain(p)]
    rest = [p for p in pendings if not _plain(p)]
    if not candidates:
        return None, rest
    ev = _Events.of(candidates)
    enter, depth = _depths(ev)
    nested = _well_nested(ev, enter, depth)
    deepest = int(depth.max(initial=0)) + 1
    if (len(candidates) * deepest + 1) * len(ev.kinds) >= _SORT_KEY_LIMIT:
        nested[:] = False
    rest += [p for p, ok in zip(candidates, nested.tolist(), strict=True) if not ok]
    if not nested.any():
        return None, rest
    ev = ev.select(nested)
    forest = _forest(ev, problems)
    if forest is None:  # rare: find the requests at fault, assemble the others
        enter, depth = _depths(ev)
        _, order = _pairs(ev, enter, depth)
        wrong = ev.calls[order[0::2]] != ev.calls[order[1::2]]
        faulty = np.zeros(len(ev.pendings), dtype=bool)
        faulty[ev.request[order[0::2]][wrong]] = True
        rest += [p for p, bad in zip(ev.pendings, faulty.tolist(), strict=True) if bad]
        if faulty.all():
            return None, rest
        forest = _forest(ev.select(~faulty), problems)
    return forest, rest
