"""Types of `profiler_host._counts` (`_counts.c`): every request's count in C, twin of
`request_counts.CountTable`."""

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, final

@final
class Awaiting:
    """An ASGI request that is not sampled, as its server awaits it (`Counted.run`)."""

    def __await__(self) -> Generator[Any, Any, Any]: ...
    def __iter__(self) -> Awaiting: ...
    def __next__(self) -> Any: ...
    def send(self, value: Any, /) -> Any: ...
    def throw(self, exception: Any, /, *args: Any) -> Any: ...
    def close(self) -> None: ...

@final
class Counted:
    """A request that is not sampled, timed and counted (`CountTable.counted`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def fail(self) -> None: ...
    def end(self, route: str | None = None, /) -> None: ...
    def run(
        self,
        app: Callable[[Any, Any, Any], Awaitable[Any]],
        scope: Mapping[str, Any],
        receive: Any,
        route_of: Callable[[Mapping[str, Any]], str | None],
        /,
    ) -> Awaiting: ...

@final
class AsgiRoute:
    """`routes.asgi_route` in C for the common case."""

    def __new__(
        cls,
        leaf_types: set[type],
        python: Callable[[Mapping[str, Any]], str | None],
        named: str,
    ) -> AsgiRoute: ...
    def __call__(self, scope: Mapping[str, Any], /) -> str | None: ...

@final
class Dispatch:
    """The ASGI middleware's dispatch, in C for a request that is not sampled."""

    __self__: Any
    def __new__(
        cls,
        app: Callable[[Any, Any, Any], Awaitable[Any]],
        runtime: dict[str, Any],
        fallback: Callable[[Any, Any, Any], Awaitable[Any]],
        sampled: Callable[..., Awaitable[Any]],
        route_of: Callable[[Mapping[str, Any]], str | None],
        middleware: Any,
    ) -> Dispatch: ...
    def __call__(self, scope: Any, receive: Any, send: Any, /) -> Awaitable[Any]: ...

@final
class CountTable:
    """Every request counted (see `profiler_host.request_counts`)."""

    waiting: bool
    lost: int
    @property
    def pending(self) -> bool: ...
    def __init__(
        self,
        bounds: Sequence[int],
        max_routes: int,
        max_route_chars: int,
        max_methods: int,
        max_method_chars: int,
        other: str,
        wake: Callable[[], object],
    ) -> None: ...
    def add(self, route: str, method: str, status: int, duration_ns: int, /) -> None: ...
    def take(self) -> list[tuple[str, str, int, int, int, list[int]]]: ...
    def counted(
        self,
        target: Callable[..., Any],
        path: str,
        method: str,
        environ: Mapping[str, Any] | None = None,
        route_of: Callable[[Mapping[str, Any]], str | None] | None = None,
        /,
    ) -> Counted: ...
