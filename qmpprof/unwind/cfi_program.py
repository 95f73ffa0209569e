"""Run one FDE's call frame instructions (after its CIE's) into a table of UnwindRows.

Every DW_CFA_* instruction of DWARF 5 is decoded, plus the GNU extensions
(DW_CFA_GNU_args_size, DW_CFA_GNU_negative_offset_extended, DW_CFA_GNU_window_save,
DW_CFA_MIPS_advance_loc8). Semantics follow the DWARF 5 standard (section 6.4.2) and,
where it leaves room, what GCC's unwinder and binutils' readelf do: remember/restore
state includes the CFA rule, DW_CFA_restore of a register the CIE gave no rule
removes its rule. The rows are checked against `readelf --debug-dump=frames-interp`
(tests/unit/test_cfi_readelf.py).

Anything else raises BadCfi, and the FDE is reported as uncompiled: an unknown
opcode, instructions cut short, a row without a CFA rule (a CIE that never names the
CFA register), a location that moves backwards, remember_state nested too deep.

A CIE's register numbers, its return column's included, are translated to the
internal numbering as they are read (numbering.py, by the CIE's instruction set), in
expressions too; an i386 CIE's rules and rows get word 4. Where a call returns through
a register (AArch64's x30), that register's rule is "same value" until the CIE or FDE
says otherwise: a function's caller is in it until the function saves it.
"""

from __future__ import annotations

from collections.abc import Callable

from qmpprof.errors import BadCfi
from qmpprof.isa.registry import ISAS
from qmpprof.unwind import rules as r
from qmpprof.unwind.cfi_entries import MASK64, Cie, FdeEntry, Reader
from qmpprof.unwind.dwarf_expr import Expression, decode_expression

MAX_REGISTER = 1024  # x86-64 numbers stop near 130; beyond this is garbage
MAX_REMEMBERED = 64

_RuleSet = dict[int, r.RegisterRule]


class _Machine:
    """The state of the CFA program: current location, CFA rule and register rules."""

    def __init__(self, cie: Cie, reader: Reader) -> None:
        self.cie = cie
        self.word = cie.word
        self.isa = ISAS[cie.isa]
        self.internal = self.isa.to_internal
        self.return_column = self.internal(cie.return_column)
        self.reader = reader
        self.location = 0
        self.cfa_register: int | None = None
        self.cfa_offset = 0
        self.cfa_expression: Expression | None = None
        self.rules: _RuleSet = {}
        if self.isa.returns_through_register:
            self.rules[self.return_column] = r.SameValue(self.return_column)
        self.initial_rules: _RuleSet = {}
        self.remembered: list[tuple[int | None, int, Expression | None, _RuleSet]] = []
        self.rows: list[tuple[int, r.UnwindRow]] | None = None  # None while running the CIE
        self.row: r.UnwindRow | None = None  # the current state as a row, until it changes

    def run(self, reader: Reader) -> None:
        self.reader = reader
        while not reader.at_end():
            opcode = reader.u8()
            primary = opcode & 0xC0
            if primary == 0x40:
                self.advance((opcode & 0x3F) * self.cie.code_alignment)
            elif primary == 0x80:
                register = self.internal(opcode & 0x3F)
                self.set_rule(register, self.saved_at(reader.uleb() * self.cie.data_alignment))
            elif primary == 0xC0:
                self.restore(self.internal(opcode & 0x3F))
            else:
                handler = _EXTENDED.get(opcode)
                if handler is None:
                    raise BadCfi(f"unknown CFA instruction {opcode:#04x}")
                handler(self)

    # -- locations and rows ---------------------------------------------------------

    def advance(self, delta: int) -> None:
        self.move_to(self.location + delta)

    def move_to(self, location: int) -> None:
        self.emit()
        if location < self.location:
            raise BadCfi("location moves backwards")
        self.location = location

    def emit(self) -> None:
        """The current state becomes the row for the current location."""
        if self.rows is None:
            return  # a CIE's initial instructions describe no rows of their own
        row = self.row or self._make_row()
        self.row = row
        if self.rows and self.rows[-1][0] == self.location:
            self.rows[-1] = (self.location, row)  # a zero advance: the later state wins
        else:
            self.rows.append((self.location, row))

    def _make_row(self) -> r.UnwindRow:
        if self.cfa_expression is None and self.cfa_register is None:
            raise BadCfi("no CFA rule (the CIE names no CFA register)")
        key = (
            self.cfa_register,
            self.cfa_offset,
            self.cfa_expression,
            tuple(self.rules.items()),
            self.return_column,
            self.cie.signal_frame,
            self.word,
            self.isa.callee_saved,
        )
        row = _ROWS.get(key)
        if row is None:
            if len(_ROWS) >= MAX_SHARED_ROWS:
                _ROWS.clear()
            row = _ROWS[key] = _new_row(*key)
        return row

    # -- state changes --------------------------------------------------------------

    def changed(self) -> None:
        self.row = None

    def register(self) -> int:
        number = self.reader.uleb()
        if number > MAX_REGISTER:
            raise BadCfi(f"register number {number} out of range")
        return self.internal(number)

    def saved_at(self, offset: int) -> r.SavedAt:
        return r.SavedAt(offset, self.word)

    def set_rule(self, register: int, rule: r.RegisterRule) -> None:
        self.rules[register] = rule
        self.row = None

    def restore(self, register: int) -> None:
        if register in self.initial_rules:
            self.rules[register] = self.initial_rules[register]
        else:
            self.rules.pop(register, None)
        self.row = None

    def define_cfa(self, register: int | None, offset: int) -> None:
        if register is not None:
            self.cfa_register = register
            self.cfa_expression = None
        self.cfa_offset = _signed64(offset)
        self.row = None

    def data_factored(self, value: int) -> int:
        return _signed64(value * self.cie.data_alignment)

    def expression(self) -> Expression:
        block = self.reader.take(self.reader.uleb())
        return decode_expression(block, self.cie.address_size, self.internal)

    def remember(self) -> None:
        if len(self.remembered) >= MAX_REMEMBERED:
            raise BadCfi("DW_CFA_remember_state nested too deep")
        state = (self.cfa_register, self.cfa_offset, self.cfa_expression, dict(self.rules))
        self.remembered.append(state)

    def restore_state(self) -> None:
        if not self.remembered:
            raise BadCfi("DW_CFA_restore_state without DW_CFA_remember_state")
        register, offset, expression, rules = self.remembered.pop()
        self.cfa_register, self.cfa_offset, self.cfa_expression = register, offset, expression
        self.rules = rules
        self.row = None


#: Rows are few and repeat across functions (rsp+16, ra at cfa-8, ...): one object each
#: makes compiling cheaper and the tables smaller.
_ROWS: dict[tuple[object, ...], r.UnwindRow] = {}
MAX_SHARED_ROWS = 1 << 16


def _new_row(
    register: int | None,
    offset: int,
    expression: Expression | None,
    rules: tuple[tuple[int, r.RegisterRule], ...],
    return_column: int,
    signal_frame: bool,
    word: int,
    callee_saved: tuple[int, ...],
) -> r.UnwindRow:
    if expression is not None:
        cfa = r.CfaRule(-1, 0, expression, word)
    else:
        assert register is not None
        cfa = r.CfaRule(register, offset, None, word)
    return r.UnwindRow(cfa, rules, return_column, signal_frame, word=word, saved=callee_saved)


def _signed64(value: int) -> int:
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


def compile_fde(fde: FdeEntry) -> tuple[list[int], list[r.UnwindRow]]:
    """(row start addresses, rows) of one FDE. Raises BadCfi."""
    cie = fde.cie
    machine = _Machine(cie, Reader(b"", 0, 0))
    machine.run(Reader(cie.instructions, 0, len(cie.instructions), cie.instructions_address))
    machine.initial_rules = dict(machine.rules)
    machine.remembered.clear()
    machine.location = fde.start
    machine.rows = []
    machine.row = None
    base = fde.instructions_address
    machine.run(Reader(fde.instructions, 0, len(fde.instructions), base))
    machine.emit()
    rows = machine.rows
    return [location for location, _ in rows], [row for _, row in rows]


def _set_loc(m: _Machine) -> None:
    cie = m.cie
    m.move_to(m.reader.pointer(cie.fde_encoding, cie.address_size))


def _offset_extended(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, m.saved_at(m.data_factored(m.reader.uleb())))


def _offset_extended_sf(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, m.saved_at(m.data_factored(m.reader.sleb())))


def _negative_offset_extended(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, m.saved_at(m.data_factored(-m.reader.uleb())))


def _val_offset(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, r.ValueAt(m.data_factored(m.reader.uleb()), m.word))


def _val_offset_sf(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, r.ValueAt(m.data_factored(m.reader.sleb()), m.word))


def _in_register(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, r.InRegister(m.register()))


def _expression_rule(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, r.SavedAtExpression(m.expression(), m.word))


def _val_expression(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, r.ValueOfExpression(m.expression(), m.word))


def _def_cfa(m: _Machine) -> None:
    register = m.register()
    m.define_cfa(register, m.reader.uleb())


def _def_cfa_sf(m: _Machine) -> None:
    register = m.register()
    m.define_cfa(register, m.data_factored(m.reader.sleb()))


def _def_cfa_expression(m: _Machine) -> None:
    m.cfa_expression = m.expression()
    m.changed()


def _def_cfa_register(m: _Machine) -> None:
    register = m.register()
    m.define_cfa(register, m.cfa_offset)


def _same_value(m: _Machine) -> None:
    register = m.register()
    m.set_rule(register, r.SameValue(register))


def _skip_uleb(m: _Machine) -> None:
    m.reader.uleb()  # DW_CFA_GNU_args_size: bytes of outgoing arguments, not our business


_EXTENDED: dict[int, Callable[[_Machine], None]] = {
    0x00: lambda m: None,  # DW_CFA_nop
    0x01: _set_loc,
    0x02: lambda m: m.advance(m.reader.u8() * m.cie.code_alignment),
    0x03: lambda m: m.advance(m.reader.unsigned(2) * m.cie.code_alignment),
    0x04: lambda m: m.advance(m.reader.unsigned(4) * m.cie.code_alignment),
    0x05: _offset_extended,
    0x06: lambda m: m.restore(m.register()),  # DW_CFA_restore_extended
    0x07: lambda m: m.set_rule(m.register(), r.Undefined()),
    0x08: _same_value,
    0x09: _in_register,
    0x0A: _Machine.remember,
    0x0B: _Machine.restore_state,
    0x0C: _def_cfa,
    0x0D: _def_cfa_register,
    0x0E: lambda m: m.define_cfa(None, m.reader.uleb()),
    0x0F: _def_cfa_expression,
    0x10: _expression_rule,
    0x11: _offset_extended_sf,
    0x12: _def_cfa_sf,
    0x13: lambda m: m.define_cfa(None, m.data_factored(m.reader.sleb())),
    0x14: _val_offset,
    0x15: _val_offset_sf,
    0x16: _val_expression,
    0x1D: lambda m: m.advance(m.reader.unsigned(8) * m.cie.code_alignment),  # MIPS_advance_loc8
    # DW_CFA_AARCH64_negate_ra_state (SPARC's window_save): the return address is signed
    # from here; every AArch64 return address is stripped anyway (isa/aarch64.py).
    0x2D: lambda m: None,
    0x2E: _skip_uleb,
    0x2F: _negative_offset_extended,
}
