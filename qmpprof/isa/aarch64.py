"""AArch64: QEMU's register dump, frame records, the link register, signed returns.

A call leaves its return address in x30 (the link register, LR), not on the stack: a
function's caller is in LR until the function saves it, in its frame record
(`[x29] = caller's x29, [x29 + 8] = LR`) for code built with frame pointers. CFI's
return column is x30 (DWARF 30), whose rule, where the CIE gives none, is "same value".

Return addresses may be signed (pointer authentication: `paciasp`, CFI's
DW_CFA_AARCH64_negate_ra_state): the signature sits in the bits above the virtual
address size. With 48-bit addresses, bit 55 says which half the address is in, and
copying it over bits 48-63 takes the signature off; an unsigned address is unchanged,
so every return address is stripped, signed or not. 52-bit addresses and other
translation granules are not handled yet.
"""

from __future__ import annotations

import contextlib
import re

from qmpprof.errors import MemoryFault, RegisterParseError
from qmpprof.isa.base import Isa, Progress, Registers
from qmpprof.memory import MemoryReader
from qmpprof.model import KERNEL_HALF, RegisterSet, StopReason
from qmpprof.unwind.numbering import (
    AARCH64_LR,
    AARCH64_X0,
    FRAME_POINTER,
    PC,
    REGISTER_COUNT,
    STACK_POINTER,
    from_aarch64,
)
from qmpprof.unwind.stop import StopUnwind

#: RegisterSet.general's names by internal number (unwind/numbering.py).
REGISTER_NAMES: tuple[str | None, ...] = tuple(
    {
        FRAME_POINTER: "x29",
        STACK_POINTER: "sp",
        PC: "pc",
        AARCH64_LR: "x30",
        **{AARCH64_X0 + n: f"x{n}" for n in range(29)},
    }.get(number)
    for number in range(REGISTER_COUNT)
)
#: AAPCS64: x19-x28, the frame pointer and sp survive a call.
CALLEE_SAVED = (FRAME_POINTER, STACK_POINTER, *range(AARCH64_X0 + 19, AARCH64_X0 + 29))

_VA_BITS = 48
_LOW_HALF = (1 << _VA_BITS) - 1
_HIGH_BITS = ((1 << 64) - 1) ^ _LOW_HALF
_HALF_BIT = 1 << 55


def strip_return(address: int) -> int:
    """`address` with a pointer-authentication signature taken off (48-bit addresses)."""
    return address | _HIGH_BITS if address & _HALF_BIT else address & _LOW_HALF


# Instructions a leaf's frame-record step recognises (A64, little-endian words).
_PACIASP = 0xD503233F
_BTI_C = 0xD503245F
_RET = 0xD65F03C0
_RETAA = 0xD65F0BFF
#: `stp x29, x30, [sp, #-n]!`: any n (the imm7 field masked out).
_STP_FRAME_MASK, _STP_FRAME = 0xFFC07FFF, 0xA9807BFD
_MOV_X29_SP = 0x910003FD
#: `add x29, sp, #imm` (any imm12, unshifted): a frame record placed above the locals.
_ADD_X29_SP_MASK, _ADD_X29_SP = 0xFFC003FF, 0x910003FD
#: `ldp x29, x30, [sp], #n` (post-index, any n): the record popped.
_LDP_FRAME_MASK, _LDP_FRAME = 0xFFC07FFF, 0xA8C07BFD
#: The most code read between a leaf's function start and its pc (1,024 instructions).
MAX_PROLOGUE_SCAN = 4096


_WFI = 0xD503207F
_WFE = 0xD503205F


def waits_after(instruction: bytes) -> bool:
    """Whether `instruction` (the 4 bytes before a vCPU's pc) is WFI or WFE: QEMU moves
    the pc past a wait for an interrupt before it halts the vCPU there, and its register
    dump has no halt flag of its own."""
    return len(instruction) == 4 and int.from_bytes(instruction, "little") in (_WFI, _WFE)


def _instruction(code: MemoryReader, address: int) -> int | None:
    try:
        return int.from_bytes(code.read(address, 4), "little")
    except MemoryFault:
        return None


def _leaf_caller_in_lr(code: MemoryReader | None, pc: int, start: int | None) -> bool | None:
    """Where a leaf keeps its caller: True in LR (before `stp x29, x30` stored the
    frame record, at the `ret` after it was popped, or anywhere in a function that sets
    up no record before `pc`: GCC's leaf functions have none), False in a frame record
    at SP (the record stored, x29 not yet pointing at it), None: where x29 says.
    `start`: where the function starts, when a symbol says."""
    if code is None:
        return None
    word = _instruction(code, pc)
    if word in (_PACIASP, _BTI_C, _RET, _RETAA):
        return True
    if word is not None and word & _STP_FRAME_MASK == _STP_FRAME:
        return True
    before = _instruction(code, pc - 4) or 0
    if word == _MOV_X29_SP and before & _STP_FRAME_MASK == _STP_FRAME:
        return False
    if before & _LDP_FRAME_MASK == _LDP_FRAME:
        return True  # popped: x29 is the caller's again, its return address in LR
    if start is not None and 0 < pc - start <= MAX_PROLOGUE_SCAN and not pc % 4:
        return _sets_no_record(code, start, pc)
    return None


def _sets_no_record(code: MemoryReader, start: int, pc: int) -> bool | None:
    """Whether the code from `start` to `pc` never points x29 at a frame record (True:
    the caller is in LR); None when it cannot be read."""
    try:
        words = code.read(start, pc - start)
    except MemoryFault:
        return None
    for at in range(0, len(words), 4):
        word = int.from_bytes(words[at : at + 4], "little")
        if word & _ADD_X29_SP_MASK == _ADD_X29_SP:  # mov x29, sp is add x29, sp, #0
            return None
    return True


#: BL imm26; BLR Xn; BLRAA/BLRAB Xn, Xm and BLRAAZ/BLRABZ Xn (pointer authentication):
#: (mask, value) of each, the operands masked out.
_CALLS = ((0xFC00_0000, 0x9400_0000), (0xFFFF_FC1F, 0xD63F_0000), (0xFEFF_F800, 0xD63F_0800))


def follows_call(code: MemoryReader, return_address: int) -> bool | None:
    """Whether the instruction before `return_address` is a call (BL, BLR, BLRA*); None
    if the code cannot be read. A return address is 4-byte aligned."""
    if return_address % 4:
        return False
    word = _instruction(code, return_address - 4)
    if word is None:
        return None
    return any(word & mask == value for mask, value in _CALLS)


def frame_step(
    regs: Registers,
    leaf: bool,
    memory: MemoryReader,
    code: MemoryReader | None,
    word: int,
    at_entry: bool,
    start: int | None = None,
) -> tuple[Registers, Progress]:
    """One frame record up (x29's chain); a leaf whose record is not set up (or is
    popped) returns to LR, with the stack it has. From the kernel's stack to the lower
    half's: a record an exception entry stored for the interrupted code (the example
    guest's; Linux ends its chain at an entry from EL0 instead)."""
    sp, fp = regs[STACK_POINTER], regs[FRAME_POINTER]
    if fp is None or (sp is None and leaf):
        raise StopUnwind(StopReason.NO_UNWIND_INFO)
    caller: Registers = [None] * REGISTER_COUNT
    for register in CALLEE_SAVED:
        caller[register] = regs[register]
    if sp is None:
        return _record_step(caller, fp, memory)
    pc = regs[PC] or 0
    where = True if leaf and at_entry else _leaf_caller_in_lr(code, pc, start) if leaf else None
    if where is True:
        lr = regs[AARCH64_LR]
        if lr is None:
            raise StopUnwind(StopReason.NO_UNWIND_INFO)
        caller[PC] = lr
        if pc >= KERNEL_HALF > strip_return(lr):
            return _from_exception_vector(caller, fp, lr, memory)
        return caller, Progress.UP_OR_SAME
    record = sp if where is False else fp
    if where is None and (fp == 0 or fp % 8):
        raise StopUnwind(StopReason.END_OF_STACK if fp == 0 else StopReason.BAD_FRAME)
    # The record an exception entry stored gave the interrupted pc, not its sp: the
    # kernel's stack pointer is still carried while x29 already points at user stack.
    # Not at the leaf: a vCPU at an exception vector has stored no record yet.
    crossing = not leaf and fp < KERNEL_HALF <= sp
    if where is None and fp < sp and not crossing:
        raise StopUnwind(StopReason.NO_PROGRESS)
    try:
        caller[FRAME_POINTER] = memory.read_u64(record)
        caller[PC] = memory.read_u64(record + 8)
    except MemoryFault as fault:
        raise StopUnwind(StopReason.FAULT, fault.address) from fault
    caller[STACK_POINTER] = record + 16
    return caller, Progress.OTHER_STACK if crossing else Progress.UP


def _from_exception_vector(
    caller: Registers, fp: int, lr: int, memory: MemoryReader
) -> tuple[Registers, Progress]:
    """The user code an exception vector was taken from: its x29 and LR are live, its pc
    (ELR_EL1) and stack pointer (SP_EL0) are not in the dump. Its caller is LR's; the
    frame records go on from x29, without the one the interrupted function stored if it
    holds LR's return address too (that function, whose pc is unknown, is left out)."""
    caller[STACK_POINTER] = None
    with contextlib.suppress(MemoryFault):
        if fp and not fp % 8 and strip_return(memory.read_u64(fp + 8)) == strip_return(lr):
            following = memory.read_u64(fp)
            caller[FRAME_POINTER] = following if following > fp else 0
    return caller, Progress.OTHER_STACK


def _record_step(caller: Registers, fp: int, memory: MemoryReader) -> tuple[Registers, Progress]:
    """One frame record up where the stack pointer is not known (after an exception
    vector taken from EL0): the records alone, each above the one before."""
    if fp == 0 or fp % 8:
        raise StopUnwind(StopReason.END_OF_STACK if fp == 0 else StopReason.BAD_FRAME)
    try:
        caller[FRAME_POINTER] = memory.read_u64(fp)
        caller[PC] = memory.read_u64(fp + 8)
    except MemoryFault as fault:
        raise StopUnwind(StopReason.FAULT, fault.address) from fault
    following = caller[FRAME_POINTER] or 0
    if following and following <= fp:
        caller[FRAME_POINTER] = 0  # not above: this return address is the last one
    return caller, Progress.OTHER_STACK


AARCH64 = Isa(
    name="aarch64",
    word=8,
    to_internal=from_aarch64,
    callee_saved=CALLEE_SAVED,
    register_names=REGISTER_NAMES,
    frame_step=frame_step,
    returns_through_register=True,
    strip_return=strip_return,
    follows_call=follows_call,
)


# -- QEMU's register dump (target/arm/cpu.c, aarch64_cpu_dump_state) -------------------

# Bounded repetitions only (see target/registers.py): a scan costs O(n) on any text.
_HEX = "[0-9a-f]{1,16}+"
_SPACE = r"\s{1,8}+"
_X_NAMES = tuple(f"X{n:02d}" for n in range(31))
#: PC, X00..X30, SP and PSTATE in QEMU's fixed order: one match reads them all, and the
#: kilobytes of SVE and FP state after them are never scanned.
_LAYOUT = re.compile(
    r"\s{0,8}+PC=(?P<PC>"
    + _HEX
    + ")"
    + "".join(rf"{_SPACE}{name}=(?P<{name}>{_HEX})" for name in _X_NAMES)
    + rf"{_SPACE}SP=(?P<SP>{_HEX}){_SPACE}PSTATE=(?P<PSTATE>[0-9a-f]{{1,8}}+)"
)
_ASSIGNMENT = re.compile(r"\b([A-Z][A-Z0-9]{0,7}+)=([0-9a-f]{1,16}+)\b")
#: Where the state a profile needs ends: FP/SIMD and SVE registers follow.
_TAIL_MARKERS = ("\nFPCR=", "\nFPSR=", "\nQ00=", "\nZ00=", "\nP00=", "FPU disabled")
_PSTATE_NRW = 1 << 4


#: How far into a block its PSTATE line is looked for (after the 33 registers before it).
_PSTATE_WITHIN = 4096


def is_aarch64_block(text: str) -> bool:
    """Whether a `CPU#n` block is an AArch64 vCPU's: it has a PSTATE, as no x86 one does."""
    return "PSTATE=" in text[:_PSTATE_WITHIN]


def parse_block(text: str, vcpu: int) -> RegisterSet:
    """The registers of one AArch64 vCPU's `CPU#n` block. Raises RegisterParseError."""
    match = _LAYOUT.match(text)
    values = match.groupdict() if match else _scanned(text)
    missing = [name for name in ("PC", "SP", "PSTATE", "X29", "X30") if name not in values]
    if missing:
        raise RegisterParseError(f"vCPU {vcpu}: no {', '.join(missing)} in register dump")
    pstate = int(values["PSTATE"], 16)
    if pstate & _PSTATE_NRW:
        raise RegisterParseError(f"vCPU {vcpu}: in AArch32 state, which is not supported")
    general = {f"x{n}": int(values[f"X{n:02d}"], 16) for n in range(31) if f"X{n:02d}" in values}
    general |= {"sp": int(values["SP"], 16), "pc": int(values["PC"], 16), "pstate": pstate}
    return RegisterSet(
        vcpu=vcpu,
        general=general,
        cs=0,
        cpl=(pstate >> 2) & 3,
        halted=False,
        bits=64,
        isa="aarch64",
    )


def _scanned(text: str) -> dict[str, str]:
    """Every `NAME=hex` before the FP and vector state (the first one of a name wins)."""
    ends = [at for at in (text.find(marker) for marker in _TAIL_MARKERS) if at >= 0]
    head = text[: min(ends)] if ends else text
    return dict(reversed(_ASSIGNMENT.findall(head)))
