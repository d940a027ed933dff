"""Which requests are recorded: a target rate per process, so the chance falls as load rises.

The arrival rate is smoothed over one-second windows; a request is sampled with
probability `rate / arrivals`, and never more than `rate` per second of a window: after
a quiet spell the smoothed rate is low, and a burst would otherwise be sampled far above
the target. The first request of each route shape in every `route_interval` is sampled
regardless, so rare routes show up. Paths are shaped
(numeric and id-like segments folded) so `/orders/17` and `/orders/18` are one route.

Every request pays for the decision, sampled or not. `profiler_host._sampling` makes the
same decision in C for about a tenth of this reference's cost (`new_sampler` picks it),
keying each shape by a hash of it instead of building it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from time import monotonic

from profiler_host import native

_HEX_ID = frozenset("0123456789abcdefABCDEF-")
MAX_ROUTES = 1000  # route shapes remembered
HEX_ID_LENGTH = 16  # hex-and-dash segments this long or longer are ids


def route_shape(path: str) -> str:
    """Numbers and hex ids of 16 characters or more (UUIDs, hashes) become `:id`. Runs for
    every request, sampled or not: string methods, no regex."""
    return "/".join(
        [
            ":id"
            if seg.isdecimal() or (len(seg) >= HEX_ID_LENGTH and _HEX_ID.issuperset(seg))
            else seg
            for seg in path.split("/")
        ]
    )


class Sampler:
    def __init__(
        self,
        rate: float,
        route_interval: float = 60.0,
        clock: Callable[[], float] = monotonic,
        chance: Callable[[], float] = random.random,
    ) -> None:
        self.rate = rate
        self.route_interval = route_interval
        self._clock = clock
        self._chance = chance
        now = clock()
        self._window_start = now
        self._window_count = 0
        self._window_sampled = 0
        self._arrivals = rate  # smoothed requests per second
        self._routes: dict[str, float] = {}
        self.seen = 0  # requests decided on, sampled or not

    @property
    def probability(self) -> float:
        return min(1.0, self.rate / self._arrivals) if self._arrivals > 0 else 1.0

    def decide(self, path: str) -> bool:
        """Counts the arrival and says whether to record it."""
        self.seen += 1
        if self.rate <= 0:
            return False
        now = self._clock()
        self._window_count += 1
        elapsed = now - self._window_start
        if elapsed >= 1.0:
            self._arrivals = 0.5 * self._arrivals + 0.5 * (self._window_count / elapsed)
            self._window_start, self._window_count, self._window_sampled = now, 0, 0
        shape = route_shape(path)
        last = self._routes.get(shape)
        due = last is None or now - last >= self.route_interval
        if due and (last is not None or len(self._routes) < MAX_ROUTES):
            self._routes[shape] = now
            return True
        if self._window_sampled >= self.rate * max(elapsed, 1.0):
            return False
        # within the current window, arrivals beyond the smoothed rate lower the chance too
        current = self._window_count / max(elapsed, 1.0)
        if self._chance() < min(1.0, self.rate / max(self._arrivals, current, 1e-9)):
            self._window_sampled += 1
            return True
        return False


def new_sampler(rate: float, route_interval: float) -> Sampler:
    """The C sampler when it is built from these sources (see the module's docstring), else
    this one."""
    _sampling = native.extension("_sampling")
    built_for = (getattr(_sampling, "MAX_ROUTES", None), getattr(_sampling, "HEX_ID_LENGTH", None))
    if _sampling is None or built_for != (MAX_ROUTES, HEX_ID_LENGTH):
        return Sampler(rate, route_interval)
    return _sampling.Sampler(rate, route_interval)
