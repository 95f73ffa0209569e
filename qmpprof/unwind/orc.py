"""ORC, the Linux kernel's own unwind tables, read as unwind rows.

Every x86-64 distribution kernel carries `.orc_unwind_ip` (one signed 32-bit offset per
entry, relative to the offset's own address: the first instruction the entry covers) and
`.orc_unwind` (one 6-byte entry each, in the same order). objtool writes them for all
kernel code, the assembly that has no DWARF CFI included: system-call and interrupt
entry, `memset`, `clear_user_*`, the retpoline thunks. An entry says where the caller's
stack pointer is (a base register plus an offset, possibly read through memory), where
RBP was saved, and what kind of frame this is: a call frame (return address just below
the caller's stack pointer), a full `struct pt_regs` (an interrupt, exception or system
call), or only its hardware iret frame.

Each entry compiles to the same `UnwindRow` the DWARF CFI compiler makes, so one
unwinder loop walks both: a `pt_regs` row recovers every register saved there, and
when they are a user task's registers the unwind goes on in user space with them.

Two layouts of the 16-bit field that follows the two offsets:
- before 6.4 (no `.orc_header` section): sp_reg:4 bp_reg:4 type:2 end:1, with types
  call 0, regs 1, regs_partial 2, and an undefined sp_reg that is the end of the stack
  when `end` is set;
- from 6.4 (`.orc_header` present): sp_reg:4 bp_reg:4 type:3 signal:1, with types
  undefined 0, end_of_stack 1, call 2, regs 3, regs_partial 4.

Where the table is wrong, unwind/orc_mends.py mends it from the kernel's code.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from enum import Enum

from elftools.elf.elffile import ELFFile

from qmpprof.symbols.elf_file import ELF_PARSE_ERRORS
from qmpprof.unwind import rules as r
from qmpprof.unwind.dwarf_expr import Op

ENTRY_SIZE = 6
#: Rows kept per table: a profile meets a few thousand distinct entries.
CACHE_LIMIT = 1 << 14

# ORC's base registers (arch/x86/include/asm/orc_types.h), and the DWARF registers
# they name where they are registers.
_UNDEFINED, _PREV_SP, _DX, _DI, _BP, _SP, _R10, _R13, _BP_INDIRECT, _SP_INDIRECT = range(10)
_DIRECT_BASES = {_DX: 1, _DI: 5, _BP: r.RBP, _SP: r.RSP, _R10: 10, _R13: 13}

#: Where struct pt_regs keeps each register (x86-64, the layout ptrace exposes), by
#: DWARF register number.
PT_REGS = {15: 0, 14: 8, 13: 16, 12: 24, 6: 32, 3: 40, 11: 48, 10: 56, 9: 64, 8: 72}
PT_REGS |= {0: 80, 2: 88, 1: 96, 4: 104, 5: 112, r.RIP: 128, r.RSP: 152}


class Layout(Enum):
    """Which layout a kernel's `.orc_unwind` entries use (see the module's docstring)."""

    BEFORE_6_4 = "before 6.4"
    FROM_6_4 = "from 6.4"


class FrameType(Enum):
    UNKNOWN = "unknown"  # no unwind information here
    END = "end of stack"
    CALL = "call"
    REGS = "regs"
    REGS_PARTIAL = "regs partial"


@dataclass(frozen=True, slots=True)
class OrcEntry:
    """One `.orc_unwind` entry, decoded."""

    sp_offset: int
    bp_offset: int
    sp_reg: int
    bp_reg: int
    type: FrameType
    signal: bool


_OLD_TYPES = (FrameType.CALL, FrameType.REGS, FrameType.REGS_PARTIAL, FrameType.UNKNOWN)
_NEW_TYPES: tuple[FrameType, ...] = (FrameType.UNKNOWN, FrameType.END, FrameType.CALL)
_NEW_TYPES += (FrameType.REGS, FrameType.REGS_PARTIAL) + (FrameType.UNKNOWN,) * 3
_REGS_TYPES = (FrameType.REGS, FrameType.REGS_PARTIAL)


def decode_entry(data: bytes, offset: int, layout: Layout) -> OrcEntry:
    """The entry at `offset` of `.orc_unwind`'s bytes (the caller checks it is in)."""
    sp_offset, bp_offset, bits = struct.unpack_from("<hhH", data, offset)
    sp_reg, bp_reg = bits & 0xF, (bits >> 4) & 0xF
    if layout is Layout.BEFORE_6_4:
        kind = _OLD_TYPES[(bits >> 8) & 3]
        if sp_reg == _UNDEFINED:
            kind = FrameType.END if bits >> 10 & 1 else FrameType.UNKNOWN
        return OrcEntry(sp_offset, bp_offset, sp_reg, bp_reg, kind, kind in _REGS_TYPES)
    kind = _NEW_TYPES[(bits >> 8) & 7]
    return OrcEntry(sp_offset, bp_offset, sp_reg, bp_reg, kind, bool(bits >> 11 & 1))


#: The row of an end-of-stack entry: no caller.
_END_ROW = r.UnwindRow(r.CfaRule(r.RSP, 0), ((r.RIP, r.Undefined()),))


def entry_row(entry: OrcEntry) -> r.UnwindRow | None:
    """The unwind row of `entry`; None where it gives no information (or what it gives
    cannot be followed: an unknown base register)."""
    if entry.type is FrameType.END:
        return _END_ROW
    if entry.type is FrameType.UNKNOWN:
        return None
    cfa = _cfa_rule(entry)
    if cfa is None:
        return None
    rules = _frame_rules(entry.type)
    bp = _bp_rule(entry)
    if bp is None and entry.bp_reg != _UNDEFINED:
        return None
    if bp is not None:
        rules = (*[(n, rule) for n, rule in rules if n != r.RBP], (r.RBP, bp))
    switches = entry.sp_reg not in (_SP, _BP)
    return r.UnwindRow(cfa, rules, signal_frame=entry.signal, switches_stack=switches)


def _cfa_rule(entry: OrcEntry) -> r.CfaRule | None:
    """Where the caller's stack pointer is, from the entry's base register."""
    if entry.sp_reg in (_SP, _BP):
        return r.CfaRule(_DIRECT_BASES[entry.sp_reg], entry.sp_offset)
    if entry.sp_reg in _DIRECT_BASES:  # entry code: the register is the stack pointer
        return r.CfaRule(_DIRECT_BASES[entry.sp_reg], 0)
    if entry.sp_reg == _SP_INDIRECT:  # *rsp, then the offset (the IRQ stack's link)
        ops = (Op("DW_OP_breg7", (0,)), Op("DW_OP_deref"), Op("DW_OP_consts", (entry.sp_offset,)))
        return r.CfaRule(r.RSP, 0, (*ops, Op("DW_OP_plus")))
    if entry.sp_reg == _BP_INDIRECT:  # *(rbp + offset)
        return r.CfaRule(r.RBP, 0, (Op("DW_OP_breg6", (entry.sp_offset,)), Op("DW_OP_deref")))
    return None


def _frame_rules(kind: FrameType) -> tuple[tuple[int, r.RegisterRule], ...]:
    if kind is FrameType.REGS:  # the CFA is the pt_regs: every register was saved there
        return tuple((n, r.SavedAt(offset)) for n, offset in PT_REGS.items())
    if kind is FrameType.REGS_PARTIAL:  # the CFA is the iret frame: ip and sp only
        ip, sp = PT_REGS[r.RIP], PT_REGS[r.RSP]
        return ((r.RIP, r.SavedAt(0)), (r.RSP, r.SavedAt(sp - ip)))
    return ((r.RIP, r.SavedAt(-8)),)


def _bp_rule(entry: OrcEntry) -> r.RegisterRule | None:
    if entry.bp_reg == _PREV_SP:
        return r.SavedAt(entry.bp_offset)
    if entry.bp_reg == _BP:
        return r.SavedAtExpression((Op("DW_OP_breg6", (entry.bp_offset,)),))
    return None


class OrcTable:
    """A kernel's ORC entries by address (file addresses), compiled to rows on first use.

    `offsets` is `.orc_unwind_ip`'s bytes and `base` its address. The kernel's build
    sorts the table (scripts/sorttable), so it is searched as it is: nothing is
    computed per entry until looked up (the Debian kernel has 384,000), and a table
    that is not sorted gives wrong rows, never an error. `end` bounds the last entry's
    reach: the kernel's code ends there, and a module's code beyond is not described
    here."""

    def __init__(self, offsets: bytes, base: int, entries: bytes, layout: Layout, end: int) -> None:
        count = min(len(offsets) // 4, len(entries) // ENTRY_SIZE)
        self._relative = memoryview(offsets[: 4 * count]).cast("i")
        self._base = base
        self._entries = entries
        self.layout = layout
        self._end = end
        self._rows: dict[int, r.UnwindRow | None] = {}
        #: Rows that replace the table's at single addresses (unwind/orc_mends.py).
        self._mended: dict[int, r.UnwindRow] = {}

    def __len__(self) -> int:
        return len(self._relative)

    def _ip(self, index: int) -> int:
        return self._base + 4 * index + self._relative[index]

    def row_for(self, address: int) -> r.UnwindRow | None:
        """The row for `address`, or None where ORC does not describe it."""
        mended = self._mended.get(address)
        if mended is not None:
            return mended
        if address >= self._end:
            return None
        index = bisect.bisect_right(range(len(self)), address, key=self._ip) - 1
        if index < 0:
            return None
        row = self._rows.get(index, False)
        if row is False:
            if len(self._rows) >= CACHE_LIMIT:
                self._rows.clear()
            entry = decode_entry(self._entries, index * ENTRY_SIZE, self.layout)
            row = self._rows[index] = entry_row(entry)
        return row  # type: ignore[return-value]

    def mend(self, address: int, row: r.UnwindRow) -> None:
        """Describe `address` by `row`, whatever the table says there."""
        self._mended[address] = row


def read_orc(elf: ELFFile, end: int) -> OrcTable | None:
    """The ORC table of a kernel ELF opened by `open_elf`, or None without one (or with
    sections that cannot be read). `end`: where the kernel's code ends."""
    try:
        ip_section = elf.get_section_by_name(".orc_unwind_ip")
        entry_section = elf.get_section_by_name(".orc_unwind")
        if ip_section is None or entry_section is None:
            return None
        if "SHT_NOBITS" in (ip_section["sh_type"], entry_section["sh_type"]):
            return None
        offsets, base = ip_section.data(), ip_section["sh_addr"]
        entries = entry_section.data()
        new = elf.get_section_by_name(".orc_header") is not None
    except ELF_PARSE_ERRORS:
        return None
    layout = Layout.FROM_6_4 if new else Layout.BEFORE_6_4
    return OrcTable(offsets, base, entries, layout, end)
