"""x86-64 and i386: RBP frames, return addresses on the stack, `syscall`'s edge.

A 32-bit vCPU's EAX..EIP are RAX..RIP's low halves (RegisterSet names them so), so both
share x86-64's register names; i386 CFI is renumbered into them (unwind/numbering.py).
"""

from __future__ import annotations

from qmpprof.errors import MemoryFault
from qmpprof.isa.base import Isa, Progress, Registers
from qmpprof.memory import MemoryReader
from qmpprof.model import StopReason
from qmpprof.unwind.callsite import follows_call
from qmpprof.unwind.framepointer import frame_pointer_step, leaf_return_slot
from qmpprof.unwind.numbering import (
    FRAME_POINTER,
    PC,
    REGISTER_COUNT,
    STACK_POINTER,
    from_i386,
    from_x86_64,
)
from qmpprof.unwind.stop import StopUnwind

#: RegisterSet.general's names by internal number.
REGISTER_NAMES: tuple[str | None, ...] = (
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
    *(None,) * (REGISTER_COUNT - PC - 1),
)
#: Registers a normal call preserves (System V): x86-64's rbx, rbp, rsp, r12-r15;
#: i386's (cdecl) ebx, esi, edi, ebp, esp.
CALLEE_SAVED_64 = (3, 6, 7, 12, 13, 14, 15)
CALLEE_SAVED_32 = (3, 4, 5, 6, 7)
#: Those a frame-pointer step keeps, besides RSP and RBP.
_KEPT_64 = (3, 12, 13, 14, 15)
_KEPT_32 = (3, 4, 5)


def frame_step(
    regs: Registers,
    leaf: bool,
    memory: MemoryReader,
    code: MemoryReader | None,
    word: int,
    at_entry: bool,
    start: int | None = None,
) -> tuple[Registers, Progress]:
    """The RBP chain's step (framepointer.py); a leaf not framed yet (or any more) is
    recognised by its code bytes, or is at its function's entry (`at_entry`)."""
    rsp, rbp = regs[STACK_POINTER], regs[FRAME_POINTER]
    if rsp is None or rbp is None:
        raise StopUnwind(StopReason.NO_UNWIND_INFO)
    slot = leaf_return_slot(code, regs[PC] or 0, rsp, word) if leaf and code is not None else None
    if at_entry:
        slot = rsp
    if slot is None and 0 < rbp < rsp:
        raise StopUnwind(StopReason.NO_PROGRESS)
    try:
        caller_pc, caller_rsp, caller_rbp = frame_pointer_step(memory, rsp, rbp, slot, word)
    except MemoryFault as fault:
        raise StopUnwind(StopReason.FAULT, fault.address) from fault
    if caller_rsp is None:
        raise StopUnwind(StopReason.END_OF_STACK if rbp == 0 else StopReason.BAD_FRAME)
    caller: Registers = [None] * REGISTER_COUNT
    caller[PC], caller[STACK_POINTER], caller[FRAME_POINTER] = caller_pc, caller_rsp, caller_rbp
    for register in _KEPT_64 if word == 8 else _KEPT_32:
        caller[register] = regs[register]
    return caller, Progress.UP


X86_64 = Isa(
    name="x86_64",
    word=8,
    to_internal=from_x86_64,
    callee_saved=CALLEE_SAVED_64,
    register_names=REGISTER_NAMES,
    frame_step=frame_step,
    x86=True,
    follows_call=follows_call,
)
I386 = Isa(
    name="i386",
    word=4,
    to_internal=from_i386,
    callee_saved=CALLEE_SAVED_32,
    register_names=REGISTER_NAMES,
    frame_step=frame_step,
    x86=True,
    follows_call=follows_call,
)
