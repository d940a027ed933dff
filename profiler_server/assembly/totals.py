"""Totals as columns, one row per (owner, key): an owner is a request, a minute bucket or a
metric series; a key is a stack or a function. Rows that share both are added up (maxima
keep the larger value), with NumPy over whole groups of requests at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

# The columns: calls, total wall (outermost calls only, for functions), self, active, await,
# ready, longest call, longest active slice; then the time a lane waited with the call as its
# innermost suspended await chain, awaiting and ready (a stack's states beside running, which
# is SELF: over a lane's stacks, SELF + AWAITING + READYING is the lane's wall time).
CALLS, TOTAL, SELF, ACTIVE, AWAIT, READY, MAX, MAX_SLICE, AWAITING, READYING = range(10)
WIDTH = 10
MAXIMA = (MAX, MAX_SLICE)
_COMBINED_LIMIT = 2**62  # owner and key combined into one sort key while it fits in int64


def groups(owner: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numbers the distinct (owner, key) pairs in (owner, key) order: (the pair's number for
    every row, the first row of every pair). `owner` and `key` are int64 and not empty."""
    key_span = int(key.max()) + 1 if key.min() >= 0 else 0
    if key_span and (int(owner.max()) + 1) * key_span < _COMBINED_LIMIT:
        combined = owner * key_span + key
        order = np.argsort(combined, kind="stable")
        combined = combined[order]
        starts = np.empty(len(order), dtype=bool)
        starts[0] = True
        np.not_equal(combined[1:], combined[:-1], out=starts[1:])
    else:
        order = np.lexsort((key, owner))
        o, k = owner[order], key[order]
        starts = np.empty(len(order), dtype=bool)
        starts[0] = True
        starts[1:] = (o[1:] != o[:-1]) | (k[1:] != k[:-1])
    number = np.empty(len(order), dtype=np.int64)
    number[order] = np.cumsum(starts) - 1
    return number, order[starts]


@dataclass
class Totals:
    owner: np.ndarray  # int64 per row
    key: np.ndarray  # int64 per row
    values: np.ndarray  # int64, shape (WIDTH, rows)

    @classmethod
    def empty(cls) -> Totals:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, np.zeros((WIDTH, 0), dtype=np.int64))

    @classmethod
    def grouped(cls, owner: np.ndarray, key: np.ndarray, values: np.ndarray) -> Totals:
        """One row per distinct (owner, key), sorted by owner then key."""
        if not len(owner):
            return cls.empty()
        number, first = groups(owner, key)
        out = np.zeros((WIDTH, len(first)), dtype=np.int64)
        for column in range(WIDTH):
            add = np.maximum if column in MAXIMA else np.add
            add.at(out[column], number, values[column])
        return cls(owner[first], key[first], out)

    @classmethod
    def concat(cls, parts: Sequence[Totals], owner_offsets: Sequence[int]) -> Totals:
        """The parts' rows together; each part's owners shifted by its offset."""
        if not parts:
            return cls.empty()
        return cls(
            np.concatenate([p.owner + o for p, o in zip(parts, owner_offsets, strict=True)]),
            np.concatenate([p.key for p in parts]),
            np.concatenate([p.values for p in parts], axis=1),
        )

    def __len__(self) -> int:
        return len(self.owner)

    def rows(self, columns: Sequence[int] = range(WIDTH)) -> Iterator[tuple[int, int, list]]:
        """(owner, key, the values of `columns`) per row, as Python ints."""
        values = self.values[list(columns)].T.tolist()
        return zip(self.owner.tolist(), self.key.tolist(), values, strict=True)

    def regroup(self, new_owner: np.ndarray) -> Totals:
        """Rows under other owners (`new_owner[old owner]`), rows that now share one added up."""
        return Totals.grouped(new_owner[self.owner], self.key, self.values)

    def select(self, keep: np.ndarray) -> Totals:
        """Only the rows of owners where `keep` (bool per owner) is set, owners renumbered."""
        rows = keep[self.owner]
        renumber = np.cumsum(keep) - 1
        return Totals(renumber[self.owner[rows]], self.key[rows], self.values[:, rows])
