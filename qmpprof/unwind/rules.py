"""The closed set of unwind rules one CFI row compiles to, each a formula.

Registers are numbered as DWARF numbers them on x86-64: 0 rax, 1 rdx, 2 rcx, 3 rbx,
4 rsi, 5 rdi, 6 rbp, 7 rsp, 8-15 r8-r15, 16 the return address (rip). `regs` below
is the frame being unwound (the callee); the rules give the caller's values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qmpprof.errors import MemoryFault, UnsupportedExpression
from qmpprof.memory import MemoryReader
from qmpprof.unwind.dwarf_expr import Expression, evaluate

#: Index = DWARF register number.
DWARF_REGISTER_NAMES = (
    "rax",
    "rdx",
    "rcx",
    "rbx",
    "rsi",
    "rdi",
    "rbp",
    "rsp",
    *(f"r{n}" for n in range(8, 16)),
    "rip",
)
RSP = 7
RBP = 6
RIP = 16
REGISTER_COUNT = 17
#: Registers a normal call preserves (System V): their caller values equal ours
#: unless a rule says otherwise. All others are unknown in the caller.
CALLEE_SAVED = frozenset({3, 6, 7, 12, 13, 14, 15})
_CALLEE_SAVED_IN_ORDER = tuple(sorted(CALLEE_SAVED))

Registers = Sequence[int | None]


@dataclass(frozen=True, slots=True)
class CfaRule:
    """CFA = regs[register] + offset, or CFA = eval(expression) when one is given."""

    register: int
    offset: int
    expression: Expression | None = None

    def compute(self, regs: Registers, memory: MemoryReader) -> int:
        if self.expression is not None:
            return evaluate(self.expression, regs, memory)
        base = regs[self.register] if self.register < REGISTER_COUNT else None
        if base is None:
            raise UnsupportedExpression(f"CFA is based on register {self.register}, unknown here")
        return (base + self.offset) & 0xFFFF_FFFF_FFFF_FFFF


class RegisterRule:
    """How to recover one register of the caller."""

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Undefined(RegisterRule):
    """reg = undefined. For the return address: this is the outermost frame."""

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class SameValue(RegisterRule):
    """reg = regs[reg] (the callee did not change it)."""

    register: int

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return regs[self.register]


@dataclass(frozen=True, slots=True)
class SavedAt(RegisterRule):
    """reg = *(CFA + offset): saved on the stack."""

    offset: int

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return memory.read_u64(cfa + self.offset)


@dataclass(frozen=True, slots=True)
class ValueAt(RegisterRule):
    """reg = CFA + offset (DW_CFA_val_offset)."""

    offset: int

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return cfa + self.offset


@dataclass(frozen=True, slots=True)
class InRegister(RegisterRule):
    """reg = regs[other] (saved in another register)."""

    register: int

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return regs[self.register] if self.register < REGISTER_COUNT else None


@dataclass(frozen=True, slots=True)
class SavedAtExpression(RegisterRule):
    """reg = *eval(expression, CFA pushed first) (DW_CFA_expression)."""

    expression: Expression

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return memory.read_u64(evaluate(self.expression, regs, memory, (cfa,)))


@dataclass(frozen=True, slots=True)
class ValueOfExpression(RegisterRule):
    """reg = eval(expression, CFA pushed first) (DW_CFA_val_expression)."""

    expression: Expression

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return evaluate(self.expression, regs, memory, (cfa,))


@dataclass(frozen=True, slots=True)
class Unsupported(RegisterRule):
    """A rule the compiler could not translate (kept so the unwind can say so)."""

    reason: str

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        raise UnsupportedExpression(self.reason)


@dataclass(frozen=True, slots=True)
class UnwindRow:
    """Everything needed to step from a frame at one address to its caller.

    Registers without a rule keep their value if callee-saved, else become unknown;
    RSP without a rule is the CFA. `signal_frame`: the caller's address is an
    interrupted instruction, not a return address. `switches_stack`: the caller's frame
    may be on another stack (the kernel's IRQ stack links to the task's), so it need
    not lie above this one.
    """

    cfa: CfaRule
    rules: tuple[tuple[int, RegisterRule], ...]
    return_column: int = RIP
    signal_frame: bool = False
    switches_stack: bool = False

    def caller_registers(self, regs: Registers, memory: MemoryReader) -> list[int | None]:
        """The caller's registers (index RIP: its pc, None at the end of the stack).

        Raises MemoryFault for an unreadable save slot and UnsupportedExpression.
        """
        cfa = self.cfa.compute(regs, memory)
        if self.signal_frame:
            caller = list(regs)
        else:  # the unwinder's hottest line: seven copies beat a filter over all of them
            caller = [None] * REGISTER_COUNT
            for register in _CALLEE_SAVED_IN_ORDER:
                caller[register] = regs[register]
        caller[RSP] = cfa
        return_address: int | None = None
        for register, rule in self.rules:
            if register == self.return_column:
                return_address = rule.recover(cfa, regs, memory)
            elif register < REGISTER_COUNT:
                caller[register] = _recover_or_unknown(rule, cfa, regs, memory)
        caller[RIP] = return_address
        return caller


def _recover_or_unknown(
    rule: RegisterRule, cfa: int, regs: Registers, memory: MemoryReader
) -> int | None:
    """A register other than the return address that cannot be read becomes unknown:
    the unwind goes on while no later rule needs it (a stale save slot below RSP,
    for example, is outside the captured stack)."""
    try:
        return rule.recover(cfa, regs, memory)
    except MemoryFault:
        return None
