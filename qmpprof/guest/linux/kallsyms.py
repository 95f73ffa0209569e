"""kallsyms: the symbol table a Linux kernel keeps in its own memory, decoded from outside.

Four tables the kernel's build writes into .rodata (scripts/kallsyms.c), found through
VMCOREINFO's `SYMBOL(kallsyms_*)` lines (since 6.0: the tables are not symbols
themselves):
- `kallsyms_names`: per symbol a length, then that many token numbers; the first
  character of the expanded name is its type letter (`T`, `t`, `D`, ...). From 6.1 a
  length with bit 7 set takes two bytes (`(b0 & 0x7f) | b1 << 7`); before, no name was
  that long, so one reading serves both.
- `kallsyms_token_table` / `kallsyms_token_index`: 256 NUL-terminated tokens and where
  each starts.
- `kallsyms_offsets` (+ `kallsyms_relative_base`) or `kallsyms_addresses`: where each
  symbol is. The encoding changed over the years (absolute per-CPU symbols until 6.15,
  a base-relative offset, place-relative offsets from 7.0), and nothing in memory says
  which: every known one is tried and the one that puts `_stext` where VMCOREINFO says
  is used, as drgn does.

Everything here is guest memory, so hostile: every count is bounded, every read is of
a size fixed before it is made, and a table that does not check is BadGuestKernel.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qmpprof.errors import BadGuestKernel, MemoryFault

#: More symbols than any kernel has (Debian's 6.12 with KALLSYMS_ALL: about 200,000).
MAX_SYMBOLS = 1 << 21
#: KSYM_NAME_LEN (512 from 6.1): no name has more tokens.
MAX_NAME_TOKENS = 512
#: The token table is 256 short strings: a few kilobytes.
MAX_TOKEN_TABLE = 1 << 16
#: kallsyms_names is read in pieces of this size, as far as its names go.
NAMES_CHUNK = 1 << 20
_TOKENS = 256
_ADDRESS_SPACE = 1 << 64

#: Reads guest virtual memory of the kernel image. Raises MemoryFault or BadGuestKernel.
ImageRead = Callable[[int, int], bytes]


@dataclass(frozen=True)
class KallsymsTables:
    """Where the tables are (runtime addresses, from VMCOREINFO)."""

    names: int
    count: int  # kallsyms_num_syms' address
    token_table: int
    token_index: int
    offsets: int | None
    relative_base: int | None
    addresses: int | None

    @classmethod
    def from_symbols(cls, symbol: Callable[[str], int | None]) -> KallsymsTables:
        """From VMCOREINFO's SYMBOL(...) lookup. Raises BadGuestKernel when the kernel
        does not say where its tables are (before 6.0, or CONFIG_KALLSYMS off)."""
        found = [symbol(f"kallsyms_{n}") for n in ("names", "num_syms", "token_table")]
        index = symbol("kallsyms_token_index")
        names, count, token_table = found
        if names is None or count is None or token_table is None or index is None:
            raise BadGuestKernel(
                "VMCOREINFO does not say where kallsyms is (Linux 6.0 or later, "
                "CONFIG_KALLSYMS, tells)"
            )
        offsets, base = symbol("kallsyms_offsets"), symbol("kallsyms_relative_base")
        addresses = symbol("kallsyms_addresses")
        if offsets is None and addresses is None:
            raise BadGuestKernel("VMCOREINFO names neither kallsyms_offsets nor _addresses")
        return cls(names, count, token_table, index, offsets, base, addresses)


@dataclass(frozen=True)
class Kallsyms:
    """Every symbol, in the table's order: runtime addresses, type letters and names."""

    addresses: list[int]
    types: str
    names: list[str]

    def __len__(self) -> int:
        return len(self.names)

    def find(self, name: str) -> int | None:
        """The runtime address of the first symbol called `name`."""
        try:
            return self.addresses[self.names.index(name)]
        except ValueError:
            return None


def read_kallsyms(tables: KallsymsTables, read: ImageRead, stext: int) -> Kallsyms:
    """Decode the kernel's kallsyms. `stext`: VMCOREINFO's `_stext`, which the decoded
    table must agree with. Raises BadGuestKernel."""
    try:
        count = _u32(read(tables.count, 4))
        if not 0 < count <= MAX_SYMBOLS:
            raise BadGuestKernel(f"kallsyms says it has {count} symbols")
        tokens = _tokens(read(tables.token_index, 2 * _TOKENS), tables.token_table, read)
        types, names = _names(tables.names, count, tokens, read)
        addresses = _addresses(tables, count, names, read, stext)
    except MemoryFault as fault:
        raise BadGuestKernel(
            f"kallsyms runs into unreadable memory at {fault.address:#x}"
        ) from fault
    return Kallsyms(addresses, types, names)


def _u32(data: bytes) -> int:
    value: int = struct.unpack("<I", data)[0]
    return value


def _tokens(index_bytes: bytes, table: int, read: ImageRead) -> list[str]:
    starts = array("H", index_bytes)
    if len(starts) != _TOKENS:
        raise BadGuestKernel("kallsyms' token index is short")
    size = max(starts) + _TOKENS
    if size > MAX_TOKEN_TABLE:
        raise BadGuestKernel("kallsyms' token table is larger than any kernel's")
    data = read(table, size)
    tokens = []
    for start in starts:
        end = data.find(b"\0", start)
        if end < 0:
            raise BadGuestKernel("a kallsyms token runs past its table")
        tokens.append(data[start:end].decode("latin-1"))
    return tokens


class _Names:
    """kallsyms_names, read a piece at a time as the decoding reaches it."""

    def __init__(self, start: int, limit: int, read: ImageRead) -> None:
        self._start, self._limit, self._read = start, limit, read
        self.data = bytearray()

    def have(self, end: int) -> None:
        """Make sure `data` holds the first `end` bytes."""
        while len(self.data) < end:
            if len(self.data) >= self._limit:
                raise BadGuestKernel("kallsyms_names runs past any kernel's")
            size = min(NAMES_CHUNK, self._limit - len(self.data))
            self.data += self._read(self._start + len(self.data), size)


def _names(start: int, count: int, tokens: list[str], read: ImageRead) -> tuple[str, list[str]]:
    source = _Names(start, count * (2 + MAX_NAME_TOKENS), read)
    types: list[str] = []
    names: list[str] = []
    at = 0
    for _ in range(count):
        source.have(at + 2 + MAX_NAME_TOKENS)  # the longest a name can be
        data = source.data
        length = data[at]
        if length & 0x80:
            length, at = (length & 0x7F) | data[at + 1] << 7, at + 2
        else:
            at += 1
        if not 0 < length <= MAX_NAME_TOKENS:
            raise BadGuestKernel("a kallsyms name of no length, or longer than any")
        name = "".join([tokens[token] for token in data[at : at + length]])
        at += length
        if len(name) < 2:
            raise BadGuestKernel("a kallsyms name without a type or a name")
        types.append(name[0])
        names.append(name[1:])
    return "".join(types), names


#: The encodings kallsyms_offsets has had: each maps (offset, base, its own address) to a
#: symbol's address.
_Decode = Callable[[int, int, int], int]
_ENCODINGS: tuple[_Decode, ...] = (
    lambda off, base, _: off if off >= 0 else base - 1 - off,  # absolute per-CPU (< 6.15)
    lambda off, base, _: base + (off & 0xFFFF_FFFF),  # base-relative
    lambda off, _, place: place + off,  # place-relative (7.0)
)


def _addresses(
    tables: KallsymsTables, count: int, names: list[str], read: ImageRead, stext: int
) -> list[int]:
    try:
        anchor = names.index("_stext")
    except ValueError:
        raise BadGuestKernel("kallsyms has no _stext") from None
    for decoded in _decodings(tables, count, read):
        if decoded(anchor) == stext:
            return [decoded(i) % _ADDRESS_SPACE for i in range(count)]
    raise BadGuestKernel(f"no decoding of kallsyms puts _stext at {stext:#x}, as VMCOREINFO does")


def _decodings(
    tables: KallsymsTables, count: int, read: ImageRead
) -> Iterator[Callable[[int], int]]:
    """Each way the table's addresses may be encoded, as index -> address."""
    if tables.offsets is not None:
        offsets = array("i", read(tables.offsets, 4 * count))
        start = tables.offsets
        base = 0
        if tables.relative_base is not None:
            base = struct.unpack("<Q", read(tables.relative_base, 8))[0]
        for decode in _ENCODINGS:
            yield lambda i, decode=decode: decode(offsets[i], base, start + 4 * i)  # type: ignore[misc]
    if tables.addresses is not None:
        absolute = array("Q", read(tables.addresses, 8 * count))
        yield absolute.__getitem__
