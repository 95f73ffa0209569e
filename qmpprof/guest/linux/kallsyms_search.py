"""kallsyms' tables found by their shape, where VMCOREINFO does not say where they are
(Linux before 6.0).

scripts/kallsyms.c writes the tables into .rodata, each 8-byte aligned, in this order
(until 6.4, which moved the address tables; by then VMCOREINFO names every table):
- `kallsyms_offsets` (a u32 per symbol) and `kallsyms_relative_base` (a u64), or
  `kallsyms_addresses` (a u64 per symbol);
- `kallsyms_num_syms` (a u32);
- `kallsyms_names`;
- `kallsyms_markers`: a u32 per 256 symbols, where the names of symbol 0, 256, ... start;
- `kallsyms_token_table`: 256 NUL-terminated tokens;
- `kallsyms_token_index`: 256 u16s, where each token starts.

The token table is found first: every character a name uses is its own token, so the
ten digits are ten one-character tokens in a row ("0\\0" ... "9\\0"). The index after it
must point at every token and end where the table does; the markers before it must
rise from 0; and a count before the names must give names whose every 256th starts
where its marker says and whose last ends where the markers start. What the address
table holds is then checked by kallsyms.decode (the encoding that puts `_stext` where
VMCOREINFO says), as for tables VMCOREINFO names.

The image is the guest's, so hostile: the search and every table it reads are bounded,
and a candidate that does not check is passed over.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator

from qmpprof.errors import BadGuestKernel, MemoryFault
from qmpprof.guest.linux.kallsyms import (
    MAX_NAME_TOKENS,
    MAX_SYMBOLS,
    ImageRead,
    KallsymsTables,
    name_length,
)

DIGITS = b"".join(b"%d\0" % digit for digit in range(10))
#: The image is searched in pieces of this size.
SEARCH_CHUNK = 1 << 20
#: Runs of digit tokens checked at most (a guest's rodata may hold more as strings).
MAX_CANDIDATES = 64
_TOKENS = 256
#: The token table is a few kilobytes; the digits' tokens are in its first quarter.
MAX_TOKEN_TABLE = 1 << 14
#: kallsyms_markers: one per 256 symbols.
MAX_MARKERS = MAX_SYMBOLS // 256
#: The bytes of the last 256 names at most (a length of two bytes, then the tokens).
_LAST_NAMES = 256 * (2 + MAX_NAME_TOKENS)
_ALIGN = 8


def find_tables(read: ImageRead, start: int, end: int) -> list[KallsymsTables]:
    """The kallsyms tables in the image's [start, end), each way their address table
    may be laid out (relative offsets first, then absolute addresses). Raises
    BadGuestKernel when no tables of that shape are there."""
    for candidate, digits in enumerate(_digit_runs(read, start, end)):
        if candidate >= MAX_CANDIDATES:
            break
        try:
            return _tables_at(read, digits)
        except (BadGuestKernel, MemoryFault):
            continue
    raise BadGuestKernel(
        "VMCOREINFO does not say where kallsyms is (Linux before 6.0), and no tables of "
        "its shape are in the kernel image"
    )


def _digit_runs(read: ImageRead, start: int, end: int) -> Iterator[int]:
    """Where "0\\0" ... "9\\0" lies in [start, end), each right after a NUL."""
    overlap = len(DIGITS)
    at = start
    while at < end:
        size = min(SEARCH_CHUNK + overlap, end - at)
        chunk = read(at, size)
        found = chunk.find(DIGITS, 1)
        while 0 <= found < SEARCH_CHUNK:
            if chunk[found - 1] == 0:
                yield at + found
            found = chunk.find(DIGITS, found + 1)
        at += SEARCH_CHUNK


def _tables_at(read: ImageRead, digits: int) -> list[KallsymsTables]:
    """The tables around the token "0" at `digits`. Raises BadGuestKernel."""
    token_table, token_index = _token_tables(read, digits)
    markers_at, markers = _markers(read, token_table)
    names, count = _names(read, markers_at, markers)
    base = names - 2 * _ALIGN
    offsets = (base - 4 * count) & ~(_ALIGN - 1)
    addresses = names - _ALIGN - 8 * count
    shared = (names, names - _ALIGN, token_table, token_index)
    return [
        KallsymsTables(*shared, offsets=offsets, relative_base=base, addresses=None),
        KallsymsTables(*shared, offsets=None, relative_base=None, addresses=addresses),
    ]


def _token_tables(read: ImageRead, digits: int) -> tuple[int, int]:
    """The token table and its index: the first aligned place after the digits where 256
    u16s point at 256 tokens ending there. Raises BadGuestKernel."""
    window_at = digits - MAX_TOKEN_TABLE
    window = read(window_at, 2 * MAX_TOKEN_TABLE + 2 * _TOKENS)
    first = (digits + len(DIGITS) + _ALIGN - 1) & ~(_ALIGN - 1)
    for index_at in range(first, digits + MAX_TOKEN_TABLE, _ALIGN):
        at = index_at - window_at
        if window[at : at + 2] != b"\0\0":
            continue
        index = array("H", window[at : at + 2 * _TOKENS])
        table_at = digits - index[ord("0")]
        if _index_fits(window, table_at - window_at, at, index):
            return table_at, index_at
    raise BadGuestKernel("no kallsyms token index after the digits")


def _index_fits(window: bytes, table: int, end: int, index: array[int]) -> bool:
    """Whether `index` points at the NUL-terminated tokens of window[table:] and the
    last ends within the alignment before `end`."""
    if table < 0 or any(index[i] >= index[i + 1] for i in range(_TOKENS - 1)):
        return False
    starts = [table + offset for offset in index]
    if any(window[start - 1] != 0 for start in starts[1:]):
        return False
    last = window.find(b"\0", starts[-1], end)
    return last >= 0 and 0 <= end - (last + 1) < _ALIGN


def _markers(read: ImageRead, token_table: int) -> tuple[int, list[int]]:
    """kallsyms_markers, right before the token table: rising from 0, perhaps with four
    bytes of padding after. Raises BadGuestKernel."""
    size = 4 * MAX_MARKERS
    before = array("I", read(token_table - size, size))
    last = len(before) - (1 if before[-1] == 0 and len(before) > 1 and before[-2] else 0)
    first = last - 1
    while first > 0 and 0 < before[first - 1] < before[first]:
        first -= 1
    if first > 0 and before[first - 1] == 0 and before[first] > 0:
        first -= 1
    markers = before[first:last].tolist()
    if not markers or markers[0] != 0:
        raise BadGuestKernel("no kallsyms markers before the token table")
    return token_table - 4 * (len(before) - first), markers


def _names(read: ImageRead, markers_at: int, markers: list[int]) -> tuple[int, int]:
    """Where kallsyms_names starts and the symbol count: a count before it whose names
    match the markers and end where they start. Raises BadGuestKernel."""
    highest = markers_at - markers[-1]
    lowest = highest - _LAST_NAMES - _ALIGN
    region = read(lowest, markers_at - lowest)
    low_count, high_count = 256 * (len(markers) - 1), 256 * len(markers)
    for names in range(highest & ~(_ALIGN - 1), lowest + _ALIGN, -_ALIGN):
        at = names - lowest
        count = struct.unpack_from("<I", region, at - _ALIGN)[0]
        if low_count < count <= high_count and _names_fit(region, at, count, markers):
            return names, count
    raise BadGuestKernel("no kallsyms names before the markers")


def _names_fit(region: bytes, at: int, count: int, markers: list[int]) -> bool:
    """Whether `count` names from region[at:] start where the markers say and end
    within the alignment before the region's end."""
    offset = at
    try:
        for symbol in range(count):
            if symbol % 256 == 0 and offset - at != markers[symbol // 256]:
                return False
            length, offset = name_length(region, offset)
            if length == 0:
                return False
            offset += length
    except BadGuestKernel:
        return False
    return 0 <= len(region) - offset < _ALIGN
