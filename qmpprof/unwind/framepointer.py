"""Frame-pointer unwinding: one step up the saved-RBP chain.

Rule for a framed function (x86-64 System V with frame pointers):
    return address = *(rbp + 8),  caller's rbp = *rbp,  caller's rsp = rbp + 16.
The leaf may sit where RBP does not yet (or no longer) frame it; with the code bytes
at hand, those spots are recognised:
    at `push %rbp` (entry) or at `ret`:  return address = *rsp,      caller's rbp = rbp
    at `mov %rsp,%rbp` after the push:   return address = *(rsp + 8), caller's rbp = *rsp
"""

from __future__ import annotations

from qmpprof.errors import MemoryFault
from qmpprof.memory import MemoryReader

_PUSH_RBP = b"\x55"
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
_RET = b"\xc3"
_MOV_RBP_RSP = b"\x48\x89\xe5"


def frame_pointer_step(
    memory: MemoryReader, rsp: int, rbp: int, leaf_slot: int | None = None
) -> tuple[int, int | None, int]:
    """(caller's pc, caller's rsp, caller's rbp) of the frame at (rsp, rbp).

    `leaf_slot` is where an unframed leaf keeps its return address (leaf_return_slot).
    Caller's rsp is None when rbp does not point at a frame (0, or misaligned).
    Raises MemoryFault.
    """
    if leaf_slot is not None:
        caller_rbp = memory.read_u64(rsp) if leaf_slot > rsp else rbp
        return memory.read_u64(leaf_slot), leaf_slot + 8, caller_rbp
    if rbp == 0 or rbp % 8:
        return 0, None, rbp
    return memory.read_u64(rbp + 8), rbp + 16, memory.read_u64(rbp)


def leaf_return_slot(code: MemoryReader, rip: int, rsp: int) -> int | None:
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
