"""One guest binary (the kernel, a user program) and everything read from its ELF file.

A Module knows only file addresses: its symbols, CFI and code bytes are looked up at
the addresses the file gives them. Where it lies in a guest is a `Mapping`'s business
(qmpprof.address_space): guest address = file address + bias."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadElf
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import FileMapping, KernelModule, MemoryWindow
from qmpprof.symbols.derived import FileKey, derived, file_key, kind_for
from qmpprof.symbols.elf import PlainTable, Symbol, SymbolTable, read_code_symbols
from qmpprof.symbols.elf_file import open_elf
from qmpprof.symbols.image import code_sections
from qmpprof.symbols.plt import plt_symbols
from qmpprof.unwind.cfi import CfiTable, elf_isa, load_cfi
from qmpprof.unwind.orc import OrcTable, read_orc
from qmpprof.unwind.orc_mends import mend_error_entry_returns


@dataclass(frozen=True)
class TextSection:
    """Where a binary's .text lies (file address) and what it holds."""

    address: int
    size: int
    sha256: str

    def contains(self, address: int) -> bool:
        return self.address <= address < self.address + self.size


@dataclass(frozen=True)
class LoadSegment:
    """A PT_LOAD program header: `file_size` bytes from file `offset` at `address`."""

    offset: int
    address: int
    file_size: int


@dataclass(frozen=True)
class Module:
    """A binary's symbols, CFI and code bytes at file addresses, loaded once."""

    name: str
    path: Path
    symbols: SymbolTable
    cfi: CfiTable
    #: Its code bytes at file addresses (a kernel read from guest memory reads its text
    #: when first asked: guest/linux/from_memory.py).
    code: MemoryReader
    text: TextSection | None
    #: The GNU build-id note's bytes, when the file has one: names the exact build.
    build_id: bytes | None = None
    #: From its lowest code address to the end of its highest code section (file
    #: addresses); (0, 0) without code.
    extent: tuple[int, int] = (0, 0)
    #: A Linux kernel's own unwind tables (.orc_unwind), preferred to its DWARF CFI.
    orc: OrcTable | None = None
    #: Its PT_LOAD segments: where a file offset lands once mapped (user files).
    loads: tuple[LoadSegment, ...] = ()
    #: The separate debug file its symbols were read from (DIR/.build-id/xx/yyyy.debug).
    debug_path: Path | None = None
    #: Read from a guest process's memory (no host file): its path names none.
    from_guest: bool = False
    #: The word of its code, from its ELF class: 8 (x86-64), 4 (i386: ELF32 EM_386).
    #: Its frame-pointer steps read slots this wide (its CFI rows carry their own).
    word: int = 8
    #: The instruction set of its code (qmpprof/isa): how a call instruction looks.
    isa: str = "x86_64"

    def bias_in(self, mapping: FileMapping) -> int | None:
        """The load bias (guest = file address + bias) that puts this file's byte at
        `mapping.offset` at `mapping.start`, as the loader placed it. None when no
        PT_LOAD segment holds that offset."""
        for segment in self.loads:
            if segment.offset <= mapping.offset < segment.offset + max(segment.file_size, 1):
                return mapping.start - (segment.address + mapping.offset - segment.offset)
        return None

    @property
    def has_code(self) -> bool:
        return self.extent[1] > self.extent[0]


def load_module(
    path: str | Path, name: str | None = None, debug: Path | None = None, shown: str | None = None
) -> Module:
    """Load an ELF as a module called `name` (default: the file name), with the symbols
    of its separate `debug` file when that has more (a stripped library's); its frames
    name the file `shown` (default: the file name; a file fetched by build-id is called
    `executable` in its cache, its frames `libc.so.6`). Raises
    BadElf for a file that is missing, not an x86 ELF, or malformed (checked before the
    CFI, which opens the file again, reads any of it)."""
    path = Path(path)
    with open_elf(path) as elf:
        key = file_key(elf)
        table, debug = _symbol_table(path, elf, key, debug, shown or path.name)
        sections = code_sections(elf)
        text = text_section(elf)
        build_id = key.build_id if key is not None else None  # file_key read it
        extent = _extent(sections)
        orc = read_orc(elf, extent[1])
        loads = load_segments(elf)
        isa = elf_isa(elf)
    cfi = load_cfi(path, key)
    code = WindowMemory(sections)
    if orc is not None:
        mend_error_entry_returns(orc, table, code, extent)
    return Module(
        name or path.name,
        path,
        table,
        cfi,
        code,
        text,
        build_id,
        extent,
        orc,
        loads,
        debug,
        word=isa.word,
        isa=isa.name,
    )


def _symbol_table(
    path: Path, elf: ELFFile, key: FileKey | None, debug: Path | None, name: str
) -> tuple[SymbolTable, Path | None]:
    """The file's symbols, or its `debug` file's when that has more, with its PLT stubs;
    and the debug file when its symbols were taken. Kept in the derived cache."""
    debug_key = None
    if debug is not None:
        with open_elf(debug) as debug_elf:
            debug_key = file_key(debug_elf)
        key = key if debug_key is not None else None  # nothing names that debug file
    # v2: Arm's mapping symbols ($x, $d) left out
    kind = kind_for("symbol-table-v2", None if debug_key is None else [debug_key.directory])

    def read() -> tuple[SymbolTable, Path | None]:
        symbols, used = read_code_symbols(elf), None
        if debug is not None:
            with open_elf(debug) as debug_elf:
                detailed = read_code_symbols(debug_elf)
            used = debug if len(detailed) > len(symbols) else None
            symbols = detailed if used is not None else symbols
        return SymbolTable(name, symbols + plt_symbols(elf)), used

    def plain(found: tuple[SymbolTable, Path | None]) -> tuple[PlainTable, bool]:
        return found[0].plain(), found[1] is not None

    def table(plain: tuple[PlainTable, bool]) -> tuple[SymbolTable, Path | None]:
        columns, used = plain
        return SymbolTable.from_plain(name, columns), debug if used else None

    return derived(key, kind, read, plain, table)


#: More program headers than any real ELF has (ELF allows 65,535).
MAX_LOAD_SEGMENTS = 64


def load_segments(elf: ELFFile) -> tuple[LoadSegment, ...]:
    """The PT_LOAD segments of an ELF opened by `open_elf`, the first MAX_LOAD_SEGMENTS."""
    found: list[LoadSegment] = []
    for segment in elf.iter_segments():
        if segment["p_type"] == "PT_LOAD" and len(found) < MAX_LOAD_SEGMENTS:
            found.append(LoadSegment(segment["p_offset"], segment["p_vaddr"], segment["p_filesz"]))
    return tuple(found)


def unread_module(loaded: KernelModule) -> Module:
    """A kernel module known only by its name and text (no file read): its text is one
    symbol, `[name]`, so an address in it reads `[name]+offset` from its base; no CFI,
    no code bytes (an unwind or return-site check there learns nothing)."""
    label = f"[{loaded.name}]"
    symbols = SymbolTable(loaded.name, [Symbol(label, 0, loaded.size)])
    empty = WindowMemory(())
    return Module(loaded.name, Path(label), symbols, CfiTable([]), empty, None, None, (0, 0))


def unread_file(mapping: FileMapping, word: int = 8) -> Module:
    """A guest file with no host copy: named by its file name, with no symbols, CFI or
    code (its frames read `NAME+offset`, and unwind by frame pointers, `word` bytes a
    slot: 4 in a 32-bit process)."""
    name = file_name(mapping)
    empty = WindowMemory(())
    table = SymbolTable(name, [])
    return Module(name, Path(mapping.path), table, CfiTable([]), empty, None, word=word)


def file_name(mapping: FileMapping) -> str:
    """What a guest file's frames are named by: its file name (the path if it has none)."""
    return PurePosixPath(mapping.path).name or mapping.path


def guest_loaded_file(
    mapping: FileMapping,
    symbols: list[Symbol],
    cfi: CfiTable,
    loads: tuple[LoadSegment, ...],
    build_id: bytes | None,
    word: int = 8,
    isa: str = "x86_64",
) -> Module:
    """A guest file with no host copy, as its process has it loaded: its dynamic symbols
    and its .eh_frame's CFI (guest/loaded_elf.py), at file addresses; `word` 4 for an
    i386 file, `isa` its code's. No code bytes (a return-site check there learns nothing). Its path,
    `[guest]/PATH`, is no host file's, so nothing reads source lines from a host file
    of the same name."""
    name = file_name(mapping)
    path = Path(f"[guest]{mapping.path}")
    table = SymbolTable(name, symbols)
    empty = WindowMemory(())
    return Module(
        name,
        path,
        table,
        cfi,
        empty,
        None,
        build_id,
        loads=loads,
        from_guest=True,
        word=word,
        isa=isa,
    )


def _extent(sections: list[MemoryWindow]) -> tuple[int, int]:
    if not sections:
        return (0, 0)
    return (min(s.base for s in sections), max(s.end for s in sections))


def text_section(elf: ELFFile) -> TextSection | None:
    """The .text of an ELF file opened by `open_elf`, or None without stored bytes."""
    section = elf.get_section_by_name(".text")
    if section is None or section["sh_type"] == "SHT_NOBITS" or not section["sh_size"]:
        return None
    data = section.data()
    return TextSection(section["sh_addr"], len(data), hashlib.sha256(data).hexdigest())


def load_user_modules(directories: list[Path], files: list[Path]) -> dict[str, Module]:
    """User binaries named after their process: `DIR/NAME.elf` and each `--user FILE`
    (its name without `.elf`). Raises BadElf for a given file that is not an ELF."""
    paths = [*files]
    for directory in directories:
        if not directory.is_dir():
            raise BadElf(str(directory), "not a directory")
        paths += sorted(p for p in directory.iterdir() if p.suffix == ".elf" and p.is_file())
    modules = [load_module(p, name=p.name.removesuffix(".elf")) for p in paths]
    return {module.name: module for module in modules}
