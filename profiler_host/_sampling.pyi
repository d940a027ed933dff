"""Types of `profiler_host._sampling` (`_sampling.c`): the sampler's decision in C, twin of
`sampler.Sampler` (shapes are hashed while the path is read, never built)."""

from collections.abc import Callable
from typing import Final, final

# sampler.MAX_ROUTES and sampler.HEX_ID_LENGTH, as this build was compiled with them
MAX_ROUTES: Final[int]
HEX_ID_LENGTH: Final[int]

@final
class Sampler:
    """Which requests are recorded (see `profiler_host.sampler`)."""

    @property
    def rate(self) -> float: ...
    @property
    def route_interval(self) -> float: ...
    @property
    def probability(self) -> float: ...
    @property
    def seen(self) -> int:
        """Requests decided on, sampled or not."""
    def __init__(
        self,
        rate: float,
        route_interval: float = 60.0,
        clock: Callable[[], float] | None = None,
        chance: Callable[[], float] | None = None,
    ) -> None: ...
    def decide(self, path: str, /) -> bool: ...
