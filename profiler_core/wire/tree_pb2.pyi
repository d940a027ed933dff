from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StoredLane(_message.Message):
    __slots__ = ("id", "kind", "name", "root", "parent_lane", "parent_node")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    PARENT_LANE_FIELD_NUMBER: _ClassVar[int]
    PARENT_NODE_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: int
    name: str
    root: int
    parent_lane: int
    parent_node: int
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[int] = ..., name: _Optional[str] = ..., root: _Optional[int] = ..., parent_lane: _Optional[int] = ..., parent_node: _Optional[int] = ...) -> None: ...

class StoredTree(_message.Message):
    __slots__ = ("functions", "lanes", "parent", "function", "start_delta_ns", "duration_ns", "self_ns", "suspended_node", "active_ns", "await_ns", "ready_ns", "max_slice_ns", "suspensions", "outcome_node", "outcome", "wait_node", "wait_start_ns", "wait_ready_ns", "wait_ns", "charged_node", "charged_await_ns", "charged_ready_ns")
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    START_DELTA_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_NS_FIELD_NUMBER: _ClassVar[int]
    SELF_NS_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_NODE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_NS_FIELD_NUMBER: _ClassVar[int]
    AWAIT_NS_FIELD_NUMBER: _ClassVar[int]
    READY_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_SLICE_NS_FIELD_NUMBER: _ClassVar[int]
    SUSPENSIONS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_NODE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    WAIT_NODE_FIELD_NUMBER: _ClassVar[int]
    WAIT_START_NS_FIELD_NUMBER: _ClassVar[int]
    WAIT_READY_NS_FIELD_NUMBER: _ClassVar[int]
    WAIT_NS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_NODE_FIELD_NUMBER: _ClassVar[int]
    CHARGED_AWAIT_NS_FIELD_NUMBER: _ClassVar[int]
    CHARGED_READY_NS_FIELD_NUMBER: _ClassVar[int]
    functions: _containers.RepeatedScalarFieldContainer[str]
    lanes: _containers.RepeatedCompositeFieldContainer[StoredLane]
    parent: _containers.RepeatedScalarFieldContainer[int]
    function: _containers.RepeatedScalarFieldContainer[int]
    start_delta_ns: _containers.RepeatedScalarFieldContainer[int]
    duration_ns: _containers.RepeatedScalarFieldContainer[int]
    self_ns: _containers.RepeatedScalarFieldContainer[int]
    suspended_node: _containers.RepeatedScalarFieldContainer[int]
    active_ns: _containers.RepeatedScalarFieldContainer[int]
    await_ns: _containers.RepeatedScalarFieldContainer[int]
    ready_ns: _containers.RepeatedScalarFieldContainer[int]
    max_slice_ns: _containers.RepeatedScalarFieldContainer[int]
    suspensions: _containers.RepeatedScalarFieldContainer[int]
    outcome_node: _containers.RepeatedScalarFieldContainer[int]
    outcome: bytes
    wait_node: _containers.RepeatedScalarFieldContainer[int]
    wait_start_ns: _containers.RepeatedScalarFieldContainer[int]
    wait_ready_ns: _containers.RepeatedScalarFieldContainer[int]
    wait_ns: _containers.RepeatedScalarFieldContainer[int]
    charged_node: _containers.RepeatedScalarFieldContainer[int]
    charged_await_ns: _containers.RepeatedScalarFieldContainer[int]
    charged_ready_ns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, functions: _Optional[_Iterable[str]] = ..., lanes: _Optional[_Iterable[_Union[StoredLane, _Mapping]]] = ..., parent: _Optional[_Iterable[int]] = ..., function: _Optional[_Iterable[int]] = ..., start_delta_ns: _Optional[_Iterable[int]] = ..., duration_ns: _Optional[_Iterable[int]] = ..., self_ns: _Optional[_Iterable[int]] = ..., suspended_node: _Optional[_Iterable[int]] = ..., active_ns: _Optional[_Iterable[int]] = ..., await_ns: _Optional[_Iterable[int]] = ..., ready_ns: _Optional[_Iterable[int]] = ..., max_slice_ns: _Optional[_Iterable[int]] = ..., suspensions: _Optional[_Iterable[int]] = ..., outcome_node: _Optional[_Iterable[int]] = ..., outcome: _Optional[bytes] = ..., wait_node: _Optional[_Iterable[int]] = ..., wait_start_ns: _Optional[_Iterable[int]] = ..., wait_ready_ns: _Optional[_Iterable[int]] = ..., wait_ns: _Optional[_Iterable[int]] = ..., charged_node: _Optional[_Iterable[int]] = ..., charged_await_ns: _Optional[_Iterable[int]] = ..., charged_ready_ns: _Optional[_Iterable[int]] = ...) -> None: ...
