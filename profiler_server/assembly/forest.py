"""Assembled requests (of one session or of many) as one set of node columns (NumPy
arrays), the form summaries work on. Each request's nodes are contiguous, in the order
they were entered (a lane's root first); parents are node indices in the whole forest
(-1: a lane's root)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from profiler_server.assembly import calltree as C
from profiler_server.assembly.calltree import AssembledRequest, LaneTree, RequestMeta

# Columns of Forest.extras, as laid out at the start of CallTree.extras values.
EXTRA_COLUMNS = (C.ACTIVE, C.AWAIT, C.READY, C.MAX_SLICE, C.SUSPENSIONS)


def _int64(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _no_waits() -> np.ndarray:
    return np.zeros((3, 0), dtype=np.int64)


@dataclass
class Forest:
    requests: list[RequestMeta]
    lanes: list[list[LaneTree]]  # per request; node indices local to the request
    offsets: np.ndarray  # first node of each request, then the node count
    function: np.ndarray  # its request's session's function id; LANE_ROOT for a lane's root
    parent: np.ndarray
    start: np.ndarray  # monotonic ns
    end: np.ndarray
    self_ns: np.ndarray
    extra_node: np.ndarray  # calls that suspended (generators, coroutines), ascending
    extras: np.ndarray  # shape (len(EXTRA_COLUMNS), len(extra_node))
    outcome_node: np.ndarray  # calls that did not simply return, ascending
    outcome: np.ndarray  # uint8 Outcome per outcome_node
    # each suspension kept with its times (CallTree.waits): node ascending, then time
    wait_node: np.ndarray = field(default_factory=lambda: _int64([]))
    waits: np.ndarray = field(default_factory=_no_waits)  # rows: suspended, ready (-1), resumed
    # calls that a lane waited on (CallTree.charged), ascending; rows: awaiting, ready ns
    charged_node: np.ndarray = field(default_factory=lambda: _int64([]))
    charged: np.ndarray = field(default_factory=lambda: np.zeros((2, 0), dtype=np.int64))

    @classmethod
    def of_trees(cls, assembled: Sequence[AssembledRequest]) -> Forest:
        """The trees the general path built, one request at a time, as one forest."""
        trees = [request.tree for request in assembled]
        offsets = np.cumsum([0, *map(len, trees)])
        bases = offsets[:-1].tolist()
        parent = _int64(list(chain.from_iterable(t.parent for t in trees)))
        parent += np.repeat(offsets[:-1], np.diff(offsets)) * (parent >= 0)
        extras = [
            (n + b, t.extras[n])
            for t, b in zip(trees, bases, strict=True)
            for n in sorted(t.extras)
        ]
        outcomes = [
            (n + b, o)
            for t, b in zip(trees, bases, strict=True)
            for n, o in sorted(t.outcomes.items())
        ]
        waits = [
            (n + b, *times)
            for t, b in zip(trees, bases, strict=True)
            for n, *times in sorted(t.waits)
        ]
        charged = [
            (n + b, *t.charged[n])
            for t, b in zip(trees, bases, strict=True)
            for n in sorted(t.charged)
        ]
        return cls(
            requests=list(assembled),
            lanes=[t.lanes for t in trees],
            offsets=offsets.astype(np.int64),
            function=_int64(list(chain.from_iterable(t.function for t in trees))),
            parent=parent,
            start=_int64(list(chain.from_iterable(t.start for t in trees))),
            end=_int64(list(chain.from_iterable(t.end for t in trees))),
            self_ns=_int64(list(chain.from_iterable(t.self_ns for t in trees))),
            extra_node=_int64([n for n, _ in extras]),
            extras=_int64([[e[c] for _, e in extras] for c in EXTRA_COLUMNS]).reshape(
                len(EXTRA_COLUMNS), len(extras)
            ),
            outcome_node=_int64([n for n, _ in outcomes]),
            outcome=np.array([o for _, o in outcomes], dtype=np.uint8),
            wait_node=_int64([w[0] for w in waits]),
            waits=_int64([w[1:] for w in waits]).T.reshape(3, len(waits)),
            charged_node=_int64([c[0] for c in charged]),
            charged=_int64([c[1:] for c in charged]).T.reshape(2, len(charged)),
        )

    @classmethod
    def concat(cls, forests: Sequence[Forest]) -> Forest:
        bases = np.cumsum([0, *(len(f) for f in forests)])[:-1].tolist()
        return cls(
            requests=[r for f in forests for r in f.requests],
            lanes=[lanes for f in forests for lanes in f.lanes],
            offsets=np.concatenate(
                [[0], *(f.offsets[1:] + b for f, b in zip(forests, bases, strict=True))]
            ).astype(np.int64),
            function=np.concatenate([f.function for f in forests]),
            parent=np.concatenate(
                [
                    np.where(f.parent >= 0, f.parent + b, -1)
                    for f, b in zip(forests, bases, strict=True)
                ]
            ),
            start=np.concatenate([f.start for f in forests]),
            end=np.concatenate([f.end for f in forests]),
            self_ns=np.concatenate([f.self_ns for f in forests]),
            extra_node=np.concatenate(
                [f.extra_node + b for f, b in zip(forests, bases, strict=True)]
            ),
            extras=np.concatenate([f.extras for f in forests], axis=1),
            outcome_node=np.concatenate(
                [f.outcome_node + b for f, b in zip(forests, bases, strict=True)]
            ),
            outcome=np.concatenate([f.outcome for f in forests]),
            wait_node=np.concatenate(
                [f.wait_node + b for f, b in zip(forests, bases, strict=True)]
            ),
            waits=np.concatenate([f.waits for f in forests], axis=1),
            charged_node=np.concatenate(
                [f.charged_node + b for f, b in zip(forests, bases, strict=True)]
            ),
            charged=np.concatenate([f.charged for f in forests], axis=1),
        )

    def __len__(self) -> int:
        return len(self.function)

    def owner(self) -> np.ndarray:
        """The request (index in `requests`) of every node."""
        return np.repeat(np.arange(len(self.requests)), np.diff(self.offsets))

    def calls(self) -> list[int]:
        """Calls per request: its nodes but the lanes' roots."""
        sizes = np.diff(self.offsets).tolist()
        return [size - len(lanes) for size, lanes in zip(sizes, self.lanes, strict=True)]
