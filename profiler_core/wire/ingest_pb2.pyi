from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FunctionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FUNCTION: _ClassVar[FunctionKind]
    GENERATOR: _ClassVar[FunctionKind]
    COROUTINE: _ClassVar[FunctionKind]
    ASYNC_GENERATOR: _ClassVar[FunctionKind]

class LaneKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MAIN: _ClassVar[LaneKind]
    TASK: _ClassVar[LaneKind]
    THREAD: _ClassVar[LaneKind]
    EXECUTOR: _ClassVar[LaneKind]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTER: _ClassVar[EventKind]
    EXIT: _ClassVar[EventKind]
    EXIT_EXCEPTION: _ClassVar[EventKind]
    SUSPEND: _ClassVar[EventKind]
    RESUME: _ClassVar[EventKind]
    READY: _ClassVar[EventKind]
    EXIT_CANCELLED: _ClassVar[EventKind]
FUNCTION: FunctionKind
GENERATOR: FunctionKind
COROUTINE: FunctionKind
ASYNC_GENERATOR: FunctionKind
MAIN: LaneKind
TASK: LaneKind
THREAD: LaneKind
EXECUTOR: LaneKind
ENTER: EventKind
EXIT: EventKind
EXIT_EXCEPTION: EventKind
SUSPEND: EventKind
RESUME: EventKind
READY: EventKind
EXIT_CANCELLED: EventKind

class HostMessage(_message.Message):
    __slots__ = ("hello", "batch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    batch: Batch
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("session_id", "service", "hostname", "pid", "python_version", "wall_ns", "monotonic_ns", "profiler_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    WALL_NS_FIELD_NUMBER: _ClassVar[int]
    MONOTONIC_NS_FIELD_NUMBER: _ClassVar[int]
    PROFILER_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: bytes
    service: str
    hostname: str
    pid: int
    python_version: str
    wall_ns: int
    monotonic_ns: int
    profiler_version: str
    def __init__(self, session_id: _Optional[bytes] = ..., service: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., python_version: _Optional[str] = ..., wall_ns: _Optional[int] = ..., monotonic_ns: _Optional[int] = ..., profiler_version: _Optional[str] = ...) -> None: ...

class FunctionDef(_message.Message):
    __slots__ = ("id", "module", "qualname", "file", "line", "kind")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    QUALNAME_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    id: int
    module: str
    qualname: str
    file: str
    line: int
    kind: FunctionKind
    def __init__(self, id: _Optional[int] = ..., module: _Optional[str] = ..., qualname: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., kind: _Optional[_Union[FunctionKind, str]] = ...) -> None: ...

class RequestStart(_message.Message):
    __slots__ = ("request_id", "route", "method", "start_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    route: str
    method: str
    start_ns: int
    def __init__(self, request_id: _Optional[int] = ..., route: _Optional[str] = ..., method: _Optional[str] = ..., start_ns: _Optional[int] = ...) -> None: ...

class RequestEnd(_message.Message):
    __slots__ = ("request_id", "end_ns", "status", "truncated", "route", "running_lanes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_LANES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    end_ns: int
    status: int
    truncated: bool
    route: str
    running_lanes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[int] = ..., end_ns: _Optional[int] = ..., status: _Optional[int] = ..., truncated: _Optional[bool] = ..., route: _Optional[str] = ..., running_lanes: _Optional[_Iterable[int]] = ...) -> None: ...

class Lane(_message.Message):
    __slots__ = ("request_id", "lane_id", "kind", "name", "parent_lane", "parent_call", "start_ns")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LANE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_LANE_FIELD_NUMBER: _ClassVar[int]
    PARENT_CALL_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    lane_id: int
    kind: LaneKind
    name: str
    parent_lane: int
    parent_call: int
    start_ns: int
    def __init__(self, request_id: _Optional[int] = ..., lane_id: _Optional[int] = ..., kind: _Optional[_Union[LaneKind, str]] = ..., name: _Optional[str] = ..., parent_lane: _Optional[int] = ..., parent_call: _Optional[int] = ..., start_ns: _Optional[int] = ...) -> None: ...

class Events(_message.Message):
    __slots__ = ("run_request", "run_lane", "run_length", "kind", "function", "call", "time_delta", "base_ns")
    RUN_REQUEST_FIELD_NUMBER: _ClassVar[int]
    RUN_LANE_FIELD_NUMBER: _ClassVar[int]
    RUN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    TIME_DELTA_FIELD_NUMBER: _ClassVar[int]
    BASE_NS_FIELD_NUMBER: _ClassVar[int]
    run_request: _containers.RepeatedScalarFieldContainer[int]
    run_lane: _containers.RepeatedScalarFieldContainer[int]
    run_length: _containers.RepeatedScalarFieldContainer[int]
    kind: bytes
    function: _containers.RepeatedScalarFieldContainer[int]
    call: _containers.RepeatedScalarFieldContainer[int]
    time_delta: _containers.RepeatedScalarFieldContainer[int]
    base_ns: int
    def __init__(self, run_request: _Optional[_Iterable[int]] = ..., run_lane: _Optional[_Iterable[int]] = ..., run_length: _Optional[_Iterable[int]] = ..., kind: _Optional[bytes] = ..., function: _Optional[_Iterable[int]] = ..., call: _Optional[_Iterable[int]] = ..., time_delta: _Optional[_Iterable[int]] = ..., base_ns: _Optional[int] = ...) -> None: ...

class Drops(_message.Message):
    __slots__ = ("requests", "events")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class EventsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.ScalarMap[str, int]
    events: _containers.ScalarMap[str, int]
    def __init__(self, requests: _Optional[_Mapping[str, int]] = ..., events: _Optional[_Mapping[str, int]] = ...) -> None: ...

class RouteCount(_message.Message):
    __slots__ = ("route", "method", "status_class", "count", "duration_ns_sum", "buckets")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    STATUS_CLASS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_SUM_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    route: str
    method: str
    status_class: int
    count: int
    duration_ns_sum: int
    buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, route: _Optional[str] = ..., method: _Optional[str] = ..., status_class: _Optional[int] = ..., count: _Optional[int] = ..., duration_ns_sum: _Optional[int] = ..., buckets: _Optional[_Iterable[int]] = ...) -> None: ...

class RouteCounts(_message.Message):
    __slots__ = ("wall_ns", "routes")
    WALL_NS_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    wall_ns: int
    routes: _containers.RepeatedCompositeFieldContainer[RouteCount]
    def __init__(self, wall_ns: _Optional[int] = ..., routes: _Optional[_Iterable[_Union[RouteCount, _Mapping]]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("seq", "functions", "request_starts", "lanes", "events", "request_ends", "drops", "route_counts")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_STARTS_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ENDS_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    functions: _containers.RepeatedCompositeFieldContainer[FunctionDef]
    request_starts: _containers.RepeatedCompositeFieldContainer[RequestStart]
    lanes: _containers.RepeatedCompositeFieldContainer[Lane]
    events: Events
    request_ends: _containers.RepeatedCompositeFieldContainer[RequestEnd]
    drops: Drops
    route_counts: RouteCounts
    def __init__(self, seq: _Optional[int] = ..., functions: _Optional[_Iterable[_Union[FunctionDef, _Mapping]]] = ..., request_starts: _Optional[_Iterable[_Union[RequestStart, _Mapping]]] = ..., lanes: _Optional[_Iterable[_Union[Lane, _Mapping]]] = ..., events: _Optional[_Union[Events, _Mapping]] = ..., request_ends: _Optional[_Iterable[_Union[RequestEnd, _Mapping]]] = ..., drops: _Optional[_Union[Drops, _Mapping]] = ..., route_counts: _Optional[_Union[RouteCounts, _Mapping]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("ack", "config")
    ACK_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    config: Config
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ..., config: _Optional[_Union[Config, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("stored", "rejected")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    stored: _containers.RepeatedScalarFieldContainer[int]
    rejected: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, stored: _Optional[_Iterable[int]] = ..., rejected: _Optional[_Iterable[int]] = ...) -> None: ...

class Config(_message.Message):
    __slots__ = ("settings",)
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.ScalarMap[str, str]
    def __init__(self, settings: _Optional[_Mapping[str, str]] = ...) -> None: ...
