"""A Linux kernel module's file (`NAME.ko`, or `NAME.ko.xz` as Debian installs them):
its code symbols at offsets from the module's text base.

A .ko is a relocatable object: every section is at address 0, and the kernel lays the
module out when it loads it. Its text (core_layout's before 6.4, mem[MOD_TEXT] from
6.4) is each allocated executable section but the `.init*` ones, in section-header
order, each at the running size aligned to its sh_addralign (kernel/module/main.c,
layout_sections). The same walk here gives each section's offset in that text, so a
symbol's file address is its section's offset plus its st_value, and a Mapping with
bias = the module's text base puts it where the guest runs it.

Its ORC tables are read the same way: each `.orc_unwind_ip` entry is a PC32 relocation
against a text section (or a symbol in one), so its address is that section's offset
plus the symbol's value and the addend; entries for `.init*` code are left out, and
the rest sorted by address, as the kernel sorts them when it loads the module.
"""

from __future__ import annotations

import lzma
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from qmpprof.errors import BadElf
from qmpprof.memory import WindowMemory
from qmpprof.model import KernelModule, MemoryWindow
from qmpprof.modules import Module
from qmpprof.symbols.elf import Symbol, SymbolTable, symbol_entries
from qmpprof.symbols.elf_file import ELF_PARSE_ERRORS, open_elf, read_build_id
from qmpprof.unwind.cfi import CfiTable
from qmpprof.unwind.orc import ENTRY_SIZE, Layout, OrcTable

_SHF_ALLOC_EXEC = 0x2 | 0x4
_SHN_LORESERVE = 0xFF00
_CODE_TYPES = (0, 2)  # STT_NOTYPE (assembly labels), STT_FUNC
#: The largest .ko inflated from .xz: Debian's largest modules are a few megabytes.
MAX_KO_BYTES = 64 << 20
#: A section's alignment beyond this is not one a module's text uses.
MAX_ALIGN = 1 << 21


def module_file(directory: Path, name: str) -> Path | None:
    """`DIR/NAME.ko` (or `.ko.xz`), also with `-` and `_` swapped: the kernel names a
    module with `_` whatever its file says."""
    for stem in dict.fromkeys((name, name.replace("_", "-"), name.replace("-", "_"))):
        for suffix in (".ko", ".ko.xz"):
            path = directory / f"{stem}{suffix}"
            if path.is_file():
                return path
    return None


def load_kernel_object(path: Path, name: str) -> Module:
    """The module file at `path` as a Module called `name`. Raises BadElf."""
    if path.suffix != ".xz":
        return _load(path, name)
    with tempfile.NamedTemporaryFile(suffix=".ko") as inflated:
        inflated.write(_inflate(path))
        inflated.flush()
        return _load(Path(inflated.name), name, shown=path)


def _inflate(path: Path) -> bytes:
    try:
        decompressor = lzma.LZMADecompressor()
        data = decompressor.decompress(path.read_bytes(), MAX_KO_BYTES + 1)
    except (OSError, lzma.LZMAError) as err:
        raise BadElf(str(path), f"not an .xz file ({err})") from err
    if len(data) > MAX_KO_BYTES or not decompressor.eof:
        raise BadElf(str(path), f"inflates past {MAX_KO_BYTES} bytes")
    return data


def _load(path: Path, name: str, shown: Path | None = None) -> Module:
    with open_elf(path) as elf:
        offsets, windows = text_layout(elf)
        ends = {index: offsets[index] + elf.get_section(index)["sh_size"] for index in offsets}
        symbols = _symbols(elf, offsets, ends)
        build_id = read_build_id(elf)
        end = max((w.end for w in windows), default=0)
        orc = read_module_orc(elf, offsets, end)
    table = SymbolTable(name, symbols)
    code = WindowMemory(windows)
    return Module(name, shown or path, table, CfiTable([]), code, None, build_id, (0, end), orc)


def text_layout(elf: ELFFile) -> tuple[dict[int, int], list[MemoryWindow]]:
    """Each core text section's offset in the module's text (by section index), and
    its bytes there (relocations not applied: calls read as calls all the same)."""
    offsets: dict[int, int] = {}
    windows = []
    size = 0
    for index, section in enumerate(elf.iter_sections()):
        flags, section_name = section["sh_flags"], section.name
        if flags & _SHF_ALLOC_EXEC != _SHF_ALLOC_EXEC or section_name.startswith(".init"):
            continue
        align = min(max(section["sh_addralign"], 1), MAX_ALIGN)
        offset = -(-size // align) * align
        offsets[index] = offset
        size = offset + section["sh_size"]
        if section["sh_type"] == "SHT_PROGBITS":
            windows.append(MemoryWindow(offset, section.data()))
    return offsets, windows


#: R_X86_64_PC32: what objtool writes for each .orc_unwind_ip entry.
_PC32 = 2


def read_module_orc(elf: ELFFile, offsets: dict[int, int], end: int) -> OrcTable | None:
    """The module's ORC table at text offsets (see the module's docstring); None without
    one, or with one that cannot be read."""
    try:
        entries_section = elf.get_section_by_name(".orc_unwind")
        relocations = elf.get_section_by_name(".rela.orc_unwind_ip")
        if entries_section is None or not isinstance(relocations, RelocationSection):
            return None
        symbols = elf.get_section(relocations["sh_link"])
        if not isinstance(symbols, SymbolTableSection):
            return None
        entries = entries_section.data()
        placed = _orc_addresses(relocations, symbols, offsets, len(entries) // ENTRY_SIZE)
        new = elf.get_section_by_name(".orc_header") is not None
    except ELF_PARSE_ERRORS:
        return None
    if not placed:
        return None
    placed.sort()
    # OrcTable reads addresses relative to each entry (base + 4 * i + value), as the
    # kernel stores them: with base 0, entry i's value is its address minus 4 * i.
    relative = b"".join(
        (ip - 4 * i).to_bytes(4, "little", signed=True) for i, (ip, _) in enumerate(placed)
    )
    ordered = b"".join(entries[k * ENTRY_SIZE : (k + 1) * ENTRY_SIZE] for _, k in placed)
    layout = Layout.FROM_6_4 if new else Layout.BEFORE_6_4
    return OrcTable(relative, 0, ordered, layout, end)


def _orc_addresses(
    relocations: RelocationSection,
    symbols: SymbolTableSection,
    offsets: dict[int, int],
    count: int,
) -> list[tuple[int, int]]:
    """(text offset, entry index) of each .orc_unwind_ip entry in the core text."""
    placed = []
    for relocation in relocations.iter_relocations():
        index, rest = divmod(relocation["r_offset"], 4)
        if relocation["r_info_type"] != _PC32 or rest or not 0 <= index < count:
            continue
        symbol = symbols.get_symbol(relocation["r_info_sym"])
        section = symbol["st_shndx"]
        if isinstance(section, int) and section in offsets:
            ip = offsets[section] + symbol["st_value"] + relocation["r_addend"]
            if 0 <= ip < 1 << 31:
                placed.append((ip, index))
    return placed


def _symbols(elf: ELFFile, offsets: dict[int, int], ends: dict[int, int]) -> list[Symbol]:
    """The code symbols of the core text sections; a zero-size one (an assembly label)
    covers the rest of its section, as for any other binary (symbols/elf.py)."""
    entries = symbol_entries(elf)
    found = []
    for name_offset, info, section, value, size in entries:
        if info & 0xF in _CODE_TYPES and section in offsets and 0 < section < _SHN_LORESERVE:
            address = offsets[section] + value
            if name := entries.name(name_offset):
                found.append(Symbol(name, address, size or max(ends[section] - address, 0)))
    return found


class ModuleFiles:
    """The .ko files of --module-dir directories, loaded once each, when the guest
    has that module loaded. One that cannot be read is told to `notice` once and the
    module is then known by name alone."""

    def __init__(self, directories: Iterable[Path], notice: Callable[[str], None]) -> None:
        self._directories = tuple(directories)
        self._notice = notice
        self._loaded: dict[str, Module | None] = {}

    def for_modules(self, loaded: Iterable[KernelModule]) -> dict[str, Module]:
        """The file of each module in `loaded` that has one, by module name."""
        found = {}
        for module in loaded:
            if self._directories and module.name not in self._loaded:
                self._loaded[module.name] = self._load(module.name)
            file = self._loaded.get(module.name)
            if file is not None:
                found[module.name] = file
        return found

    def _load(self, name: str) -> Module | None:
        for directory in self._directories:
            path = module_file(directory, name)
            if path is None:
                continue
            try:
                return load_kernel_object(path, name)
            except BadElf as err:
                self._notice(f"warning: {err}; module {name} is shown by name only")
                return None
        return None
