"""CIE and FDE headers of .eh_frame and .debug_frame, read straight from the section bytes.

Why not pyelftools: its CFI decoder has been wrong in released versions
(0.33 raises on DW_CFA_GNU_args_size, which C++ code with exceptions uses everywhere;
DW_CFA_def_cfa_sf is scaled by the code alignment factor instead of the data
alignment factor) and raises arbitrary exceptions on corrupt input. The formats are
small, so qmpprof decodes them itself: the results no longer depend on which
pyelftools is installed, every failure is a BadCfi with a reason, and the
dependency pin stays loose (pyelftools still reads the ELF section headers).

Every entry starts with its length, so one bad entry costs only itself: the parser
records why and moves on to the next.

The sections are read as the code of their file's instruction set (qmpprof.isa): each
CIE says which (Cie.isa; an i386 file's CIE with x86-64's return column describes
x86-64 code), and its instructions are compiled with that set's register numbers and
words (cfi_program.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from qmpprof.errors import BadCfi
from qmpprof.isa.base import Isa
from qmpprof.isa.x86 import I386, X86_64

MASK64 = (1 << 64) - 1
_MAX_LEB_BYTES = 16

# DW_EH_PE_*: how .eh_frame encodes a pointer (low nibble: format; next three bits:
# what it is relative to; top bit: indirect).
PE_OMIT = 0xFF
_PE_PCREL = 0x10
_PE_ALIGNED = 0x50
_PE_INDIRECT = 0x80
_FIXED_FORMATS = {0x02: (2, False), 0x03: (4, False), 0x04: (8, False)}
_FIXED_FORMATS.update({0x0A: (2, True), 0x0B: (4, True), 0x0C: (8, True)})


_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
#: The FDE pointer encodings of nearly every file, (encoding, address size) -> how to
#: unpack the start and length in one call: absolute 8 or 4 bytes (.debug_frame), and
#: PC-relative signed 4 bytes (.eh_frame of GCC and Clang). The rest go through Reader.
_QUICK_RANGES = {
    (0x00, 8): struct.Struct("<QQ"),
    (0x00, 4): struct.Struct("<II"),
    (0x1B, 8): struct.Struct("<ii"),
    (0x1B, 4): struct.Struct("<ii"),
}


class Reader:
    """Little-endian reads over data[position:end] that raise BadCfi past the end."""

    __slots__ = ("base_address", "data", "end", "position")

    def __init__(self, data: bytes, position: int, end: int, base_address: int = 0) -> None:
        self.data = data
        self.position = position
        self.end = min(end, len(data))
        self.base_address = base_address  # the address of data[0]

    def at_end(self) -> bool:
        return self.position >= self.end

    def take(self, count: int) -> bytes:
        start = self.position
        if count < 0 or start + count > self.end:
            raise BadCfi("truncated")
        self.position = start + count
        return self.data[start : start + count]

    def u8(self) -> int:
        if self.position >= self.end:
            raise BadCfi("truncated")
        self.position += 1
        return self.data[self.position - 1]

    def unsigned(self, size: int) -> int:
        return int.from_bytes(self.take(size), "little")

    def signed(self, size: int) -> int:
        return int.from_bytes(self.take(size), "little", signed=True)

    def uleb(self) -> int:
        data, position, end = self.data, self.position, self.end
        if position < end and data[position] < 0x80:  # the common one-byte case
            self.position = position + 1
            return data[position]
        return self._leb(signed=False)

    def sleb(self) -> int:
        data, position, end = self.data, self.position, self.end
        if position < end and data[position] < 0x80:
            self.position = position + 1
            byte = data[position]
            return byte - 0x80 if byte & 0x40 else byte
        return self._leb(signed=True)

    def _leb(self, signed: bool) -> int:
        value = shift = 0
        for _ in range(_MAX_LEB_BYTES):
            byte = self.u8()
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                if signed and byte & 0x40:
                    value -= 1 << shift
                return value
        raise BadCfi("LEB128 number too long")

    def c_string(self) -> bytes:
        terminator = self.data.find(b"\0", self.position, self.end)
        if terminator < 0:
            raise BadCfi("truncated augmentation string")
        text = self.data[self.position : terminator]
        self.position = terminator + 1
        return text

    def pointer(self, encoding: int, address_size: int) -> int:
        """A DW_EH_PE_* encoded pointer (absptr is `address_size` bytes)."""
        application = encoding & 0x70
        if encoding & _PE_INDIRECT:
            raise BadCfi("indirect pointer encoding")
        field_address = self.base_address + self.position
        if application == _PE_ALIGNED:
            self.take(-self.position % address_size)
            return self.unsigned(address_size)
        value = self._pointer_value(encoding & 0x0F, address_size)
        if application == _PE_PCREL:
            value += field_address
        elif application:
            raise BadCfi(f"pointer encoding {encoding:#04x} not supported")
        return value & MASK64

    def _pointer_value(self, format_: int, address_size: int) -> int:
        if format_ == 0x00:
            return self.unsigned(address_size)
        if format_ == 0x01:
            return self.uleb()
        if format_ == 0x09:
            return self.sleb()
        if format_ not in _FIXED_FORMATS:
            raise BadCfi(f"pointer format {format_:#04x} unknown")
        size, is_signed = _FIXED_FORMATS[format_]
        return self.signed(size) if is_signed else self.unsigned(size)

    def skip_pointer(self, encoding: int, address_size: int) -> None:
        """Step over a pointer we do not need (a personality routine, maybe indirect)."""
        if encoding & 0x70 == _PE_ALIGNED:
            self.take(-self.position % address_size)
            self.take(address_size)
        else:
            self._pointer_value(encoding & 0x0F, address_size)


@dataclass(frozen=True, slots=True)
class Cie:
    """What a CIE says about all its FDEs."""

    code_alignment: int
    data_alignment: int
    return_column: int
    signal_frame: bool
    fde_encoding: int
    address_size: int
    segment_size: int
    has_augmentation_data: bool
    instructions: bytes
    instructions_address: int
    #: 4: i386 code's CIE (i386 register numbers, 4-byte words); 8: x86-64 code's.
    word: int = 8
    #: The instruction set whose register numbers the instructions use (qmpprof.isa).
    isa: str = "x86_64"


#: x86-64's return column (rip). i386 CFI never names register 16 (its st5) as one, so
#: a CIE with this return column in an EM_386 file describes x86-64 code (a 64-bit
#: kernel carried in an elf32-i386 file for multiboot loaders).
X86_64_RETURN_COLUMN = 16


@dataclass(frozen=True, slots=True)
class FdeEntry:
    """One FDE: the address range it covers, its CIE and its instructions."""

    start: int
    end: int
    cie: Cie
    instructions: bytes
    instructions_address: int


@dataclass(frozen=True, slots=True)
class SectionEntries:
    """The FDEs of one section, and why any entry of it could not be read."""

    fdes: list[FdeEntry]
    problems: list[str]


@dataclass(frozen=True, slots=True)
class _Entry:
    offset: int  # of its length field
    id_offset: int  # of its CIE id / CIE pointer
    id_size: int
    end: int


def parse_section(
    data: bytes, address: int, eh_frame: bool, address_size: int = 8, isa: Isa = X86_64
) -> SectionEntries:
    """Every FDE of one .eh_frame (eh_frame=True) or .debug_frame section at `address`,
    of a file whose code is `isa`'s (qmpprof.isa.isa_of_elf)."""
    name = ".eh_frame" if eh_frame else ".debug_frame"
    entries, problems = _split_entries(data, name)
    parser = _Parser(data, address, eh_frame, address_size, entries, isa)
    return SectionEntries(_fdes_of(parser, entries, name, problems), problems)


def _fdes_of(
    parser: _Parser, entries: list[_Entry], name: str, problems: list[str]
) -> list[FdeEntry]:
    """The FDEs among `entries`; why each that cannot be read is added to `problems`."""
    fdes: list[FdeEntry] = []
    for entry in entries:
        try:
            fde = parser.fde(entry)
        except BadCfi as err:
            problems.append(f"{name} entry at offset {entry.offset:#x}: {err}")
            continue
        if fde is not None and fde.end > fde.start:
            fdes.append(fde)
    return fdes


def _split_entries(data: bytes, name: str) -> tuple[list[_Entry], list[str]]:
    """Each entry's bounds; stops at the first one running past the section's end."""
    entries: list[_Entry] = []
    offset = 0
    while offset + 4 <= len(data):
        length = _U32.unpack_from(data, offset)[0]
        id_offset, id_size = offset + 4, 4
        if length == 0xFFFF_FFFF:
            if offset + 12 > len(data):
                return entries, [f"{name} entry at offset {offset:#x} runs past the section's end"]
            length = _U64.unpack_from(data, offset + 4)[0]
            id_offset, id_size = offset + 12, 8
        end = id_offset + length
        if length == 0:  # a terminator; readelf reads on past it, and so do we
            offset = end
            continue
        if end > len(data) or length < id_size:
            return entries, [f"{name} entry at offset {offset:#x} runs past the section's end"]
        entries.append(_Entry(offset, id_offset, id_size, end))
        offset = end
    return entries, []


class _Parser:
    def __init__(
        self,
        data: bytes,
        address: int,
        eh_frame: bool,
        address_size: int,
        entries: list[_Entry],
        isa: Isa = X86_64,
    ) -> None:
        self._data = data
        self._address = address
        self._eh_frame = eh_frame
        self._address_size = address_size
        self._isa = isa
        self._by_offset = {entry.offset: entry for entry in entries}
        self._cies: dict[int, Cie | BadCfi] = {}

    def fde(self, entry: _Entry) -> FdeEntry | None:
        """The FDE `entry` is, or None when it is a CIE."""
        data = self._data
        pointer = (_U32 if entry.id_size == 4 else _U64).unpack_from(data, entry.id_offset)[0]
        if self._is_cie(pointer, entry.id_size):
            return None
        cie = self._cie(entry.id_offset - pointer if self._eh_frame else pointer)
        position = entry.id_offset + entry.id_size
        quick = _QUICK_RANGES.get((cie.fde_encoding, cie.address_size))
        if quick is None or cie.segment_size or position + quick.size > entry.end:
            return self._fde_read(entry, cie, position)
        start, length = quick.unpack_from(data, position)
        if cie.fde_encoding & _PE_PCREL:
            start += self._address + position
        position += quick.size
        if cie.has_augmentation_data:
            reader = Reader(data, position, entry.end, self._address)
            reader.take(reader.uleb())
            position = reader.position
        return self._entry(entry, cie, start & MASK64, length, position)

    def _fde_read(self, entry: _Entry, cie: Cie, position: int) -> FdeEntry:
        """The general case: any pointer encoding, segments, checked at every read."""
        reader = Reader(self._data, position, entry.end, self._address)
        reader.take(cie.segment_size)
        start = reader.pointer(cie.fde_encoding, cie.address_size)
        length = reader.pointer(cie.fde_encoding & 0x0F, cie.address_size)
        if cie.has_augmentation_data:
            reader.take(reader.uleb())
        return self._entry(entry, cie, start, length, reader.position)

    def _entry(self, entry: _Entry, cie: Cie, start: int, length: int, position: int) -> FdeEntry:
        instructions = self._data[position : entry.end]
        return FdeEntry(
            start, (start + length) & MASK64, cie, instructions, self._address + position
        )

    def _is_cie(self, pointer: int, id_size: int) -> bool:
        if self._eh_frame:
            return pointer == 0
        return pointer == (1 << (8 * id_size)) - 1

    def _cie(self, offset: int) -> Cie:
        if offset not in self._cies:
            try:
                self._cies[offset] = self._parse_cie(offset)
            except BadCfi as err:
                self._cies[offset] = err
        cie = self._cies[offset]
        if isinstance(cie, BadCfi):
            raise BadCfi(f"its CIE: {cie}")
        return cie

    def _parse_cie(self, offset: int) -> Cie:
        entry = self._by_offset.get(offset)
        if entry is None:
            raise BadCfi("points at no entry")
        reader = Reader(self._data, entry.id_offset, entry.end, self._address)
        if not self._is_cie(reader.unsigned(entry.id_size), entry.id_size):
            raise BadCfi("points at an FDE")
        version = reader.u8()
        if version not in (1, 3, 4):
            raise BadCfi(f"version {version} unknown")
        augmentation = reader.c_string()
        address_size, segment_size = self._address_size, 0
        if augmentation == b"eh":  # old GCC: the address of an exception table
            reader.take(address_size)
        if version >= 4:
            address_size, segment_size = reader.u8(), reader.u8()
            if address_size not in (4, 8):
                raise BadCfi(f"address size {address_size} unknown")
        code_alignment, data_alignment = reader.uleb(), reader.sleb()
        return_column = reader.u8() if version == 1 else reader.uleb()
        fde_encoding, signal = self._augmentation(reader, augmentation, address_size)
        isa = X86_64 if return_column == X86_64_RETURN_COLUMN and self._isa is I386 else self._isa
        return Cie(
            code_alignment,
            data_alignment,
            return_column,
            signal,
            fde_encoding,
            address_size,
            segment_size,
            augmentation.startswith(b"z"),
            self._data[reader.position : entry.end],
            self._address + reader.position,
            isa.word,
            isa.name,
        )

    def _augmentation(
        self, reader: Reader, augmentation: bytes, address_size: int
    ) -> tuple[int, bool]:
        """(FDE pointer encoding, signal frame) from the augmentation string and data."""
        if not augmentation.startswith(b"z"):
            if augmentation not in (b"", b"eh"):
                raise BadCfi(f"augmentation {augmentation!r} unknown")
            return 0x00, False
        end = reader.uleb() + reader.position
        encoding, signal = 0x00, False
        for letter in augmentation[1:]:
            if letter == ord("R"):
                encoding = reader.u8()
            elif letter == ord("P"):
                reader.skip_pointer(reader.u8(), address_size)
            elif letter == ord("L"):
                reader.u8()
            elif letter == ord("S"):
                signal = True
            elif letter not in b"BG":  # AArch64 BTI and MTE: no data, nothing for us
                break  # the length above lets us skip what we do not know
        if end > reader.end:
            raise BadCfi("truncated augmentation data")
        reader.position = end
        return encoding, signal


def parse_listed(
    data: bytes,
    address: int,
    offsets: list[int],
    readable: Callable[[int, int], bool],
    address_size: int = 8,
    isa: Isa = X86_64,
) -> SectionEntries:
    """The FDEs at `offsets` of an .eh_frame at `address` of which only the bytes
    `readable(offset, size)` says were read are real (the rest: holes, as in an
    .eh_frame read from a process's memory, found through .eh_frame_hdr's table). An
    FDE, or its CIE, that is not wholly readable is left out and counted. `isa`: as
    parse_section's."""
    entries: dict[int, _Entry] = {}
    problems: list[str] = []
    fde_entries = []
    for offset in sorted(set(offsets)):
        entry = _readable_entry(data, offset, readable)
        cie = _readable_entry(data, _cie_offset(data, entry), readable) if entry else None
        if entry is None or cie is None:
            problems.append(f".eh_frame entry at offset {offset:#x}: not readable")
            continue
        entries[entry.offset] = entry
        entries[cie.offset] = cie
        fde_entries.append(entry)
    parser = _Parser(data, address, True, address_size, list(entries.values()), isa)
    return SectionEntries(_fdes_of(parser, fde_entries, ".eh_frame", problems), problems)


def _readable_entry(
    data: bytes, offset: int | None, readable: Callable[[int, int], bool]
) -> _Entry | None:
    """The 32-bit-length entry at `offset` when all of it was read."""
    if offset is None or offset < 0 or not readable(offset, 8):
        return None
    length = _U32.unpack_from(data, offset)[0]
    end = offset + 4 + length
    if length < 4 or length == 0xFFFF_FFFF or end > len(data) or not readable(offset, 4 + length):
        return None
    return _Entry(offset, offset + 4, 4, end)


def _cie_offset(data: bytes, entry: _Entry | None) -> int | None:
    """Where an .eh_frame FDE's CIE is (its pointer counts back from itself)."""
    if entry is None:
        return None
    pointer = _U32.unpack_from(data, entry.id_offset)[0]
    return entry.id_offset - pointer if pointer else None
