"""The closed set of unwind rules one CFI row compiles to, each a formula.

Registers are numbered in the unwinder's one numbering (numbering.py), x86-64's DWARF
numbers first: 0 rax, 1 rdx, 2 rcx, 3 rbx, 4 rsi, 5 rdi, 6 rbp, 7 rsp, 8-15 r8-r15, 16
the pc (rip), then AArch64's. `regs` below is the frame being unwound (the callee); the
rules give the caller's values.

32-bit x86 (i386) code is unwound in the same numbering: a 32-bit vCPU's EAX..EIP are
RAX..RIP's low halves, and i386 CFI's own numbers (0 eax, 1 ecx, 2 edx, 3 ebx, 4 esp,
5 ebp, 6 esi, 7 edi, 8 eip) are translated when it is decoded (numbering.py). Its rows
and rules carry `word` 4: save slots are 4 bytes and addresses wrap at 2**32. Rows of
x86-64 code have word 8 (the default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from qmpprof.errors import MemoryFault, UnsupportedExpression
from qmpprof.isa.x86 import CALLEE_SAVED_32, CALLEE_SAVED_64
from qmpprof.isa.x86 import REGISTER_NAMES as X86_NAMES
from qmpprof.memory import MemoryReader, read_word
from qmpprof.unwind import numbering
from qmpprof.unwind.dwarf_expr import Expression, evaluate
from qmpprof.unwind.numbering import FRAME_POINTER, PC, STACK_POINTER

#: Index = DWARF register number.
DWARF_REGISTER_NAMES = tuple(str(name) for name in X86_NAMES[: PC + 1])
REGISTER_COUNT = numbering.REGISTER_COUNT
RSP = STACK_POINTER
RBP = FRAME_POINTER
RIP = PC

MASK32 = 0xFFFF_FFFF

Registers = Sequence[int | None]


# The rules whose formula depends on the word are two classes each: `CfaRule(...,
# word=4)` makes a `_CfaRule32`, and so on, so that the 64-bit hot path runs exactly the
# code it ran before i386 (no test of the word per frame). Made with `word` 4, such an
# object keeps its class: `dataclasses.replace` of its word is not supported.


@dataclass(frozen=True, slots=True)
class CfaRule:
    """CFA = regs[register] + offset, or CFA = eval(expression) when one is given;
    modulo 2**(8 * word)."""

    register: int
    offset: int
    expression: Expression | None = None
    word: int = 8

    def __new__(cls, *args: object, **kwargs: object) -> CfaRule:
        word = args[3] if len(args) > 3 else kwargs.get("word", 8)
        return object.__new__(_CfaRule32 if cls is CfaRule and word != 8 else cls)

    def compute(self, regs: Registers, memory: MemoryReader) -> int:
        if self.expression is not None:
            return evaluate(self.expression, regs, memory)
        base = regs[self.register] if self.register < REGISTER_COUNT else None
        if base is None:
            raise UnsupportedExpression(f"CFA is based on register {self.register}, unknown here")
        return (base + self.offset) & 0xFFFF_FFFF_FFFF_FFFF


@dataclass(frozen=True, slots=True)
class _CfaRule32(CfaRule):
    """A CfaRule of i386 code: 32-bit arithmetic."""

    def compute(self, regs: Registers, memory: MemoryReader) -> int:
        if self.expression is not None:
            return evaluate(self.expression, regs, memory, (), self.word)
        base = regs[self.register] if self.register < REGISTER_COUNT else None
        if base is None:
            raise UnsupportedExpression(f"CFA is based on register {self.register}, unknown here")
        return (base + self.offset) & MASK32


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
    """reg = regs[reg] (the callee did not change it); unknown for a register with no
    slot (a corrupt return column's)."""

    register: int

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return regs[self.register] if self.register < len(regs) else None


@dataclass(frozen=True, slots=True)
class SavedAt(RegisterRule):
    """reg = *(CFA + offset): saved on the stack, in a slot of `word` bytes."""

    offset: int
    word: int = 8

    def __new__(cls, *args: object, **kwargs: object) -> SavedAt:
        word = args[1] if len(args) > 1 else kwargs.get("word", 8)
        return object.__new__(_SavedAt32 if cls is SavedAt and word != 8 else cls)

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return memory.read_u64(cfa + self.offset)


@dataclass(frozen=True, slots=True)
class _SavedAt32(SavedAt):
    """A SavedAt of i386 code: a 4-byte slot, its address modulo 2**32."""

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return read_word(memory, cfa + self.offset, self.word)


@dataclass(frozen=True, slots=True)
class ValueAt(RegisterRule):
    """reg = CFA + offset (DW_CFA_val_offset; modulo 2**32 for 4-byte words)."""

    offset: int
    word: int = 8

    def __new__(cls, *args: object, **kwargs: object) -> ValueAt:
        word = args[1] if len(args) > 1 else kwargs.get("word", 8)
        return object.__new__(_ValueAt32 if cls is ValueAt and word != 8 else cls)

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return cfa + self.offset


@dataclass(frozen=True, slots=True)
class _ValueAt32(ValueAt):
    """A ValueAt of i386 code: modulo 2**32."""

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return (cfa + self.offset) & MASK32


@dataclass(frozen=True, slots=True)
class InRegister(RegisterRule):
    """reg = regs[other] (saved in another register)."""

    register: int

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return regs[self.register] if self.register < REGISTER_COUNT else None


@dataclass(frozen=True, slots=True)
class SavedAtExpression(RegisterRule):
    """reg = *eval(expression, CFA pushed first) (DW_CFA_expression), `word` bytes."""

    expression: Expression
    word: int = 8

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        address = evaluate(self.expression, regs, memory, (cfa,), self.word)
        return read_word(memory, address, self.word)


@dataclass(frozen=True, slots=True)
class ValueOfExpression(RegisterRule):
    """reg = eval(expression, CFA pushed first) (DW_CFA_val_expression)."""

    expression: Expression
    word: int = 8

    def recover(self, cfa: int, regs: Registers, memory: MemoryReader) -> int | None:
        return evaluate(self.expression, regs, memory, (cfa,), self.word)


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
    not lie above this one. `word`: 8 for x86-64 code, 4 for i386 code (its rules read
    4-byte slots, and the registers a call preserves are i386's). `saved`: the
    registers a call preserves, where the word does not say (another instruction set's).
    """

    cfa: CfaRule
    rules: tuple[tuple[int, RegisterRule], ...]
    return_column: int = RIP
    signal_frame: bool = False
    switches_stack: bool = False
    word: int = 8
    saved: tuple[int, ...] | None = None
    #: The registers whose caller values equal ours without a rule.
    callee_saved: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        saved = CALLEE_SAVED_64 if self.word == 8 else CALLEE_SAVED_32
        object.__setattr__(self, "callee_saved", self.saved or saved)

    def caller_registers(self, regs: Registers, memory: MemoryReader) -> list[int | None]:
        """The caller's registers (index RIP: its pc, None at the end of the stack).

        Raises MemoryFault for an unreadable save slot and UnsupportedExpression.
        """
        cfa = self.cfa.compute(regs, memory)
        if self.signal_frame:
            caller = list(regs)
        else:  # the unwinder's hottest line: seven copies beat a filter over all of them
            caller = [None] * REGISTER_COUNT
            for register in self.callee_saved:
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
