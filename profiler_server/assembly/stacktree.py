"""Stacks as a prefix tree: a stack is (its parent stack, its leaf function), and its id is
derived from those two ids. Interning, storing and looking up a stack cost the same at any
depth, and a deep stack's prefixes are never repeated: a chain 16,000 calls deep is 16,000
small rows, not 16,000 names of up to 16,000 frames each.

A `a;b;c` name is built only where a stack is shown (API, exports, Prometheus labels), and
bounded: a stack deeper than twice SHOWN_FRAMES keeps its SHOWN_FRAMES outermost and
innermost frames around one `…` frame, so building any name costs at most that many steps.
"""

from __future__ import annotations

import hashlib

from profiler_core.stacks import ELISION, SEPARATOR

EMPTY_ID = 0  # the id of the empty stack: the parent of every outermost call's stack
SHOWN_FRAMES = 256  # frames kept at each end of a shown stack


def stack_id(parent_id: int, function_id: int) -> int:
    """A 63-bit id from the parent stack's id and the leaf function's (signed 64-bit) id:
    the same on every server, like the function ids it is made of."""
    data = parent_id.to_bytes(8, "big", signed=True) + function_id.to_bytes(8, "big", signed=True)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


class StackTree:
    """Stacks by dense index (0: the empty stack), each with its parent, leaf frame name,
    depth, and its ancestor SHOWN_FRAMES deep (-1 while shallower), from which a shown
    name's outer frames are read without walking the middle."""

    def __init__(self) -> None:
        self.parent: list[int] = [0]
        self.frame: list[str] = [""]
        self.depth: list[int] = [0]
        self._anchor: list[int] = [-1]
        self._outer: dict[int, list[str]] = {}  # anchor -> its frames, outermost first

    def __len__(self) -> int:
        return len(self.parent)

    def add(self, parent: int, frame: str) -> int:
        """A new stack one frame deeper than `parent`; returns its index."""
        index = len(self.parent)
        depth = self.depth[parent] + 1
        self.parent.append(parent)
        self.frame.append(frame)
        self.depth.append(depth)
        self._anchor.append(index if depth == SHOWN_FRAMES else self._anchor[parent])
        return index

    def _up(self, index: int, count: int) -> list[str]:
        """The frames of `index` and of its ancestors, innermost first, `count` at most."""
        parent, frame = self.parent, self.frame
        frames = []
        while index and len(frames) < count:
            frames.append(frame[index])
            index = parent[index]
        return frames

    def _outer_frames(self, index: int) -> list[str]:
        """The SHOWN_FRAMES outermost frames of a deeper stack, kept per anchor: the deep
        stacks of one chain share them."""
        anchor = self._anchor[index]
        found = self._outer.get(anchor)
        if found is None:
            found = self._outer[anchor] = self._up(anchor, SHOWN_FRAMES)[::-1]
        return found

    def frames(self, index: int) -> list[str]:
        """The stack's frames, outermost first; the middle of a deep one elided."""
        if self.depth[index] <= 2 * SHOWN_FRAMES:
            return self._up(index, SHOWN_FRAMES * 2)[::-1]
        tail = self._up(index, SHOWN_FRAMES)[::-1]
        return [*self._outer_frames(index), ELISION, *tail]

    def name(self, index: int) -> str:
        return SEPARATOR.join(self.frames(index))
