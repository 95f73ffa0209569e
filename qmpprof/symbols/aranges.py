"""Address → compilation unit, from the bytes of a .debug_aranges section.

pyelftools parses the section through construct, about 2 s on a distribution kernel's
(180 KB, 30,000 ranges), where a dump needs a few lookups. This reads it with struct.

The section is untrusted: every length is checked against the bytes left, a set ends at
its stated length or at the section's end, whichever is first, and garbage ends the read
with what was read so far: nothing here raises.
"""

from __future__ import annotations

import bisect
import struct

#: A set's header: unit_length (4 bytes, or 0xffffffff and 8 bytes), version (2),
#: debug_info offset (4 or 8), address size (1), segment selector size (1).
_DWARF64_ESCAPE = 0xFFFFFFFF
_RESERVED_LENGTHS = 0xFFFFFFF0
_ADDRESS_FORMATS = {4: "I", 8: "Q"}


class ArangeIndex:
    """(start, length, CU offset) of every range, sorted by start (ties in file order)."""

    def __init__(self, entries: list[tuple[int, int, int]]) -> None:
        entries.sort(key=lambda entry: entry[0])
        self.entries = entries
        self._starts = [start for start, _, _ in entries]

    def unit_at(self, address: int) -> int | None:
        """The offset of the CU whose range holds `address`: the range starting closest
        below it (as pyelftools and readelf pick), or None."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start, length, offset = self.entries[index]
        return offset if address < start + length else None


def read_aranges(data: bytes, little_endian: bool = True) -> ArangeIndex:
    """Every range of every well-formed set in `data` (a .debug_aranges section)."""
    order = "<" if little_endian else ">"
    found: list[tuple[int, int, int]] = []
    offset = 0
    while offset + 4 <= len(data):
        header = _set_header(data, offset, order)
        if header is None:
            break
        end, first, offset_of_unit, address_format = header
        if address_format is not None:
            found += _set_ranges(data, first, end, offset_of_unit, order + address_format * 2)
        offset = end
    return ArangeIndex(found)


def _set_header(data: bytes, offset: int, order: str) -> tuple[int, int, int, str | None] | None:
    """(end of the set, offset of its first range, CU offset, struct code of an address
    or None when the set cannot be read), or None when nothing after `offset` can."""
    (length,) = struct.unpack_from(order + "I", data, offset)
    offset_format, position = "I", offset + 4
    if length == _DWARF64_ESCAPE:
        if position + 8 > len(data):
            return None
        (length,) = struct.unpack_from(order + "Q", data, position)
        offset_format, position = "Q", position + 8
    elif length >= _RESERVED_LENGTHS:
        return None
    end = min(position + length, len(data))
    header_size = 2 + struct.calcsize(offset_format) + 2
    if position + header_size > end:
        return (end, end, 0, None) if end > offset else None
    _, unit, address_size, segment_size = struct.unpack_from(
        order + "H" + offset_format + "BB", data, position
    )
    # The first range is aligned on a range's size, counted from the section's start.
    tuple_size = 2 * address_size
    first = position + header_size
    if tuple_size:
        first = -(-first // tuple_size) * tuple_size
    address_format = _ADDRESS_FORMATS.get(address_size) if segment_size == 0 else None
    return end, first, unit, address_format


def _set_ranges(
    data: bytes, position: int, end: int, unit: int, pair_format: str
) -> list[tuple[int, int, int]]:
    """The set's ranges from `position` to its (0, 0) terminator or its end."""
    pair = struct.Struct(pair_format)
    count = max(0, (end - position) // pair.size)
    ranges = []
    for start, length in pair.iter_unpack(data[position : position + count * pair.size]):
        if start == 0 and length == 0:
            break
        ranges.append((start, length, unit))
    return ranges
