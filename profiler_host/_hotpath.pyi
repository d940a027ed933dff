"""Types of `profiler_host._hotpath` (`_hotpath.c`): the hooks' hot path in C, twin of
`hooks`, `recording`'s cores, `propagation._PyInLane` and `batching`'s packing."""

from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Final, final, overload

from typing_extensions import disjoint_base

# the constants of `profiler_host.events`, as this build was compiled with them
EVENT_INTS: Final[int]
KIND_BITS: Final[int]
ENTER: Final[int]
EXIT: Final[int]
EXIT_EXCEPTION: Final[int]
SUSPEND: Final[int]
RESUME: Final[int]
READY: Final[int]
EXIT_CANCELLED: Final[int]
TOKEN_LANE: Final[int]
TOKEN_FK: Final[int]
TOKEN_CALL: Final[int]
PLAIN_TOKEN_SIZE: Final[int]
TOKEN_SUSPENDED: Final[int]
TOKEN_STAMP: Final[int]
RESUMABLE_TOKEN_SIZE: Final[int]

@disjoint_base
class RequestCore:
    """The per-request state the hooks touch."""

    event_cap: int
    truncated: bool
    unrecorded: int
    @property
    def calls(self) -> Iterator[int]: ...
    def __init__(self, event_cap: int) -> None: ...

@final
class EventBuffer:
    """A lane's events as 64-bit ints, EVENT_INTS per event."""

    def __new__(cls, values: Sequence[int] = ...) -> EventBuffer: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: int, /) -> int: ...
    @overload
    def __getitem__(self, key: slice, /) -> list[int]: ...
    def __delitem__(self, key: slice, /) -> None: ...
    def extend(self, values: Sequence[int], /) -> None: ...

@disjoint_base
class LaneCore:
    """The per-lane state the hooks touch."""

    thread: int
    record: Callable[[tuple[int, int, int]], object]
    @property
    def buffer(self) -> EventBuffer: ...
    @property
    def request(self) -> Any: ...  # the `recording.Request` it was made with
    def __init__(self, request: RequestCore) -> None: ...

@final
class InLane:
    """InLane(lane, work): work handed to another thread, run once with CURRENT set to lane."""

    def __new__(cls, lane: LaneCore, work: Callable[..., Any]) -> InLane: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

# the tokens `profiler_host.events` describes
@final
class CallToken:
    """A plain call's token: reads as (lane, fid << KIND_BITS, call id)."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...

_PlainToken = CallToken
_ResumableToken = list[Any]

def enter(fid: int, /) -> _PlainToken | None: ...  # in the lane of this context, if any
def enter_resumable(fid: int, /) -> _ResumableToken | None: ...
def exit(token: _PlainToken, /) -> None: ...
def exit_resumable(token: _ResumableToken, /) -> None: ...
def exit_exception(token: _PlainToken | _ResumableToken, exc: BaseException, /) -> None: ...
def suspend(token: _ResumableToken, /) -> None: ...
def resume(token: _ResumableToken, /) -> None: ...
def resume_delegated(token: _ResumableToken, /) -> None: ...
def thrown(token: _ResumableToken, /) -> None: ...
def pack(
    buffer: EventBuffer,
    start: int,
    stop: int,
    previous_ns: int | None,
    kinds: bytearray,
    functions: bytearray,
    calls: bytearray,
    deltas: bytearray,
    /,
) -> tuple[int, int]: ...
def configure(
    own_lane: Callable[[Any], Any],
    failed: Callable[[BaseException | None], None],
    running: dict[Any, list[_ResumableToken]],
    current: ContextVar[Any],
    /,
) -> None: ...
def configure_loop(
    task_type: type, on_step: Callable[[Any, Any, Any], None], gate: list[Any], /
) -> None: ...
def handle_run(original: Callable[..., Any], /) -> Callable[..., Any]: ...  # Handle._run's
def call_soon(original: Callable[..., Any], /) -> Callable[..., Any]: ...  # call_soon's
def gated(original: Callable[..., Any], wrapper: Callable[..., Any], /) -> Callable[..., Any]:
    """The wrapper for a call whose `context=` (or, without one, the caller's context) holds
    a sampled lane while one is in flight; the original for every other call."""
