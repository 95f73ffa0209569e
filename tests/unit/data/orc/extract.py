"""Write a kernel's ORC entries, a sample of them, beside objtool's own dump of each.

    python -m tests.unit.data.orc.extract VMLINUX OBJTOOL_DUMP OUT.json

VMLINUX is a Debian debug vmlinux (examples/linux/fetch.sh puts them in
~/.cache/qmpprof/linux/), OBJTOOL_DUMP the output of that kernel's own objtool
(`objtool --dump VMLINUX`, from Debian's linux-kbuild package of the same version; 6.12's
needs SRCARCH=x86). Kept: every entry of a few functions written in assembly, which
DWARF CFI does not describe, and a seeded sample of the rest. test_orc.py decodes the
entries' bytes and compares them with objtool's lines.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import Section

FUNCTIONS = (
    "entry_SYSCALL_64",
    "asm_common_interrupt",
    "asm_sysvec_apic_timer_interrupt",
    "clear_user_rep_good",  # 6.1
    "rep_stos_alternative",  # 6.12
    "ret_from_fork",
    "do_syscall_64",
    "sysvec_apic_timer_interrupt",  # switches to the IRQ stack: sp:(sp)+16
    "__x86_indirect_thunk_rax",
)
SAMPLED = 400


@dataclass(frozen=True)
class KernelOrc:
    """A vmlinux's ORC sections and function symbols, as its file has them."""

    base: int  # .orc_unwind_ip's address
    relative: list[int]  # each entry's offset from its own place in .orc_unwind_ip
    entries: bytes  # .orc_unwind
    header: bool  # .orc_header present: 6.4's layout
    functions: dict[str, tuple[int, int]]  # name: (address, size)

    @classmethod
    def read(cls, vmlinux: Path) -> KernelOrc:
        with vmlinux.open("rb") as stream:
            elf = ELFFile(stream)
            ip_section = _section(elf, ".orc_unwind_ip")
            offsets, base = ip_section.data(), ip_section["sh_addr"]
            entries = _section(elf, ".orc_unwind").data()
            symtab: Any = _section(elf, ".symtab")
            functions = {s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols()}
            header = elf.get_section_by_name(".orc_header") is not None
        relative = [
            int.from_bytes(offsets[at : at + 4], "little", signed=True)
            for at in range(0, len(offsets) - 3, 4)
        ]
        return cls(base, relative, entries, header, functions)

    @property
    def ips(self) -> list[int]:
        return [self.base + 4 * i + value for i, value in enumerate(self.relative)]

    def entry(self, index: int) -> str:
        return self.entries[6 * index : 6 * index + 6].hex()


def main(vmlinux: Path, dump: Path, out: Path) -> None:
    lines = dump.read_text().splitlines()
    orc = KernelOrc.read(vmlinux)
    count, ips = len(orc.relative), orc.ips
    assert count == len(lines), "objtool's dump is of another vmlinux"
    chosen: set[int] = set(random.Random(f"orc:{vmlinux.name}").sample(range(count), SAMPLED))
    present = [name for name in FUNCTIONS if name in orc.functions]
    for name in present:
        start, size = orc.functions[name]
        chosen |= {i for i, ip in enumerate(ips) if start <= ip < start + max(size, 1)}
    rows = [[i, orc.relative[i], orc.entry(i), lines[i]] for i in sorted(chosen)]
    functions = {name: orc.functions[name][0] for name in present}
    data = {"orc_header": orc.header, "ip_base": orc.base, "functions": functions, "entries": rows}
    out.write_text(json.dumps(data, indent=0) + "\n")


def _section(elf: ELFFile, name: str) -> Section:
    section = elf.get_section_by_name(name)
    assert section is not None, f"no {name}"
    return section


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
