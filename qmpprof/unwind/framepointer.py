"""Frame-pointer unwinding: follow the saved-RBP chain up the stack.

Rule at each frame (x86-64 System V with frame pointers):
    return address = *(rbp + 8),  caller's rbp = *rbp,  caller's rsp = rbp + 16.
The leaf may sit where RBP does not yet (or no longer) point at its own frame; with
the code bytes at hand, those spots are recognised:
    at `push %rbp` (entry) or at `ret`:  return address = *rsp,      caller's rbp = rbp
    at `mov %rsp,%rbp` after the push:   return address = *(rsp + 8), caller's rbp = *rsp
The walk is bounded, requires the stack to grow strictly upward, and ends with a
StopReason instead of raising, whatever the guest memory holds.
"""

from __future__ import annotations

from qmpprof.errors import MemoryFault
from qmpprof.memory import MemoryReader, read_u64
from qmpprof.model import FrameAddress, FrameKind, StopReason, UnwoundStack

DEFAULT_MAX_DEPTH = 128

_PUSH_RBP = b"\x55"
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
_RET = b"\xc3"
_MOV_RBP_RSP = b"\x48\x89\xe5"


def unwind_frame_pointers(
    memory: MemoryReader,
    rip: int,
    rsp: int,
    rbp: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    code: MemoryReader | None = None,
) -> UnwoundStack:
    """Unwind from (rip, rsp, rbp). Never raises on guest data; always ends with a reason.

    `code` reads instruction bytes (for example from the ELF file); without it the
    leaf is assumed to have its frame set up.
    """
    frames = [FrameAddress(rip, FrameKind.INSTRUCTION)]
    lower_bound = rsp - 1
    try:
        slot = _leaf_return_slot(code, rip, rsp) if code is not None else None
        if slot is not None:
            if slot > rsp:
                rbp = read_u64(memory, rsp)
            frames.append(FrameAddress(read_u64(memory, slot), FrameKind.RETURN))
            lower_bound = slot
    except MemoryFault as fault:
        return UnwoundStack(tuple(frames), StopReason.FAULT, fault.address)
    return _walk_chain(memory, frames, rbp, lower_bound, max_depth)


def _leaf_return_slot(code: MemoryReader, rip: int, rsp: int) -> int | None:
    """Where the return address is when the leaf's frame is not (or no longer) set up."""
    if _reads(code, rip, 1) in (_PUSH_RBP, _RET) or _reads(code, rip, 4) == _ENDBR64:
        return rsp
    if _reads(code, rip, 3) == _MOV_RBP_RSP and _reads(code, rip - 1, 1) == _PUSH_RBP:
        return rsp + 8
    return None


def _reads(code: MemoryReader, address: int, size: int) -> bytes | None:
    try:
        return code.read(address, size)
    except MemoryFault:
        return None


def _walk_chain(
    memory: MemoryReader,
    frames: list[FrameAddress],
    rbp: int,
    lower_bound: int,
    max_depth: int,
) -> UnwoundStack:
    while len(frames) < max_depth:
        if rbp == 0:
            return UnwoundStack(tuple(frames), StopReason.END_OF_STACK)
        if rbp % 8:
            return UnwoundStack(tuple(frames), StopReason.BAD_FRAME)
        if rbp <= lower_bound:
            return UnwoundStack(tuple(frames), StopReason.NO_PROGRESS)
        try:
            caller_rbp = read_u64(memory, rbp)
            return_address = read_u64(memory, rbp + 8)
        except MemoryFault as fault:
            return UnwoundStack(tuple(frames), StopReason.FAULT, fault.address)
        if return_address == 0:
            return UnwoundStack(tuple(frames), StopReason.END_OF_STACK)
        frames.append(FrameAddress(return_address, FrameKind.RETURN))
        lower_bound, rbp = rbp, caller_rbp
    return UnwoundStack(tuple(frames), StopReason.MAX_DEPTH)
