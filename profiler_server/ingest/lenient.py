"""Host messages whose strings are not valid UTF-8, decoded anyway.

protobuf refuses a whole message when one string in it is not UTF-8. Such a message is
read again as a copy of the wire types in which every string is bytes (same field numbers,
so the same wire format); each string that is not UTF-8 is decoded with U+FFFD for its
bad bytes (counted as `unstorable_text`), and the result is an ordinary `HostMessage`.
"""

from __future__ import annotations

from collections import Counter

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from profiler_core.wire import ingest_pb2
from profiler_server.assembly import problems as P

_STRICT = "request_profiler.v1"
_LENIENT = "request_profiler.lenient"


def _lenient_types() -> tuple[type[Message], dict[str, set[str]]]:
    """The lenient HostMessage class, and per message type the fields that were strings."""
    proto = descriptor_pb2.FileDescriptorProto()
    ingest_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = f"lenient/{proto.name}"
    proto.package = _LENIENT
    proto.ClearField("service")
    strings: dict[str, set[str]] = {}
    pending = [(f"{_LENIENT}.{m.name}", m) for m in proto.message_type]
    while pending:
        name, message = pending.pop()
        pending.extend((f"{name}.{m.name}", m) for m in message.nested_type)
        message.options.ClearField("map_entry")  # a map's key cannot be bytes: plain entries
        for field in message.field:
            if field.type == FieldDescriptor.TYPE_STRING:
                field.type = FieldDescriptor.TYPE_BYTES
                strings.setdefault(name, set()).add(field.name)
            if field.type_name:
                field.type_name = field.type_name.replace(f".{_STRICT}.", f".{_LENIENT}.")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    host_message = pool.FindMessageTypeByName(f"{_LENIENT}.HostMessage")
    return message_factory.GetMessageClass(host_message), strings


_HOST_MESSAGE, _STRINGS = _lenient_types()


def decode_repaired(raw: bytes, problems: Counter) -> ingest_pb2.HostMessage:
    """`raw` as a HostMessage, its strings that are not UTF-8 repaired; raises DecodeError
    if it is not a HostMessage even so."""
    lenient = _HOST_MESSAGE.FromString(raw)
    _repair(lenient, problems)
    return ingest_pb2.HostMessage.FromString(lenient.SerializeToString())


def _repair(message: Message, problems: Counter) -> None:
    strings = _STRINGS.get(message.DESCRIPTOR.full_name, set())
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            children = [value] if isinstance(value, Message) else value
            for child in children:
                _repair(child, problems)
        elif field.name in strings:
            try:
                value.decode()
            except UnicodeDecodeError:
                setattr(message, field.name, value.decode(errors="replace").encode())
                problems[P.UNSTORABLE_TEXT] += 1
