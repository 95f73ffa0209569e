"""Where a kernel's data symbols and struct layouts come from: its ELF, or its memory.

Every reader of kernel structures (the OS adapters, the module list, process maps, the
page cache) asks one `KernelTypes` for what it needs, so none of them knows whether a
vmlinux was given (`ElfTypes`: its symbol table, BTF or DWARF) or the kernel was read
from the guest (`MemoryTypes`: kallsyms and the BTF the kernel keeps in its image).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from qmpprof.guest.btf import Btf
from qmpprof.guest.dwarf_types import (
    KernelLayout,
    btf_layout,
    layout_from_plain,
    plain_layout,
    read_layout,
)
from qmpprof.symbols.derived import FileKey, derived, kind_for


class KernelTypes(Hashable, Protocol):
    """Hashable: the walkers' layouts are cached per kernel."""

    def layout(
        self, variables: set[str], structs: set[str], members: Collection[str] | None = None
    ) -> KernelLayout:
        """The link addresses of `variables` and the `members` (all when None) of
        `structs`; missing ones are absent."""
        ...


@dataclass(frozen=True)
class ElfTypes:
    """A kernel ELF's: guest/dwarf_types.read_layout (cached per file)."""

    path: Path

    def layout(
        self, variables: set[str], structs: set[str], members: Collection[str] | None = None
    ) -> KernelLayout:
        return read_layout(self.path, variables, structs, members)


@dataclass(frozen=True, eq=False)
class MemoryTypes:
    """A kernel read from guest memory: `variables` looks data symbols up (link
    addresses) in its kallsyms, `btf` gives the BTF from its image (None: no layouts),
    read and indexed only when an answer is not in the derived cache under `key` (a
    digest of the tables the answers come from)."""

    variables: Callable[[Collection[str]], dict[str, int]]
    btf: Callable[[], Btf | None]
    key: FileKey | None = None

    def layout(
        self, variables: set[str], structs: set[str], members: Collection[str] | None = None
    ) -> KernelLayout:
        kind = kind_for("memory-layout", variables, structs, members)
        read = functools.partial(self._layout, variables, structs, members)
        return derived(self.key, kind, read, plain_layout, layout_from_plain)

    def _layout(
        self, variables: set[str], structs: set[str], members: Collection[str] | None
    ) -> KernelLayout:
        found = self.variables(variables) if variables else {}
        btf = self.btf() if structs else None
        return KernelLayout(found, {}) if btf is None else btf_layout(btf, found, structs, members)
