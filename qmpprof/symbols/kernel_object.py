"""A Linux kernel module's file (`NAME.ko`, or `NAME.ko.xz` as Debian installs them):
its code symbols at offsets from the module's text base.

A .ko is a relocatable object: every section is at address 0, and the kernel lays the
module out when it loads it. Its text (core_layout's before 6.4, mem[MOD_TEXT] from
6.4) is each allocated executable section but the `.init*` ones, in section-header
order, each at the running size aligned to its sh_addralign (kernel/module/main.c,
layout_sections). The same walk here gives each section's offset in that text, so a
symbol's file address is its section's offset plus its st_value, and a Mapping with
bias = the module's text base puts it where the guest runs it.

No unwind tables yet: the .ko's ORC entries need its relocations applied.
"""

from __future__ import annotations

import lzma
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadElf
from qmpprof.memory import WindowMemory
from qmpprof.model import KernelModule, MemoryWindow
from qmpprof.modules import Module, read_build_id
from qmpprof.symbols.elf import Symbol, SymbolTable, symbol_entries
from qmpprof.symbols.elf_file import open_elf
from qmpprof.unwind.cfi import CfiTable

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
    table = SymbolTable(name, symbols)
    code = WindowMemory(windows)
    return Module(name, shown or path, table, CfiTable([]), code, None, build_id, (0, end))


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
