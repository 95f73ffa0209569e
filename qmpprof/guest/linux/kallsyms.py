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

import hashlib
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
    """Every symbol, in the table's order: addresses, type letters and names."""

    addresses: list[int]
    types: str
    names: list[str]

    def __len__(self) -> int:
        return len(self.names)

    def find(self, name: str) -> int | None:
        """The address of the first symbol called `name`."""
        try:
            return self.addresses[self.names.index(name)]
        except ValueError:
            return None


@dataclass(frozen=True)
class KallsymsBytes:
    """The tables' bytes as the guest has them: all `decode` needs, and what names them
    in a cache (`digest`)."""

    count: int
    token_index: bytes
    token_table: bytes
    names: bytes
    #: kallsyms_offsets' bytes and where they are, or kallsyms_addresses' (`absolute`).
    offsets: bytes
    offsets_at: int
    relative_base: int
    absolute: bool

    def digest(self, slide: int) -> bytes:
        """What these tables decode to, less the slide: a derived-cache key."""
        hashed = hashlib.sha256()
        fixed = (self.count, self.relative_base - slide, self.offsets_at - slide, self.absolute)
        hashed.update(repr(fixed).encode())
        for part in (self.token_index, self.token_table, self.names, self.offsets):
            hashed.update(len(part).to_bytes(8, "little"))
            hashed.update(part)
        return hashed.digest()[:20]


def read_tables(tables: KallsymsTables, read: ImageRead) -> KallsymsBytes:
    """The tables' bytes, each read once and bounded. Raises BadGuestKernel."""
    try:
        count = _u32(read(tables.count, 4))
        if not 0 < count <= MAX_SYMBOLS:
            raise BadGuestKernel(f"kallsyms says it has {count} symbols")
        index = read(tables.token_index, 2 * _TOKENS)
        size = max(array("H", index)) + _TOKENS
        if size > MAX_TOKEN_TABLE:
            raise BadGuestKernel("kallsyms' token table is larger than any kernel's")
        token_table = read(tables.token_table, size)
        names = _names_region(tables, count, read)
        if tables.offsets is not None:
            base = 0
            if tables.relative_base is not None:
                base = struct.unpack("<Q", read(tables.relative_base, 8))[0]
            offsets = read(tables.offsets, 4 * count)
            return KallsymsBytes(
                count, index, token_table, names, offsets, tables.offsets, base, False
            )
        assert tables.addresses is not None  # from_symbols makes sure of one of them
        addresses = read(tables.addresses, 8 * count)
        return KallsymsBytes(count, index, token_table, names, addresses, tables.addresses, 0, True)
    except MemoryFault as fault:
        raise BadGuestKernel(
            f"kallsyms runs into unreadable memory at {fault.address:#x}"
        ) from fault


def _u32(data: bytes) -> int:
    value: int = struct.unpack("<I", data)[0]
    return value


def _names_region(tables: KallsymsTables, count: int, read: ImageRead) -> bytes:
    """kallsyms_names: up to the next table VMCOREINFO names above it, in one read (its
    own size is written nowhere; what follows it is only hashed, never decoded), else
    walked name by name."""
    others = (tables.count, tables.token_table, tables.token_index, tables.offsets)
    following = [at for at in (*others, tables.relative_base, tables.addresses) if at]
    above = [at - tables.names for at in following if at > tables.names]
    size = min(above, default=0)
    if 0 < size <= count * (2 + MAX_NAME_TOKENS):
        return read(tables.names, size)
    return _names_bytes(tables.names, count, read)


def _names_bytes(start: int, count: int, read: ImageRead) -> bytes:
    """kallsyms_names up to the end of its last name: each length read, the tokens skipped,
    a piece at a time (the table's size is written nowhere)."""
    limit = count * (2 + MAX_NAME_TOKENS)
    data = bytearray()
    at = 0
    for _ in range(count):
        while len(data) < min(at + 2 + MAX_NAME_TOKENS, limit):
            data += read(start + len(data), min(NAMES_CHUNK, limit - len(data)))
        length, at = name_length(data, at)
        if length > MAX_NAME_TOKENS:
            raise BadGuestKernel("a kallsyms name longer than any")
        at += length
    if at > len(data):
        raise BadGuestKernel("kallsyms_names runs past any kernel's")
    return bytes(data[:at])


def name_length(data: bytes | bytearray, at: int) -> tuple[int, int]:
    """The token count of the name at `at`, and where its tokens start: one length byte,
    or two when the first has bit 7 set (from 6.1). Raises BadGuestKernel past the end."""
    if at >= len(data) or (data[at] & 0x80 and at + 1 >= len(data)):
        raise BadGuestKernel("kallsyms_names ends before its last name")
    if data[at] & 0x80:
        return (data[at] & 0x7F) | data[at + 1] << 7, at + 2
    return data[at], at + 1


def decode(raw: KallsymsBytes, stext: int) -> Kallsyms:
    """The symbols the tables hold, at the addresses the guest runs them (the encoding
    that puts `_stext` at `stext`). Raises BadGuestKernel."""
    width = 8 if raw.absolute else 4
    if not 0 < raw.count <= MAX_SYMBOLS or len(raw.offsets) != width * raw.count:
        raise BadGuestKernel("kallsyms' address table does not fit its count")
    if len(raw.token_index) != 2 * _TOKENS:
        raise BadGuestKernel("kallsyms' token index is short")
    tokens = _tokens(raw.token_index, raw.token_table)
    types, names = _names(raw.names, raw.count, tokens)
    return Kallsyms(_addresses(raw, names, stext), types, names)


def _tokens(index: bytes, table: bytes) -> list[str]:
    tokens = []
    for start in array("H", index):
        end = table.find(b"\0", start)
        if end < 0:
            raise BadGuestKernel("a kallsyms token runs past its table")
        tokens.append(table[start:end].decode("latin-1"))
    return tokens


def _names(data: bytes, count: int, tokens: list[str]) -> tuple[str, list[str]]:
    types: list[str] = []
    names: list[str] = []
    at = 0
    for _ in range(count):
        length, at = name_length(data, at)
        if not 0 < length <= MAX_NAME_TOKENS or at + length > len(data):
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


def _addresses(raw: KallsymsBytes, names: list[str], stext: int) -> list[int]:
    try:
        anchor = names.index("_stext")
    except ValueError:
        raise BadGuestKernel("kallsyms has no _stext") from None
    for decoded in _decodings(raw):
        if decoded(anchor) % _ADDRESS_SPACE == stext:
            return [decoded(i) % _ADDRESS_SPACE for i in range(raw.count)]
    raise BadGuestKernel(f"no decoding of kallsyms puts _stext at {stext:#x}, as VMCOREINFO does")


def _decodings(raw: KallsymsBytes) -> Iterator[Callable[[int], int]]:
    """Each way the table's addresses may be encoded, as index -> address."""
    if raw.absolute:
        yield array("Q", raw.offsets).__getitem__
        return
    offsets, base, start = array("i", raw.offsets), raw.relative_base, raw.offsets_at
    for decode in _ENCODINGS:
        yield lambda i, decode=decode: decode(offsets[i], base, start + 4 * i)  # type: ignore[misc]
