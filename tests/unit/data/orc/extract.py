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


def main(vmlinux: Path, dump: Path, out: Path) -> None:
    lines = dump.read_text().splitlines()
    with vmlinux.open("rb") as stream:
        elf = ELFFile(stream)
        ip_section = _section(elf, ".orc_unwind_ip")
        offsets, base = ip_section.data(), ip_section["sh_addr"]
        entries = _section(elf, ".orc_unwind").data()
        symtab: Any = _section(elf, ".symtab")
        symbols = {s.name: s for s in symtab.iter_symbols()}
        header = elf.get_section_by_name(".orc_header") is not None
    count = len(offsets) // 4
    assert count == len(lines), "objtool's dump is of another vmlinux"
    relative = [
        int.from_bytes(offsets[4 * i : 4 * i + 4], "little", signed=True) for i in range(count)
    ]
    ips = [base + 4 * i + value for i, value in enumerate(relative)]
    chosen: set[int] = set(random.Random(f"orc:{vmlinux.name}").sample(range(count), SAMPLED))
    present = [name for name in FUNCTIONS if name in symbols]
    for name in present:
        start = symbols[name]["st_value"]
        end = start + max(symbols[name]["st_size"], 1)
        chosen |= {i for i, ip in enumerate(ips) if start <= ip < end}
    rows = [[i, relative[i], entries[6 * i : 6 * i + 6].hex(), lines[i]] for i in sorted(chosen)]
    functions = {name: symbols[name]["st_value"] for name in present}
    data = {"orc_header": header, "ip_base": base, "functions": functions, "entries": rows}
    out.write_text(json.dumps(data, indent=0) + "\n")


def _section(elf: ELFFile, name: str) -> Section:
    section = elf.get_section_by_name(name)
    assert section is not None, f"no {name}"
    return section


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
