"""Which OS adapter a kernel gets: each registered adapter probes cheap facts of the
kernel ELF (a data symbol, a section name), the first that fits is built, reading
only what it needs. No DWARF is read to choose: a distribution kernel's .debug_info
is hundreds of megabytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qmpprof.errors import BadElf
from qmpprof.guest.adapter import AdapterKind, GenericAdapter, KernelFacts, OsAdapter
from qmpprof.guest.example import ExampleGuestAdapter
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.arm64 import Arm64LinuxAdapter
from qmpprof.symbols.derived import file_key
from qmpprof.symbols.elf import read_object_symbols
from qmpprof.symbols.elf_file import open_elf

#: Probed in this order; the generic adapter stands in when none fits.
ADAPTERS: tuple[AdapterKind, ...] = (ExampleGuestAdapter, Arm64LinuxAdapter, LinuxAdapter)


def choose_adapter(kernel: Path, kinds: Sequence[AdapterKind] = ADAPTERS) -> OsAdapter:
    """The first of `kinds` whose probe fits `kernel` and that builds; else generic."""
    facts = kernel_facts(kernel, kinds)
    if facts is not None:
        for kind in kinds:
            if kind.probe(facts) and (adapter := kind.from_facts(facts)) is not None:
                return adapter
    return GenericAdapter()


def kernel_facts(kernel: Path, kinds: Sequence[AdapterKind] = ADAPTERS) -> KernelFacts | None:
    """The symbols `kinds` probe for and the section names of `kernel`; None when it is
    not a readable ELF."""
    wanted = frozenset().union(*(kind.probe_symbols for kind in kinds))
    try:
        with open_elf(kernel) as elf:
            symbols = read_object_symbols(elf, wanted, file_key(elf), code=True)
            sections = frozenset(section.name for section in elf.iter_sections())
            word = elf.elfclass // 8
    except BadElf:
        return None
    return KernelFacts(kernel, symbols, sections, ElfTypes(kernel), word)
