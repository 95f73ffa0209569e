"""Frame-pointer unwinding: one step up the saved-RBP chain.

Rule for a framed function (x86-64 System V with frame pointers):
    return address = *(rbp + 8),  caller's rbp = *rbp,  caller's rsp = rbp + 16.
i386 code (`word` 4) has 4-byte slots:
    return address = *(ebp + 4),  caller's ebp = *ebp,  caller's esp = ebp + 8,
with addresses modulo 2**32.
The leaf may sit where RBP does not yet (or no longer) frame it; with the code bytes
at hand, those spots are recognised:
    at `push %rbp` (entry), `endbr64`/`endbr32` or `ret`:
        return address = *rsp,          caller's rbp = rbp
    at `mov %rsp,%rbp` after the push:
        return address = *(rsp + word), caller's rbp = *rsp
(i386 encodings: push 55, mov 89 e5 or 8b ec, ret c3, endbr32 f3 0f 1e fb.)
"""

from __future__ import annotations

from qmpprof.errors import MemoryFault
from qmpprof.memory import MemoryReader, read_word

_PUSH_RBP = b"\x55"
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
_ENDBR32 = b"\xf3\x0f\x1e\xfb"
_RET = b"\xc3"
_MOV_RBP_RSP = b"\x48\x89\xe5"
#: `mov %esp,%ebp` in its two encodings (GCC writes the first, some assemblers the second).
_MOV_EBP_ESP = (b"\x89\xe5", b"\x8b\xec")
_MASK32 = 0xFFFF_FFFF


def frame_pointer_step(
    memory: MemoryReader, rsp: int, rbp: int, leaf_slot: int | None = None, word: int = 8
) -> tuple[int, int | None, int]:
    """(caller's pc, caller's rsp, caller's rbp) of the frame at (rsp, rbp), for code of
    `word` bytes (8: x86-64, 4: i386).

    `leaf_slot` is where an unframed leaf keeps its return address (leaf_return_slot).
    Caller's rsp is None when rbp does not point at a frame (0, or misaligned).
    Raises MemoryFault.
    """
    if word != 8:
        return _step32(memory, rsp, rbp, leaf_slot)
    if leaf_slot is not None:
        caller_rbp = memory.read_u64(rsp) if leaf_slot > rsp else rbp
        return memory.read_u64(leaf_slot), leaf_slot + 8, caller_rbp
    if rbp == 0 or rbp % 8:
        return 0, None, rbp
    return memory.read_u64(rbp + 8), rbp + 16, memory.read_u64(rbp)


def _step32(
    memory: MemoryReader, esp: int, ebp: int, leaf_slot: int | None
) -> tuple[int, int | None, int]:
    if leaf_slot is not None:
        caller_ebp = read_word(memory, esp, 4) if leaf_slot > esp else ebp
        return read_word(memory, leaf_slot, 4), (leaf_slot + 4) & _MASK32, caller_ebp
    if ebp == 0 or ebp % 4:
        return 0, None, ebp
    return read_word(memory, ebp + 4, 4), (ebp + 8) & _MASK32, read_word(memory, ebp, 4)


def leaf_return_slot(code: MemoryReader, rip: int, rsp: int, word: int = 8) -> int | None:
    """Where the return address is when the leaf's frame is not (or no longer) set up."""
    if word != 8:
        return _leaf_return_slot32(code, rip, rsp)
    first = _reads(code, rip, 1)
    if first is None:
        return None  # no code to read there: the longer reads below would fault too
    if first in (_PUSH_RBP, _RET) or _reads(code, rip, 4) == _ENDBR64:
        return rsp
    if _reads(code, rip, 3) == _MOV_RBP_RSP and _reads(code, rip - 1, 1) == _PUSH_RBP:
        return rsp + 8
    return None


def _leaf_return_slot32(code: MemoryReader, eip: int, esp: int) -> int | None:
    if _reads(code, eip, 1) in (_PUSH_RBP, _RET) or _reads(code, eip, 4) == _ENDBR32:
        return esp
    if _reads(code, eip, 2) in _MOV_EBP_ESP and _reads(code, eip - 1, 1) == _PUSH_RBP:
        return (esp + 4) & _MASK32
    return None


def _reads(code: MemoryReader, address: int, size: int) -> bytes | None:
    try:
        return code.read(address, size)
    except MemoryFault:
        return None
