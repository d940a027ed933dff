"""Stack signatures: root->leaf `module:qualname` frames joined by `;`."""

from __future__ import annotations

from collections.abc import Sequence

SEPARATOR = ";"
ELISION = "…"
# Prometheus' label_value_length_limit and Mimir/Grafana Cloud cut label values at 2,048
# UTF-8 bytes; one longer value fails the whole scrape.
MAX_LABEL_BYTES = 2048


def signature(frames: Sequence[str]) -> str:
    return SEPARATOR.join(frames)


def _size(text: str) -> int:
    return len(text.encode())


def cap_label(text: str, limit: int = MAX_LABEL_BYTES) -> str:
    """Any label value cut to `limit` UTF-8 bytes (its start kept, `…` at the end)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - _size(ELISION)].decode(errors="ignore") + ELISION


def label_value(sig: str, limit: int = MAX_LABEL_BYTES) -> str:
    """A signature shortened to `limit` UTF-8 bytes by eliding middle frames.

    The root frames (where the request entered) and the leaf frames (where time is
    spent) are what a reader needs; the middle is replaced by one `…` frame.
    """
    if _size(sig) <= limit:
        return sig
    frames = sig.split(SEPARATOR)
    head: list[str] = []
    tail: list[str] = []
    budget = limit - _size(ELISION) - 2 * len(SEPARATOR)
    left, right = 0, len(frames) - 1
    take_tail = True
    while left <= right:
        frame = frames[right] if take_tail else frames[left]
        cost = _size(frame) + len(SEPARATOR)
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
        keep = frames[-1].encode()[-(limit - _size(ELISION)) :]
        return ELISION + keep.decode(errors="ignore")
    return SEPARATOR.join([*head, ELISION, *reversed(tail)])
