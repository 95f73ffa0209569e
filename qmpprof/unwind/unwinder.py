"""The unwinder loop: CFI where a module has it, frame pointers where it does not.

Per frame: find the row for the frame's pc (pc - 1 for a return address, since the
call may be the last instruction of a function), recover the caller's registers,
check the stack moved up, repeat. Every step can fail on guest data; the unwind
then ends with a StopReason, never an exception, and never loops.

32-bit x86 code unwinds in the same loop and register numbering (rules.py): a CFI row
carries its own word (4 for an i386 module's), and a frame-pointer step takes the word
of the module at its pc (CfiLookup.word_size), else the vCPU's (`unwind(word=...)`):
a 32-bit program under a 64-bit kernel has frames of both widths on one stack.

What differs between instruction sets (the frame-pointer convention, whether a call
returns through a register, signed return addresses, x86's `syscall` edge and call
sites) the unwind's `isa` says (qmpprof/isa); the loop is the same for each.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from qmpprof.defaults import DEFAULT_MAX_DEPTH
from qmpprof.errors import MemoryFault, UnsupportedExpression
from qmpprof.isa.base import Isa, Progress
from qmpprof.isa.registry import ISAS
from qmpprof.isa.x86 import X86_64
from qmpprof.memory import MemoryReader, read_word
from qmpprof.model import (
    KERNEL_HALF,
    FrameAddress,
    FrameKind,
    Recovery,
    RegisterSet,
    StopReason,
    UnwoundStack,
)
from qmpprof.unwind.callsite import DIRECT_CALL_BYTES, direct_call_target, follows_call
from qmpprof.unwind.rules import (
    DWARF_REGISTER_NAMES,
    RBP,
    RIP,
    RSP,
    Undefined,
    UnwindRow,
)
from qmpprof.unwind.stop import StopUnwind


class Strategy(Enum):
    """Which unwinding methods to use (`--unwind`)."""

    AUTO = "auto"  # ORC (a Linux kernel's), else DWARF CFI, else frame pointers
    CFI = "cfi"  # DWARF CFI only
    FP = "fp"


_RCX = DWARF_REGISTER_NAMES.index("rcx")
#: No code runs in the first page (no OS maps it): a pc below is a misread frame.
FIRST_CODE_ADDRESS = 0x1000


class CfiLookup(Protocol):
    def row_for(self, address: int) -> UnwindRow | None: ...

    def starts_function(self, address: int) -> bool:
        """Whether a function's symbol starts at `address` (its return address is then
        at RSP, as GDB assumes where no table describes the code)."""
        ...

    def function_start(self, address: int) -> int | None:
        """Where the function (by its symbol) around `address` starts; None where no
        symbol is known."""
        ...

    def word_size(self, address: int) -> int | None:
        """The word (8 or 4 bytes) of the code at `address`, from its module's ELF
        class; None where no module is known (the unwind's `word` applies)."""
        ...

    def words(self) -> frozenset[int]:
        """Every answer of word_size but None: where they are all the unwind's own
        word, frame-pointer steps need not ask (the common case, and a hot path)."""
        ...


_Stop = StopUnwind


def dwarf_registers(registers: RegisterSet) -> list[int | None]:
    """The vCPU's registers in the unwinder's numbering (unwind/numbering.py)."""
    get = registers.general.get
    names = ISAS[registers.isa].register_names
    return [get(name) if name is not None else None for name in names]


def word_for(bits: int) -> int:
    """The `word` to unwind a vCPU's stack with, from the width of the code it ran
    (RegisterSet.bits): 8 in 64-bit mode, else 4."""
    return 8 if bits == 64 else 4


def unwind(
    regs: list[int | None],
    memory: MemoryReader,
    cfi: CfiLookup | None,
    strategy: Strategy = Strategy.AUTO,
    code: MemoryReader | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    word: int = 8,
    isa: Isa = X86_64,
) -> UnwoundStack:
    """Unwind from `regs` (DWARF-numbered, RIP the pc). Never raises on guest data.

    `word`: the vCPU's, 8 in 64-bit mode, 4 in 32-bit (`word_for`): the width of the
    frame-pointer steps where no module says otherwise (CfiLookup.word_size). Only in
    x86's 64-bit mode is a `syscall` edge recognised. `isa`: the vCPU's instruction set
    (x86's for either word)."""
    pc = regs[RIP]
    assert pc is not None
    frames = [FrameAddress(pc, FrameKind.INSTRUCTION)]
    exact = True
    seen: set[tuple[int, int | None]] = set()
    widths = cfi if cfi is not None and cfi.words() - {word} else None
    try:
        while len(frames) < max_depth:
            regs, exact, how = _step(
                regs, exact, len(frames) == 1, memory, cfi, strategy, code, word, widths, isa
            )
            caller_pc = regs[RIP]
            if caller_pc and isa.strip_return is not None:
                caller_pc = regs[RIP] = isa.strip_return(caller_pc)
            if not caller_pc:
                return UnwoundStack(tuple(frames), StopReason.END_OF_STACK)
            if caller_pc < FIRST_CODE_ADDRESS:
                return UnwoundStack(tuple(frames), StopReason.BAD_PC)
            # Where the stack pointer is not known, the frame record's place tells frames apart.
            place = regs[RSP] if regs[RSP] is not None else regs[RBP]
            if (caller_pc, place) in seen:
                return UnwoundStack(tuple(frames), StopReason.NO_PROGRESS)
            seen.add((caller_pc, place))
            kind = FrameKind.INSTRUCTION if exact else FrameKind.RETURN
            frames.append(FrameAddress(caller_pc, kind, how))
    except _Stop as stop:
        return UnwoundStack(tuple(frames), stop.reason, stop.address)
    return UnwoundStack(tuple(frames), StopReason.MAX_DEPTH)


def _step(
    regs: list[int | None],
    exact: bool,
    leaf: bool,
    memory: MemoryReader,
    cfi: CfiLookup | None,
    strategy: Strategy,
    code: MemoryReader | None,
    word: int,
    widths: CfiLookup | None,
    isa: Isa,
) -> tuple[list[int | None], bool, Recovery]:
    """One frame up: (caller's registers, whether its pc is exact, how it was found).
    `widths`: where to ask each frame-pointer step's word, when modules of another
    word than the vCPU's are mapped."""
    pc = regs[RIP]
    assert pc is not None
    if regs[RSP] is None:  # the stack pointer is not known: frame records alone
        return _fp_step(regs, leaf, memory, code, word, False, isa), False, Recovery.FRAME_POINTER
    if leaf and word == 8 and isa.x86 and _at_system_call_edge(regs):
        return _user_side_of_system_call(regs), True, Recovery.SYSTEM_CALL
    row = None
    if cfi is not None and strategy is not Strategy.FP:
        row = cfi.row_for(pc if exact else pc - 1)
    if row is not None and not _ends_stack(row):
        return _cfi_step(row, regs, memory, isa), row.signal_frame, Recovery.CFI
    if widths is not None:
        word = widths.word_size(pc if exact else pc - 1) or word
    # Where the table ends the stack (6.1's retpoline thunks) or, unwinding with every
    # method, says nothing (6.12's thunks), a call may still have entered the code.
    width = row.word if row is not None else word
    if (
        isa.x86
        and (row is not None or strategy is Strategy.AUTO)
        and _entered_by_a_call(regs, leaf, memory, cfi, code, width)
    ):
        return _fp_step(regs, leaf, memory, code, width, True, isa), False, Recovery.FRAME_POINTER
    if row is not None:
        return _cfi_step(row, regs, memory, isa), row.signal_frame, Recovery.CFI
    if strategy is Strategy.CFI:
        raise _Stop(StopReason.NO_UNWIND_INFO)
    at_entry = leaf and cfi is not None and cfi.starts_function(pc)
    start = cfi.function_start(pc) if leaf and cfi is not None else None
    caller = _fp_step(regs, leaf, memory, code, word, at_entry, isa, start)
    return caller, False, Recovery.FRAME_POINTER


def _ends_stack(row: UnwindRow) -> bool:
    return any(n == RIP and isinstance(rule, Undefined) for n, rule in row.rules)


def _entered_by_a_call(
    regs: list[int | None],
    leaf: bool,
    memory: MemoryReader,
    cfi: CfiLookup | None,
    code: MemoryReader | None,
    word: int,
) -> bool:
    """Code the table calls the end of the stack, or does not describe, where the stack
    is still the one a call entered the function with: the return address at RSP
    follows a call instruction. Where that is so:
    - a leaf at the function's first instruction (`call __x86_indirect_thunk_rax`);
    - a leaf that a direct call from the function's first instruction reached, in the
      same stack: the word at RSP returns right after that call (the thunk's
      `call .Ldo_rop` to its `mov %rax, (%rsp)`); its caller is that return address;
    - the frame at that return address: the call it follows is the first instruction,
      so above it lies the stack the function was entered with."""
    pc, rsp = regs[RIP], regs[RSP]
    if cfi is None or code is None or pc is None or rsp is None:
        return False
    if not leaf and not _direct_call_from_entry(code, cfi, pc, None, word):
        return False  # most frames no table describes: decided without reading the stack
    try:
        return_address = read_word(memory, rsp, word)
    except MemoryFault:
        return False
    if leaf and not (
        cfi.starts_function(pc) or _direct_call_from_entry(code, cfi, return_address, pc, word)
    ):
        return False
    return bool(follows_call(code, return_address))


def _direct_call_from_entry(
    code: MemoryReader, cfi: CfiLookup, return_address: int, target: int | None, word: int
) -> bool:
    """Whether `return_address` follows a direct call (`e8 rel32`) that is the first
    instruction of a function, to `target` if given."""
    call = return_address - DIRECT_CALL_BYTES
    if not cfi.starts_function(call):
        return False
    try:
        instruction = code.read(call, DIRECT_CALL_BYTES)
    except MemoryFault:
        return False
    called = direct_call_target(instruction, return_address, word)
    return called is not None and (target is None or called == target)


def _at_system_call_edge(regs: list[int | None]) -> bool:
    """Kernel code on a user stack: the first instructions of the system-call entry
    (before it switches stacks) or the `sysret` back. Nowhere else does a kernel run on
    a user-half stack, and there no unwind table helps: the kernel's own marks it as the
    end of the stack. x86-64's `syscall` only (a 64-bit vCPU's): a 32-bit system call
    (`int $0x80`, `sysenter`) switches stacks at once, and CFI describes its frame."""
    pc, rsp, rcx = regs[RIP], regs[RSP], regs[_RCX]
    return (
        pc is not None
        and pc >= KERNEL_HALF
        and rsp is not None
        and rsp < KERNEL_HALF
        and bool(rcx and rcx < KERNEL_HALF)
    )


def _user_side_of_system_call(regs: list[int | None]) -> list[int | None]:
    """The user code that made the system call: `syscall` leaves the stack alone and
    puts the address of the next instruction in RCX (which `sysret` returns to)."""
    caller = list(regs)
    caller[RIP] = regs[_RCX]
    return caller


def _cfi_step(
    row: UnwindRow, regs: list[int | None], memory: MemoryReader, isa: Isa
) -> list[int | None]:
    try:
        caller = row.caller_registers(regs, memory)
    except MemoryFault as fault:
        raise _Stop(StopReason.FAULT, fault.address) from fault
    except UnsupportedExpression as err:
        raise _Stop(StopReason.BAD_CFI) from err
    other_stack = row.signal_frame or row.switches_stack
    _check_progress(regs, caller, other_stack, isa.returns_through_register)
    return caller


def _fp_step(
    regs: list[int | None],
    leaf: bool,
    memory: MemoryReader,
    code: MemoryReader | None,
    word: int,
    at_entry: bool,
    isa: Isa,
    start: int | None = None,
) -> list[int | None]:
    caller, progress = isa.frame_step(regs, leaf, memory, code, word, at_entry, start)
    other_stack = progress is Progress.OTHER_STACK
    if other_stack and caller[RSP] is None:
        return caller  # AArch64 from an exception vector: each record checked above it
    _check_progress(regs, caller, other_stack, progress is Progress.UP_OR_SAME)
    return caller


def _check_progress(
    regs: list[int | None], caller: list[int | None], other_stack: bool, same_stack: bool = False
) -> None:
    """A caller's frame lies above its callee's: anything else is garbage or a loop.
    `same_stack`: or where it does, its return address in a register (an AArch64 leaf).

    An interrupt frame or a stack switch may move to another stack, so only its own
    repetition is caught (by the caller of this function)."""
    before, after = regs[RSP], caller[RSP]
    if after is None:
        raise _Stop(StopReason.NO_PROGRESS)
    if other_stack or before is None or after > before:
        return
    if not (same_stack and after == before):
        raise _Stop(StopReason.NO_PROGRESS)
