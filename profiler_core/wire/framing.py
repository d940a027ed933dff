"""Protocol Buffers framing of a packed repeated field whose payload was encoded in bulk
(by the host's C packer or the server's NumPy encoder): the runtime would take ~30 ns per
value to fill the field from a Python list. The same framing makes an embedded message of
serialized fields, which a parser merges into the field's other occurrences."""

from __future__ import annotations

_LENGTH_DELIMITED = 2  # the wire type of packed repeated fields


_ONE_BYTE = [bytes([value]) for value in range(0x80)]


def varint(value: int) -> bytes:
    if 0 <= value < 0x80:  # most tags and lengths: no loop
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number: int, payload: bytes | bytearray) -> bytes:
    """A length-delimited field, packed repeated or embedded message (nothing when empty,
    as protobuf writes it)."""
    if not payload:
        return b""
    return varint(number << 3 | _LENGTH_DELIMITED) + varint(len(payload)) + payload
