"""The request ids a session has stored, to recognise events that arrive after the end.

Hosts number a session's requests 1, 2, 3, ... and they finish in about that order, so the
ids are kept as a watermark (every id up to it is finished) plus the few finished above
it: a few bytes per session instead of one entry per request. When gaps (ids the server
never sees, such as requests a host dropped) keep more than `limit` above the watermark,
the watermark passes the older half of them.
"""

from __future__ import annotations

RECENTLY_FINISHED = 100_000  # finished ids kept one by one above the watermark


class FinishedIds:
    def __init__(self, limit: int = RECENTLY_FINISHED) -> None:
        self.limit = limit
        self.watermark = 0
        self.above: set[int] = set()

    def __contains__(self, request_id: int) -> bool:
        return request_id <= self.watermark or request_id in self.above

    def add(self, request_id: int) -> None:
        if request_id <= self.watermark:
            return
        self.above.add(request_id)
        while self.watermark + 1 in self.above:
            self.watermark += 1
            self.above.discard(self.watermark)
        if len(self.above) > self.limit:
            self.watermark = sorted(self.above)[len(self.above) // 2]
            self.above = {i for i in self.above if i > self.watermark}
