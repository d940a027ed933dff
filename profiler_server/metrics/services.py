"""The `service` and `route` label values /metrics exports, bounded: each is a label value
of every series once admitted, and the server admits at most `limit` services, and at most
`limit` routes per service.

Services are the top `limit` by requests: the first to send data take the places; once all
are taken, a service takes the place of the member with the fewest requests only when it has
had twice as many (so two services of about the same size never swap back and forth). The
one that leaves keeps its series as they were (counters never decrease, and a series plus
`(other)` still adds up to the true total); its later requests count as `(other)`. Requests
are counted per service in a table of at most CANDIDATES times `limit` services (the
Space-Saving scheme: a new service replaces the least counted and starts from its count), so
any number of services costs bounded memory.

Routes keep the first `limit` per service. The sampled requests' series and every request's
series share one membership, so a route is `(other)` in both or in neither.
"""

from __future__ import annotations

import threading

from profiler_core.stacks import cap_label

OTHER = "(other)"
CANDIDATES = 4  # services counted per place
PROMOTION = 2  # times the weakest member's requests a service needs to take its place


class ServiceLabels:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._members: set[str] = set()
        self._counts: dict[str, int] = {}  # label -> requests (an upper bound once evicted)
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

    def count(self, service: str, requests: int) -> None:
        """Counts `requests` more of `service`; it becomes a member if it has had twice
        the requests of the member with the fewest."""
        label = cap_label(service)
        with self._lock:
            counts = self._counts
            if label not in counts and len(counts) >= CANDIDATES * self.limit:
                weakest = min((c for c in counts if c not in self._members), key=counts.__getitem__)
                counts[label] = counts.pop(weakest)
            counts[label] = counts.get(label, 0) + requests
            if label in self._members or len(self._members) < self.limit:
                return
            weakest = min(self._members, key=lambda m: counts.get(m, 0))
            if counts[label] >= PROMOTION * max(counts.get(weakest, 0), 1):
                self._members.discard(weakest)
                self._members.add(label)


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
