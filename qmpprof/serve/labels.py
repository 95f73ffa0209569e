"""String labels added to every sample of an encoded pprof profile (`vm` for `serve`).

The profile is the one `output/pprof.py` writes for `record -o x.pb.gz`; the labels are
added to its bytes rather than to the writer, so the two stay one format. profile.proto
merges a message's repeated fields wherever they occur, so each Sample message (field 2)
gets its Label messages (field 3) appended, and each new string goes at the end of the
string table (field 6), where its index is the count of strings before it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from qmpprof.output.pprof import bytes_field, uint_field

_SAMPLE, _LABEL, _STRING = 2, 3, 6
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def with_labels(profile: bytes, labels: Sequence[tuple[str, str]]) -> bytes:
    """`profile` (an uncompressed profile.proto) with every sample labelled `labels`
    (key, value). Raises ValueError for bytes that are not a protobuf message."""
    fields = list(_fields(profile))
    strings = sum(1 for number, _, _ in fields if number == _STRING)
    added = [text for pair in labels for text in pair]
    encoded = b"".join(
        bytes_field(_LABEL, uint_field(1, strings + 2 * i) + uint_field(2, strings + 2 * i + 1))
        for i in range(len(labels))
    )
    out = [
        bytes_field(_SAMPLE, payload + encoded) if number == _SAMPLE else whole
        for number, whole, payload in fields
    ]
    out += [bytes_field(_STRING, text.encode("utf-8")) for text in added]
    return b"".join(out)


def _fields(message: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """Each top-level field: its number, its bytes as written, and its payload (a
    length-delimited field's contents; else empty)."""
    pos = 0
    while pos < len(message):
        start = pos
        key, pos = _varint(message, pos)
        wire, payload = key & 7, b""
        if wire == _VARINT:
            _, pos = _varint(message, pos)
        elif wire == _LENGTH:
            length, pos = _varint(message, pos)
            payload, pos = message[pos : pos + length], pos + length
        elif wire in (_FIXED64, _FIXED32):
            pos += 8 if wire == _FIXED64 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {start}")
        if pos > len(message):
            raise ValueError("protobuf field runs past the end")
        yield key >> 3, message[start:pos], payload


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos
    raise ValueError("protobuf varint runs past the end")
