"""Stack signatures: root->leaf `module:qualname` frames joined by `;`."""

from __future__ import annotations

from collections.abc import Sequence

SEPARATOR = ";"
ELISION = "…"
# Mimir/Grafana Cloud cut label values at 2,048 characters; a longer one fails the scrape.
MAX_LABEL_CHARS = 2048


def signature(frames: Sequence[str]) -> str:
    return SEPARATOR.join(frames)


def label_value(sig: str, limit: int = MAX_LABEL_CHARS) -> str:
    """Shortens a signature to `limit` characters by eliding middle frames.

    The root frames (where the request entered) and the leaf frames (where time is
    spent) are what a reader needs; the middle is replaced by one `…` frame.
    """
    if len(sig) <= limit:
        return sig
    frames = sig.split(SEPARATOR)
    head: list[str] = []
    tail: list[str] = []
    budget = limit - len(ELISION) - 2 * len(SEPARATOR)
    left, right = 0, len(frames) - 1
    take_tail = True
    while left <= right:
        frame = frames[right] if take_tail else frames[left]
        cost = len(frame) + len(SEPARATOR)
        if cost > budget:
            break
        budget -= cost
        if take_tail:
            tail.append(frame)
            right -= 1
        else:
            head.append(frame)
            left += 1
        take_tail = not take_tail
    if not tail:
        # A single leaf frame longer than the limit: keep its end.
        return ELISION + frames[-1][-(limit - len(ELISION)) :]
    return SEPARATOR.join([*head, ELISION, *reversed(tail)])
