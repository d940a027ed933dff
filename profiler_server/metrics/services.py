"""The `service` and `route` label values /metrics exports, bounded: each is a label value
of every series once admitted, and the server admits at most `limit` services, and at most
`limit` routes per service.

Membership is sticky (a series never moves, so counters never decrease): the first `limit`
to send data are labels, every later one is `(other)`. The sampled requests' series and
every request's series share one membership, so a route is `(other)` in both or in neither.
"""

from __future__ import annotations

import threading

from profiler_core.stacks import cap_label

OTHER = "(other)"


class ServiceLabels:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._members: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, service: str) -> str:
        """The label for `service`: itself (cut to a label's length), or `(other)`."""
        label = cap_label(service)
        if label in self._members:
            return label
        with self._lock:
            if label not in self._members and len(self._members) >= self.limit:
                return OTHER
            self._members.add(label)
        return label


class RouteLabels:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._members: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, service: str, route: str) -> str:
        """The label for `route` of the (already labelled) `service`: the route cut to a
        label's length, or `(other)`."""
        label = cap_label(route)
        with self._lock:
            routes = self._members.setdefault(service, set())
            if label not in routes:
                if len(routes) >= self.limit:
                    return OTHER
                routes.add(label)
        return label
