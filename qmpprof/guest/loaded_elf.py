"""What a Linux process has loaded of an ELF file, for a file with no host copy: its
unwind tables (PT_GNU_EH_FRAME: `.eh_frame_hdr`, and the `.eh_frame` it points at) and
its dynamic symbols (PT_DYNAMIC: DT_SYMTAB, DT_STRTAB, DT_STRSZ, the symbol count from
DT_GNU_HASH or DT_HASH), all read from the process's memory; and, where the file's
pages can be read by offset (the guest kernel's page cache), its full symbol table
(`.symtab`, which no segment loads: a program not stripped, as gcc leaves it, has its
static functions named too).

Two steps, as the loader laid the file out (each PT_LOAD at its p_vaddr + bias):

    step = LoadedHeadersRead(mapping)
    headers = step.advance(memory)       # raises MemoryFault: resumable (PageReader.run)
    for add in step.more(): headers = add(memory, headers)   # each: skipped if it faults
    table = SparseBytes over headers.section_headers       # file offsets, if readable
    names = SparseBytes over section_names_span(headers, table)            # if any
    headers = with_section_eh_frame(headers, table, names)   # a static program's
    pieces = {span: SparseBytes over span for span in headers.spans()}   # holes allowed
    symtab, strings = (SparseBytes over span for span in symtab_spans(table))  # if any
    image = loaded_image(headers, pieces, file_symbols(headers, symtab, strings))  # pure

The first reads the ELF and program headers, the dynamic section, the hash table's
header and the start of `.eh_frame_hdr` (a few pages; the caller resumes it after each
MemoryFault, as record/process_maps.py's PageReader does). The second's ranges are large
(libc's `.eh_frame` is 150 KiB) and may have pages the process never touched, which
cannot be read from outside: what lies in them is left out (an FDE, a symbol), never
guessed.

ld.so writes the load bias into the dynamic section's pointers (glibc does on x86-64);
a pointer that lies in the file's link range and not its loaded range is taken as not
yet relocated. Every count and size read from guest memory is bounded; only our errors.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from qmpprof.errors import BadCfi, MemoryFault
from qmpprof.guest.linux.maps import build_id_note
from qmpprof.isa.aarch64 import AARCH64
from qmpprof.isa.base import Isa
from qmpprof.isa.x86 import X86_64
from qmpprof.memory import MemoryReader
from qmpprof.model import FileMapping
from qmpprof.modules import LoadSegment, Module, guest_loaded_file
from qmpprof.symbols.elf import Symbol
from qmpprof.unwind.cfi import CfiTable
from qmpprof.unwind.cfi_entries import FdeEntry, Reader, parse_listed, parse_section

PAGE_SIZE = 4096
#: Bounds on what a hostile image may make us read or build.
MAX_EH_FRAME = 8 << 20
MAX_FDES = 500_000
MAX_SYMBOLS = 200_000
MAX_STRINGS = 4 << 20
MAX_NAME = 1024
MAX_PHDRS = 64
MAX_DYNAMIC = 1024
MAX_NOTES = 4096
MAX_SECTIONS = 4096

_ELF_MAGIC = b"\x7fELF\x02\x01"  # 64-bit, little-endian
#: The instruction sets of e_machine's values read: EM_X86_64, EM_AARCH64.
_MACHINES = {62: X86_64, 183: AARCH64}
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_DYN = struct.Struct("<qQ")
_SYM = struct.Struct("<IBBHQQ")
_HDR_ENTRY = struct.Struct("<ii")
#: A section header: name, type, flags, addr, offset, size, link, info, align, entsize.
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SHT_SYMTAB, _SHT_STRTAB = 2, 3
_SHF_ALLOC = 2
#: File offsets past this are not a file's (a hostile header's, taken as none).
_MAX_FILE_OFFSET = 1 << 40
#: Unpacked program headers: type, flags, offset, vaddr, paddr, filesz, memsz, align.
_Phdrs = list[tuple[int, ...]]
PT_LOAD, PT_DYNAMIC, PT_NOTE, PT_GNU_EH_FRAME = 1, 2, 4, 0x6474E550
_PF_X = 1
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 4, 5, 6, 10, 11
DT_GNU_HASH = 0x6FFFFEF5
_STT_FUNC = 2
#: .eh_frame_hdr's table encoding that every linker writes: sdata4 from the header's start.
_DATAREL_SDATA4 = 0x3B
_EH_HDR_HEAD = 12  # version, three encodings, eh_frame_ptr (4), fde_count (4)


@dataclass(frozen=True)
class Span:
    """`size` bytes of guest memory at `address`."""

    address: int
    size: int

    @property
    def end(self) -> int:
        return self.address + self.size


@dataclass(frozen=True)
class LoadedHeaders:
    """What a loaded ELF's headers say: where its parts lie in the process (guest
    addresses), and its bias (guest = file address + bias)."""

    bias: int
    loads: tuple[LoadSegment, ...]
    executable: tuple[tuple[int, int], ...]  # file addresses of its code segments
    build_id: bytes | None
    eh_frame_hdr: Span | None = None
    fde_table: Span | None = None  # .eh_frame_hdr's sorted (start, FDE) pairs
    eh_frame: Span | None = None
    symbols: Span | None = None  # DT_SYMTAB, count * 24 bytes
    strings: Span | None = None
    #: The section header table, at file offsets (no segment loads it).
    section_headers: Span | None = None
    #: Which of its sections holds the section names (e_shstrndx).
    section_names: int = 0
    #: Its code's instruction set (e_machine).
    isa: Isa = X86_64

    def spans(self) -> tuple[Span, ...]:
        """The ranges the second step reads."""
        found = (self.fde_table, self.eh_frame, self.symbols, self.strings)
        return tuple(span for span in found if span is not None and span.size > 0)


class SparseBytes:
    """The bytes of one Span with the pages that could be read; zeros elsewhere."""

    def __init__(self, span: Span, pages: Mapping[int, bytes]) -> None:
        self.span = span
        data = bytearray(span.size)
        self._present: set[int] = set()
        first = span.address // PAGE_SIZE
        for page in range(first, -(-span.end // PAGE_SIZE)):
            chunk = pages.get(page)
            if chunk is None or len(chunk) != PAGE_SIZE:
                continue
            self._present.add(page)
            at = page * PAGE_SIZE
            lo, hi = max(at, span.address), min(at + PAGE_SIZE, span.end)
            data[lo - span.address : hi - span.address] = chunk[lo - at : hi - at]
        self.data = bytes(data)

    def readable(self, offset: int, size: int) -> bool:
        """Whether data[offset:offset+size] was all read (not a hole)."""
        if offset < 0 or size <= 0 or offset + size > self.span.size:
            return False
        start = self.span.address + offset
        pages = range(start // PAGE_SIZE, (start + size - 1) // PAGE_SIZE + 1)
        return all(page in self._present for page in pages)

    def pages_read(self) -> int:
        return len(self._present)

    def whole(self) -> bool:
        """Whether every page of the span was read (no hole)."""
        return len(self._present) == len(page_numbers(self.span))

    def readable_prefix(self) -> int:
        """How many bytes from the start were read without a hole."""
        page = self.span.address // PAGE_SIZE
        while page in self._present:
            page += 1
        return max(0, min(page * PAGE_SIZE - self.span.address, self.span.size))


def page_numbers(span: Span) -> range:
    return range(span.address // PAGE_SIZE, -(-span.end // PAGE_SIZE))


def read_sparse(memory: MemoryReader, span: Span) -> SparseBytes:
    """A Span read page by page from `memory`, holes where it faults."""
    pages: dict[int, bytes] = {}
    for page in page_numbers(span):
        try:
            pages[page] = memory.read(page * PAGE_SIZE, PAGE_SIZE)
        except MemoryFault:
            continue
    return SparseBytes(span, pages)


@dataclass
class LoadedHeadersRead:
    """The first step over the mapping's process memory; `advance` raises MemoryFault
    for what it needs next and is called again once that is readable. Reads are kept,
    so a resumed step reads nothing twice."""

    mapping: FileMapping
    _read: dict[tuple[int, int], bytes] = field(default_factory=dict)
    _loads: _Phdrs = field(default_factory=list)
    _eh_frame_hdr: Span | None = None
    _dynamic_span: Span | None = None

    def advance(self, memory: MemoryReader) -> LoadedHeaders | None:
        """The headers, or None when the mapping is not a loaded 64-bit ELF (x86-64 or
        AArch64) whose
        layout places it where the map says (or its build-id is not the map's)."""
        base = self.mapping.start - self.mapping.offset
        head = self._bytes(memory, base, _EHDR.size)
        fields = _EHDR.unpack(head)
        phoff, entry_size, count = fields[5], fields[9], fields[10]
        isa = _MACHINES.get(fields[2])
        if not head.startswith(_ELF_MAGIC) or isa is None or entry_size != _PHDR.size:
            return None
        if count > MAX_PHDRS or phoff > PAGE_SIZE * 4:
            return None
        table = self._bytes(memory, base + phoff, count * _PHDR.size) if count else b""
        phdrs = [_PHDR.unpack_from(table, at) for at in range(0, len(table), _PHDR.size)]
        bias = _bias(phdrs, base, self.mapping)
        if bias is None:
            return None
        build_id = self._build_id(memory, phdrs, bias)
        if self.mapping.build_id is not None and build_id != self.mapping.build_id:
            return None
        headers = self._headers(phdrs, bias, build_id)
        sections = _sections(fields)
        return replace(headers, section_headers=sections, section_names=fields[13], isa=isa)

    def _headers(self, phdrs: _Phdrs, bias: int, build_id: bytes | None) -> LoadedHeaders:
        self._loads = [p for p in phdrs if p[0] == PT_LOAD]
        for kind, _, _, vaddr, _, size, _, _ in phdrs:
            if kind == PT_GNU_EH_FRAME and size >= _EH_HDR_HEAD:
                self._eh_frame_hdr = Span(vaddr + bias, size)
            elif kind == PT_DYNAMIC and size:
                self._dynamic_span = Span(vaddr + bias, size)
        return LoadedHeaders(
            bias,
            tuple(LoadSegment(p[2], p[3], p[5]) for p in self._loads),
            tuple((p[3], p[3] + p[6]) for p in self._loads if p[1] & _PF_X),
            build_id,
        )

    def more(self) -> tuple[Callable[[MemoryReader, LoadedHeaders], LoadedHeaders], ...]:
        """The steps after `advance`, each resumable the same way and each adding one
        part (.eh_frame_hdr, the dynamic section): one whose memory cannot be read (a
        page never touched) is skipped, the others still count."""
        return (self.with_eh_frame, self.with_dynamic)

    def with_eh_frame(self, memory: MemoryReader, headers: LoadedHeaders) -> LoadedHeaders:
        if self._eh_frame_hdr is None:
            return headers
        return self._eh_frame(memory, headers, self._eh_frame_hdr, self._loads)

    def with_dynamic(self, memory: MemoryReader, headers: LoadedHeaders) -> LoadedHeaders:
        if self._dynamic_span is None:
            return headers
        return self._dynamic(memory, headers, self._dynamic_span, self._loads)

    def _eh_frame(
        self, memory: MemoryReader, headers: LoadedHeaders, hdr: Span, loads: _Phdrs
    ) -> LoadedHeaders:
        head = self._bytes(memory, hdr.address, _EH_HDR_HEAD)
        version, frame_encoding, count_encoding, table_encoding = head[:4]
        reader = Reader(head, 4, _EH_HDR_HEAD, hdr.address)
        try:
            eh_frame = reader.pointer(frame_encoding, 8)
            count = reader.pointer(count_encoding, 8) if count_encoding != 0xFF else 0
        except BadCfi:
            return headers
        segment_end = _segment_end(loads, eh_frame - headers.bias)
        if version != 1 or segment_end is None:
            return headers
        size = min(segment_end + headers.bias - eh_frame, MAX_EH_FRAME)
        table = None
        if table_encoding == _DATAREL_SDATA4 and 0 < count <= MAX_FDES:
            table = Span(hdr.address + reader.position, count * _HDR_ENTRY.size)
        return replace(headers, eh_frame_hdr=hdr, fde_table=table, eh_frame=Span(eh_frame, size))

    def _dynamic(
        self,
        memory: MemoryReader,
        headers: LoadedHeaders,
        dynamic: Span,
        loads: _Phdrs,
    ) -> LoadedHeaders:
        size = min(dynamic.size, MAX_DYNAMIC * _DYN.size) // _DYN.size * _DYN.size
        raw = self._pages(memory, dynamic.address, size)
        tags: dict[int, int] = {}
        for tag, value in _DYN.iter_unpack(raw):
            if tag == DT_NULL:
                break
            tags.setdefault(tag, value)
        if tags.get(DT_SYMENT, _SYM.size) != _SYM.size:
            return headers
        image = _Image(loads, headers.bias)
        symtab, strtab = image.pointer(tags.get(DT_SYMTAB)), image.pointer(tags.get(DT_STRTAB))
        if symtab is None or strtab is None:
            return headers
        count = self._symbol_count(memory, image, tags)
        strings = Span(strtab, min(tags.get(DT_STRSZ, 0), MAX_STRINGS))
        return replace(headers, symbols=Span(symtab, count * _SYM.size), strings=strings)

    def _symbol_count(self, memory: MemoryReader, image: _Image, tags: dict[int, int]) -> int:
        gnu = image.pointer(tags.get(DT_GNU_HASH))
        if gnu is not None:
            return min(self._gnu_hash_count(memory, gnu), MAX_SYMBOLS)
        hashed = image.pointer(tags.get(DT_HASH))
        if hashed is not None:
            nchain = int.from_bytes(self._bytes(memory, hashed + 4, 4), "little")
            return min(nchain, MAX_SYMBOLS)
        return 0

    def _gnu_hash_count(self, memory: MemoryReader, table: int) -> int:
        """One more than the highest symbol index a bucket or its chain reaches."""
        buckets, first, bloom_words, _ = struct.unpack("<IIII", self._bytes(memory, table, 16))
        if buckets > MAX_SYMBOLS or bloom_words > MAX_SYMBOLS or first > MAX_SYMBOLS:
            return 0
        at = table + 16 + 8 * bloom_words
        raw = self._pages(memory, at, 4 * buckets)
        highest: int = max(struct.unpack(f"<{buckets}I", raw), default=0)
        if highest < first:
            return int(first)
        chains = at + 4 * buckets
        for index in range(highest, MAX_SYMBOLS):
            if int.from_bytes(self._bytes(memory, chains + 4 * (index - first), 4), "little") & 1:
                return index + 1
        return MAX_SYMBOLS

    def _build_id(self, memory: MemoryReader, phdrs: _Phdrs, bias: int) -> bytes | None:
        for kind, _, _, vaddr, _, size, _, _ in phdrs:
            if kind == PT_NOTE and 0 < size <= MAX_NOTES:
                found = build_id_note(self._pages(memory, vaddr + bias, size))
                if found is not None:
                    return found
        return None

    def _pages(self, memory: MemoryReader, address: int, size: int) -> bytes:
        """`size` bytes read a page at a time (a resumed step's reads are small)."""
        parts = []
        at, end = address, address + size
        while at < end:
            step = min(end, (at // PAGE_SIZE + 1) * PAGE_SIZE) - at
            parts.append(self._bytes(memory, at, step))
            at += step
        return b"".join(parts)

    def _bytes(self, memory: MemoryReader, address: int, size: int) -> bytes:
        if not 0 <= address < address + size <= 1 << 64:
            raise MemoryFault(address % (1 << 64), max(size, 1))
        key = (address, size)
        if key not in self._read:
            self._read[key] = memory.read(address, size)
        return self._read[key]


def _sections(header: tuple[int, ...]) -> Span | None:
    """Where the ELF header (`_EHDR`'s fields) says its section header table lies in
    the file; None for none, or one of another entry size or of too many entries."""
    offset, entry_size, count = header[6], header[11], header[12]
    if entry_size != _SHDR.size or not 0 < count <= MAX_SECTIONS:
        return None
    if not 0 < offset < _MAX_FILE_OFFSET:
        return None
    return Span(offset, count * _SHDR.size)


def _section_headers(table: SparseBytes) -> list[tuple[int, ...] | None]:
    """Each header of the section header `table` (SparseBytes at file offsets), None
    where its bytes were not read."""
    return [
        _SHDR.unpack_from(table.data, at) if table.readable(at, _SHDR.size) else None
        for at in range(0, len(table.data) - _SHDR.size + 1, _SHDR.size)
    ]


def section_names_span(headers: LoadedHeaders, table: SparseBytes) -> Span | None:
    """Where the file holds its section names (file offsets), from the section header
    `table`; None when that header was not read or is not a string table."""
    sections = _section_headers(table)
    index = headers.section_names
    names = sections[index] if 0 < index < len(sections) else None
    if names is None or names[1] != _SHT_STRTAB:
        return None
    span = Span(names[4], min(names[5], MAX_STRINGS))
    return span if 0 <= span.address < span.end <= _MAX_FILE_OFFSET else None


def with_section_eh_frame(
    headers: LoadedHeaders, table: SparseBytes, names: SparseBytes
) -> LoadedHeaders:
    """`headers` with the `.eh_frame` the section header `table` and section `names`
    place in a loaded segment, for a file whose program headers do not say where it is:
    a program linked `-static` has no PT_GNU_EH_FRAME (gcc passes the linker
    --eh-frame-hdr for dynamic links only), and a process reads its FDEs through
    symbols its startup code registers. Unchanged when it already has one, or when no
    readable section of that name lies whole in the file bytes of a PT_LOAD."""
    if headers.eh_frame is not None:
        return headers
    for header in _section_headers(table):
        if header is None or not header[2] & _SHF_ALLOC or not header[5]:
            continue
        if _name(names, header[0]) != ".eh_frame":
            continue
        address, size = header[3], min(header[5], MAX_EH_FRAME)
        if any(
            s.address <= address and address + size <= s.address + s.file_size
            for s in headers.loads
        ):
            return replace(headers, eh_frame=Span(address + headers.bias, size))
        return headers
    return headers


def symtab_spans(table: SparseBytes) -> tuple[Span, Span] | None:
    """Where the file holds its `.symtab` and that table's strings, from the section
    header `table` (SparseBytes at file offsets); None without a readable one."""
    headers = _section_headers(table)
    for header in headers:
        if header is None or header[1] != _SHT_SYMTAB or header[9] != _SYM.size:
            continue
        link = header[6]
        strings = headers[link] if link < len(headers) else None
        if strings is None or strings[1] != _SHT_STRTAB:
            return None
        size = min(header[5], MAX_SYMBOLS * _SYM.size) // _SYM.size * _SYM.size
        symbols = Span(header[4], size)
        names = Span(strings[4], min(strings[5], MAX_STRINGS))
        if all(0 <= span.address < span.end <= _MAX_FILE_OFFSET for span in (symbols, names)):
            return symbols, names
        return None
    return None


def _bias(phdrs: _Phdrs, base: int, mapping: FileMapping) -> int | None:
    """guest - file address, when the headers at `base` place the mapping where the map
    says: the PT_LOAD holding its offset lands at its start, and offset 0 at `base`."""
    loads = [p for p in phdrs if p[0] == PT_LOAD]
    first = next((p for p in loads if p[2] == 0), None)
    holding = next((p for p in loads if p[2] <= mapping.offset < p[2] + max(p[5], 1)), None)
    if first is None or holding is None:
        return None
    bias = mapping.start - (holding[3] + mapping.offset - holding[2])
    return bias if first[3] + bias == base else None


def _segment_end(loads: _Phdrs, address: int) -> int | None:
    """The end of the file bytes of the PT_LOAD holding file `address`."""
    for _, _, _, vaddr, _, size, _, _ in loads:
        if vaddr <= address < vaddr + size:
            return int(vaddr + size)
    return None


@dataclass(frozen=True)
class _Image:
    loads: _Phdrs
    bias: int

    def pointer(self, value: int | None) -> int | None:
        """A dynamic-section pointer as a guest address: as ld.so relocated it, or, when
        it lies only in the link range, plus the bias. None outside the image."""
        if value is None:
            return None
        if _segment_end(self.loads, value - self.bias) is not None:
            return value
        if _segment_end(self.loads, value) is not None:
            return value + self.bias
        return None


@dataclass(frozen=True)
class LoadedImage:
    """A loaded file's dynamic function symbols and FDEs, at file addresses."""

    symbols: list[Symbol]
    fdes: list[FdeEntry]
    problems: list[str]
    bytes_read: int


def loaded_image(
    headers: LoadedHeaders,
    pieces: Mapping[Span, SparseBytes],
    more_symbols: Iterable[Symbol] = (),
) -> LoadedImage:
    """The symbols and FDEs the second step's `pieces` (by Span) hold; `more_symbols`:
    those of the file's symbol table (`file_symbols`)."""
    fdes, problems = _fdes(headers, pieces)
    symbols = [*_dynamic_symbols(headers, pieces), *more_symbols]
    read = sum(p.pages_read() for p in pieces.values()) * PAGE_SIZE
    return LoadedImage(symbols, fdes, problems, read)


def file_symbols(headers: LoadedHeaders, table: SparseBytes, strings: SparseBytes) -> list[Symbol]:
    """The function symbols of the file's `.symtab` (`table`) and its `strings`, read
    where `symtab_spans` says (file offsets)."""
    return list(_functions(table, strings, headers.executable))


def _fdes(
    headers: LoadedHeaders, pieces: Mapping[Span, SparseBytes]
) -> tuple[list[FdeEntry], list[str]]:
    if headers.eh_frame is None or headers.eh_frame not in pieces:
        return [], []
    frame = pieces[headers.eh_frame]
    link = headers.eh_frame.address - headers.bias
    table = pieces.get(headers.fde_table) if headers.fde_table is not None else None
    if table is None or headers.eh_frame_hdr is None:
        data = frame.data[: frame.readable_prefix()]
        found = parse_section(data, link, eh_frame=True, isa=headers.isa)
        return found.fdes, found.problems
    offsets = []
    hdr = headers.eh_frame_hdr.address
    for at in range(0, len(table.data) - _HDR_ENTRY.size + 1, _HDR_ENTRY.size):
        if table.readable(at, _HDR_ENTRY.size):
            fde = hdr + _HDR_ENTRY.unpack_from(table.data, at)[1] - headers.eh_frame.address
            offsets.append(fde)
    found = parse_listed(frame.data, link, offsets, frame.readable, isa=headers.isa)
    return found.fdes, found.problems


def _dynamic_symbols(
    headers: LoadedHeaders, pieces: Mapping[Span, SparseBytes]
) -> Iterator[Symbol]:
    if headers.symbols is None or headers.strings is None:
        return iter(())
    table, strings = pieces.get(headers.symbols), pieces.get(headers.strings)
    if table is None or strings is None:
        return iter(())
    return _functions(table, strings, headers.executable)


def _functions(
    table: SparseBytes, strings: SparseBytes, executable: tuple[tuple[int, int], ...]
) -> Iterator[Symbol]:
    """The sized, defined function symbols of a symbol `table` whose code lies in an
    `executable` segment (file addresses)."""
    for at in range(0, len(table.data) - _SYM.size + 1, _SYM.size):
        name_at, info, _, section, value, size = _SYM.unpack_from(table.data, at)
        if info & 0xF != _STT_FUNC or not section or not size or not table.readable(at, _SYM.size):
            continue
        if not any(lo <= value and value + size <= hi for lo, hi in executable):
            continue
        name = _name(strings, name_at)
        if name:
            yield Symbol(name, value, size)


def _name(strings: SparseBytes, offset: int) -> str | None:
    end = strings.data.find(b"\0", offset, offset + MAX_NAME)
    if end <= offset or not strings.readable(offset, end + 1 - offset):
        return None
    return strings.data[offset:end].decode("utf-8", "replace")


def loaded_module(mapping: FileMapping, headers: LoadedHeaders, image: LoadedImage) -> Module:
    """The Module `mapping`'s file is as its process has it loaded."""
    cfi = CfiTable(image.fdes, image.problems)
    loads, build_id = headers.loads, headers.build_id
    return guest_loaded_file(mapping, image.symbols, cfi, loads, build_id, isa=headers.isa.name)


def read_loaded_module(
    memory: MemoryReader, mapping: FileMapping, file: MemoryReader | None = None
) -> Module | None:
    """Both steps over a MemoryReader that holds the process's memory (tests; the
    capture reads through record/process_maps.py), and the symbol table from `file`
    (its bytes at their file offsets) if given: None when the headers are unusable."""
    step = LoadedHeadersRead(mapping)
    try:
        headers = step.advance(memory)
    except MemoryFault:
        return None
    if headers is None:
        return None
    for add in step.more():
        with contextlib.suppress(MemoryFault):
            headers = add(memory, headers)
    symbols: list[Symbol] = []
    if file is not None and headers.section_headers is not None:
        sections = read_sparse(file, headers.section_headers)
        names = section_names_span(headers, sections)
        if names is not None and headers.eh_frame is None:
            headers = with_section_eh_frame(headers, sections, read_sparse(file, names))
        spans = symtab_spans(sections)
        if spans is not None:
            table, strings = (read_sparse(file, span) for span in spans)
            symbols = file_symbols(headers, table, strings)
    pieces = {span: read_sparse(memory, span) for span in headers.spans()}
    return loaded_module(mapping, headers, loaded_image(headers, pieces, symbols))
