"""A kernel's BTF found by its header, for a kernel whose kallsyms does not say where it is.

kallsyms names `__start_BTF` only with CONFIG_KALLSYMS_ALL, which Debian's arm64 kernels
lack. The BTF is then looked for in the image's read-only data (after `_etext`, before
the init text): a little-endian version 1 header of the size every kernel writes, whose
type and string sections follow it back to back, with a string section that starts with
the empty name and ends with a NUL. What is found is only a candidate: the guest wrote
it, and guest/btf.py bounds what it reads, as for any BTF.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from qmpprof.errors import BadGuestKernel, MemoryFault

#: What a kernel's BTF starts with: magic 0xEB9F, version 1, no flags, a 24-byte header.
HEADER_START = b"\x9f\xeb\x01\x00\x18\x00\x00\x00"
_HEADER = struct.Struct("<8sIIII")
#: The image is read in pieces of this size, each overlapping the next by a header.
_CHUNK = 1 << 20
#: The largest BTF taken (Debian's 6.12 has 6 MB).
MAX_BTF = 64 << 20
#: Candidate headers looked at, at most: a guest may plant many.
MAX_CANDIDATES = 64

#: Reads the image by link address. Raises MemoryFault or BadGuestKernel.
LinkedRead = Callable[[int, int], bytes]


def find_btf(read: LinkedRead, start: int, end: int) -> bytes | None:
    """The first BTF blob of a kernel's shape whose header lies in [start, end)."""
    for at in _headers(read, start, end):
        try:
            header = read(at, _HEADER.size)
            size = blob_size(header)
            if size is None:
                continue
            data = read(at, size)
        except (MemoryFault, BadGuestKernel):
            continue
        if _strings_are_names(data):
            return data
    return None


def blob_size(header: bytes) -> int | None:
    """The size of the BTF a header starts, if its sections lie as a kernel's do (the
    types first, the strings right after); None for another shape."""
    if len(header) < _HEADER.size:
        return None
    start, type_off, type_len, str_off, str_len = _HEADER.unpack_from(header)
    if start != HEADER_START or type_off != 0 or str_off != type_len or not str_len:
        return None
    size = _HEADER.size + str_off + str_len
    return size if size <= MAX_BTF else None


def _strings_are_names(data: bytes) -> bool:
    """The string section starts with the empty name and ends with a NUL."""
    _, _, type_len, _, str_len = _HEADER.unpack_from(data)
    strings = _HEADER.size + type_len
    return data[strings : strings + 1] == b"\0" and data[strings + str_len - 1 :] == b"\0"


def _headers(read: LinkedRead, start: int, end: int) -> Iterator[int]:
    """Addresses in [start, end), 4-byte aligned, where HEADER_START lies."""
    seen = 0
    at = start - start % 4
    while at < end and seen < MAX_CANDIDATES:
        size = min(_CHUNK + len(HEADER_START), end - at)
        try:
            chunk = read(at, size)
        except (MemoryFault, BadGuestKernel):
            at += _CHUNK
            continue
        found = chunk.find(HEADER_START)
        while 0 <= found < _CHUNK and seen < MAX_CANDIDATES:
            if found % 4 == 0:
                seen += 1
                yield at + found
            found = chunk.find(HEADER_START, found + 1)
        at += _CHUNK
