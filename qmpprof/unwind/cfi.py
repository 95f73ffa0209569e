"""CFI tables: .eh_frame and .debug_frame compiled into sorted, cached unwind rows.

pyelftools parses the CIEs and FDEs; each FDE's rows are compiled to our closed rule
types (rules.py) the first time an address inside it is looked up, then kept. Lookup
is a bisection over FDE start addresses, then over the FDE's rows, with a cache of
recently seen addresses in front. Corrupt CFI never raises: an unreadable section
gives an empty table, an undecodable FDE covers nothing.
"""

from __future__ import annotations

import bisect
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elftools.dwarf.callframe import FDE, CallFrameInfo
from elftools.dwarf.callframe import RegisterRule as ElfRegisterRule
from elftools.dwarf.dwarf_expr import DWARFExprParser
from elftools.dwarf.structs import DWARFStructs
from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadElf
from qmpprof.unwind import rules as r
from qmpprof.unwind.dwarf_expr import Expression, Op

CACHE_LIMIT = 1 << 14
_STRUCTS = DWARFStructs(little_endian=True, dwarf_format=32, address_size=8)
_EXPR = DWARFExprParser(_STRUCTS)


@dataclass
class _Fde:
    start: int
    end: int
    entry: Any
    starts: list[int] = field(default_factory=list)
    rows: list[r.UnwindRow] | None = None


class CfiTable:
    """Unwind rows of one module, by address (link address = guest address)."""

    def __init__(self, fdes: list[_Fde]) -> None:
        self._fdes = _without_overlaps(sorted(fdes, key=lambda f: f.start))
        self._starts = [f.start for f in self._fdes]
        self._cache: dict[int, r.UnwindRow | None] = {}

    def __len__(self) -> int:
        return len(self._fdes)

    def row_for(self, address: int) -> r.UnwindRow | None:
        """The row covering `address`, or None where no FDE covers it."""
        cached = self._cache.get(address, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        row = self._cache[address] = self._find(address)
        return row

    def _find(self, address: int) -> r.UnwindRow | None:
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0 or address >= self._fdes[index].end:
            return None
        fde = self._fdes[index]
        if fde.rows is None:
            fde.starts, fde.rows = _compile_fde(fde.entry)
        row_index = bisect.bisect_right(fde.starts, address) - 1
        return fde.rows[row_index] if row_index >= 0 else None


def load_cfi(path: str | Path) -> CfiTable:
    """The CFI of the ELF at `path` (.eh_frame first, .debug_frame where it adds). Raises BadElf."""
    try:
        with Path(path).open("rb") as stream:
            elf = ELFFile(stream)
            fdes = _section_fdes(elf, ".eh_frame", eh_frame=True)
            fdes += _section_fdes(elf, ".debug_frame", eh_frame=False)
    except OSError as err:
        raise BadElf(str(path), err.strerror or str(err)) from err
    return CfiTable(fdes)


def _section_fdes(elf: ELFFile, name: str, eh_frame: bool) -> list[_Fde]:
    section = elf.get_section_by_name(name)
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return []
    return parse_cfi_section(section.data(), section["sh_addr"], eh_frame)


def parse_cfi_section(data: bytes, address: int, eh_frame: bool) -> list[_Fde]:
    """The FDEs of one .eh_frame/.debug_frame section; [] if it cannot be parsed."""
    try:
        info = CallFrameInfo(io.BytesIO(data), len(data), address, _STRUCTS, eh_frame)
        entries = info.get_entries()
    except Exception:
        return []
    return [
        _Fde(
            e.header["initial_location"],
            e.header["initial_location"] + e.header["address_range"],
            e,
        )
        for e in entries
        if isinstance(e, FDE) and e.header["address_range"] > 0
    ]


def _without_overlaps(fdes: list[_Fde]) -> list[_Fde]:
    """Drop FDEs that overlap an earlier one (.eh_frame came first, so it wins ties)."""
    kept: list[_Fde] = []
    for fde in fdes:
        if not kept or fde.start >= kept[-1].end:
            kept.append(fde)
    return kept


def _compile_fde(entry: Any) -> tuple[list[int], list[r.UnwindRow]]:
    """Decode one FDE's rows into UnwindRows; an undecodable FDE covers nothing."""
    try:
        decoded = entry.get_decoded()
        cie_header = entry.cie.header
        signal = b"S" in bytes(cie_header.get("augmentation") or b"")
        return_column = int(cie_header["return_address_register"])
        rows = [_compile_row(row, return_column, signal) for row in decoded.table]
    except Exception:
        return [], []
    return [row["pc"] for row in decoded.table], rows


def _compile_row(row: dict[Any, Any], return_column: int, signal: bool) -> r.UnwindRow:
    cfa = row["cfa"]
    if cfa.expr is not None:
        cfa_rule = r.CfaRule(-1, 0, _compile_expression(cfa.expr))
    else:
        cfa_rule = r.CfaRule(cfa.reg, cfa.offset)
    register_rules = tuple(
        (register, _compile_register_rule(register, rule))
        for register, rule in row.items()
        if isinstance(register, int)
    )
    return r.UnwindRow(cfa_rule, register_rules, return_column, signal)


def _compile_register_rule(register: int, rule: ElfRegisterRule) -> r.RegisterRule:
    kind, arg = rule.type, rule.arg
    if kind == ElfRegisterRule.UNDEFINED:
        return r.Undefined()
    if kind == ElfRegisterRule.SAME_VALUE:
        return r.SameValue(register)
    if kind == ElfRegisterRule.OFFSET:
        return r.SavedAt(int(arg))  # type: ignore[arg-type]
    if kind == ElfRegisterRule.VAL_OFFSET:
        return r.ValueAt(int(arg))  # type: ignore[arg-type]
    if kind == ElfRegisterRule.REGISTER:
        return r.InRegister(int(arg))  # type: ignore[arg-type]
    if kind == ElfRegisterRule.EXPRESSION:
        return r.SavedAtExpression(_compile_expression(arg))
    if kind == ElfRegisterRule.VAL_EXPRESSION:
        return r.ValueOfExpression(_compile_expression(arg))
    return r.Unsupported(f"CFI rule {kind}")


def _compile_expression(raw: Any) -> Expression:
    """pyelftools' bytes (or parsed ops) to our ops, with branch targets as op indexes."""
    ops = _EXPR.parse_expr(raw) if isinstance(raw, (bytes, bytearray, list)) else raw
    offsets = {op.offset: index for index, op in enumerate(ops)}
    end = _expression_length(raw, ops)
    offsets[end] = len(ops)
    compiled = []
    for index, op in enumerate(ops):
        args = tuple(int(a) for a in op.args)
        if op.op_name in ("DW_OP_skip", "DW_OP_bra"):
            next_offset = ops[index + 1].offset if index + 1 < len(ops) else end
            args = (offsets.get(next_offset + args[0], -1),)
        compiled.append(Op(op.op_name, args))
    return tuple(compiled)


def _expression_length(raw: Any, ops: list[Any]) -> int:
    if isinstance(raw, (bytes, bytearray, list)):
        return len(raw)
    return ops[-1].offset + 1 if ops else 0
