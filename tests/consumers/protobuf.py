"""A decoder of the protobuf wire format, written from the specification and independent of
qmpprof's encoder, so the pprof tests do not check the encoder against itself."""

from __future__ import annotations

Fields = dict[int, list[int | bytes]]


def decode_message(data: bytes) -> Fields:
    """Field number → values (varints as int, length-delimited as bytes)."""
    fields: Fields = {}
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
            fields.setdefault(number, []).append(value)
        elif wire == 2:
            length, pos = read_varint(data, pos)
            fields.setdefault(number, []).append(data[pos : pos + length])
            pos += length
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    assert pos == len(data)
    return fields


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def ints(fields: Fields, number: int) -> list[int]:
    """A repeated integer field, packed or not."""
    out: list[int] = []
    for value in fields.get(number, []):
        if isinstance(value, int):
            out.append(value)
        else:
            pos = 0
            while pos < len(value):
                item, pos = read_varint(value, pos)
                out.append(item)
    return out


def one(fields: Fields, number: int) -> int:
    values = ints(fields, number)
    assert len(values) <= 1
    return values[0] if values else 0


def messages(fields: Fields, number: int) -> list[Fields]:
    return [decode_message(v) for v in fields.get(number, []) if isinstance(v, bytes)]
