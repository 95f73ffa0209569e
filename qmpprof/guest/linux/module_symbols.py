"""A loaded kernel module's symbols and ORC, read from its `struct module` (no .ko file).

Linux keeps what /proc/kallsyms lists of a module in `struct module`'s `core_kallsyms`
(`struct mod_kallsyms`: an Elf64_Sym array `symtab` of `num_symtab` entries whose values
are already the runtime addresses, and the `strtab` they name into), and what its ORC
unwinder reads in `arch` (`struct mod_arch_specific`: `num_orcs`, then the
`orc_unwind_ip` and `orc_unwind` arrays, sorted when the module was loaded, each ip
relative to its own address). The offsets come from the kernel's BTF or DWARF
(KernelTypes).

All of it is guest memory: counts are bounded, a symbol outside the module's text or
named past the string table is dropped, and what cannot be read is left out (a module
without symbols is shown by name, as before).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.memory import WindowMemory
from qmpprof.model import KernelModule
from qmpprof.modules import Module
from qmpprof.symbols.elf import Symbol, SymbolTable
from qmpprof.unwind.cfi import CfiTable
from qmpprof.unwind.orc import ENTRY_SIZE, Layout, OrcTable

#: More symbols than any module has (amdgpu: about 20,000).
MAX_SYMBOLS = 1 << 17
#: More ORC entries than any module has.
MAX_ORCS = 1 << 20
#: The longest string table read (KSYM_NAME_LEN past the last name used).
MAX_STRINGS = 1 << 22
KSYM_NAME_LEN = 512
ELF64_SYM = struct.Struct("<IBBHQQ")
_STT_FUNC, _STT_NOTYPE = 2, 0
_MEMBERS = ("core_kallsyms", "arch", "symtab", "num_symtab", "strtab")
_ARCH = ("num_orcs", "orc_unwind_ip", "orc_unwind")


@dataclass(frozen=True)
class ModuleSymbolsLayout:
    """Offsets in struct module of what is read (each a pointer, or a 32-bit count)."""

    symtab: int
    num_symtab: int
    strtab: int
    num_orcs: int | None
    orc_ip: int | None
    orc: int | None

    @property
    def span(self) -> int:
        """Bytes of struct module to read, from its start."""
        offsets = [self.symtab, self.num_symtab, self.strtab, self.num_orcs, self.orc_ip, self.orc]
        return max(offset for offset in offsets if offset is not None) + 8

    @classmethod
    def of(cls, types: KernelTypes) -> ModuleSymbolsLayout | None:
        """The layout, if the kernel's types describe core_kallsyms (arch is optional)."""
        found = types.layout(set(), {"module", "mod_kallsyms", "mod_arch_specific"})
        module, kallsyms = found.structs.get("module", {}), found.structs.get("mod_kallsyms", {})
        arch = found.structs.get("mod_arch_specific", {})
        core = module.get("core_kallsyms")
        if core is None or any(name not in kallsyms for name in _MEMBERS[2:]):
            return None
        at = {name: core.offset + kallsyms[name].offset for name in _MEMBERS[2:]}
        orcs: list[int | None] = [None, None, None]
        if "arch" in module and all(name in arch for name in _ARCH):
            orcs = [module["arch"].offset + arch[name].offset for name in _ARCH]
        layout = cls(at["symtab"], at["num_symtab"], at["strtab"], *orcs)
        return layout if layout.span <= 1 << 14 else None

    def pointers(self, span: bytes) -> ModulePointers:
        """Where one module's tables are, from its struct's first `span` bytes."""

        def word(offset: int | None, size: int = 8) -> int:
            return 0 if offset is None else int.from_bytes(span[offset : offset + size], "little")

        return ModulePointers(
            word(self.symtab),
            min(word(self.num_symtab, 4), MAX_SYMBOLS),
            word(self.strtab),
            min(word(self.num_orcs, 4), MAX_ORCS),
            word(self.orc_ip),
            word(self.orc),
        )


@dataclass(frozen=True)
class ModulePointers:
    symtab: int
    symbols: int
    strtab: int
    orcs: int
    orc_ip: int
    orc: int


def strings_needed(symtab: bytes) -> int:
    """How many bytes of the string table the symbols name into."""
    names = [entry[0] for entry in ELF64_SYM.iter_unpack(symtab[: len(symtab) // 24 * 24])]
    return min(max(names, default=0) + KSYM_NAME_LEN, MAX_STRINGS)


def module_from_memory(
    loaded: KernelModule,
    symtab: bytes,
    strtab: bytes,
    orc: tuple[bytes, int, bytes, Layout] | None = None,
) -> Module:
    """`loaded` with the symbols of its `symtab`/`strtab` bytes and, when given, its ORC
    tables (the ip array's bytes and runtime address, the entries, the kernel's layout),
    at offsets from its text's base (the mapping's bias is the base)."""
    symbols = []
    for name_at, info, _, _, value, size in ELF64_SYM.iter_unpack(symtab[: len(symtab) // 24 * 24]):
        offset = value - loaded.base
        if info & 0xF not in (_STT_FUNC, _STT_NOTYPE) or not 0 <= offset < loaded.size:
            continue
        end = strtab.find(b"\0", name_at)
        if name_at >= len(strtab) or end < 0 or end == name_at:
            continue
        name = strtab[name_at:end].decode("utf-8", "replace")
        symbols.append(Symbol(name, offset, min(size, loaded.size - offset)))
    table = SymbolTable(loaded.name, _sized(symbols, loaded.size))
    path = Path(f"[{loaded.name}]")
    orc_table = _orc(loaded, orc) if orc is not None else None
    empty = WindowMemory(())
    extent = (0, loaded.size)
    return Module(loaded.name, path, table, CfiTable([]), empty, None, None, extent, orc_table)


def _sized(symbols: list[Symbol], end: int) -> list[Symbol]:
    """Assembly labels (no size) reach to the next symbol, as in /proc/kallsyms."""
    starts = sorted({symbol.address for symbol in symbols})
    sized = []
    for symbol in symbols:
        if symbol.size:
            sized.append(symbol)
            continue
        following = next((s for s in starts if s > symbol.address), end)
        sized.append(Symbol(symbol.name, symbol.address, following - symbol.address))
    return sized


def _orc(loaded: KernelModule, orc: tuple[bytes, int, bytes, Layout]) -> OrcTable | None:
    ips, at, entries, layout = orc
    count = min(len(ips) // 4, len(entries) // ENTRY_SIZE)
    if count == 0:
        return None
    return OrcTable(ips[: 4 * count], at - loaded.base, entries, layout, loaded.size)
