"""Is a return address right after a call? A cheap check against torn or garbage stacks.

x86-64 calls end where the return address points: `e8 rel32` (5 bytes) or `ff /2` with
a ModRM operand (2 to 7 bytes, maybe after a REX prefix). A return address with none of
these before it did not come from a call: the stack was torn (read while the guest ran)
or the unwind went astray.

32-bit code calls the same way, without REX prefixes (a 40-4f byte there is an
`inc`/`dec`, which a call after it ends at the same address all the same), and its
ModRM operands have the same lengths (mod 0, r/m 5 is a 32-bit address, not
RIP-relative, and as long): the check holds for i386 code unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

from qmpprof.errors import MemoryFault
from qmpprof.memory import MemoryReader

_LONGEST_CALL = 8
#: `call rel32`: its opcode, and its length; `jmp rel32`'s opcode (as long, the same
#: displacement).
DIRECT_CALL = 0xE8
DIRECT_CALL_BYTES = 5
DIRECT_JUMP = 0xE9


def follows_call(code: MemoryReader, return_address: int) -> bool | None:
    """Whether a call instruction ends at `return_address`; None if the code is unknown."""
    try:
        before = code.read(return_address - _LONGEST_CALL, _LONGEST_CALL)
    except MemoryFault:
        return None
    if before[-DIRECT_CALL_BYTES] == DIRECT_CALL:
        return True
    return any(_indirect_call_ends_here(before[-length:]) for length in range(2, 8))


def direct_call_target(instruction: bytes, return_address: int, word: int = 8) -> int | None:
    """Where the `call rel32` that is `instruction` (its bytes, ending at `return_address`)
    goes, modulo 2**(8 * word); None for any other instruction."""
    if len(instruction) != DIRECT_CALL_BYTES or instruction[0] != DIRECT_CALL:
        return None
    displacement = int.from_bytes(instruction[1:], "little", signed=True)
    return (return_address + displacement) % (1 << (8 * word))


def rel32_branches_to(
    code: bytes, start: int, target: int, word: int = 8, opcode: int = DIRECT_CALL
) -> Iterator[int]:
    """The address after each `call rel32` (`opcode` DIRECT_JUMP: `jmp rel32`) to
    `target` in `code`, which lies at `start`, in order: a byte scan, where any other
    match would be a displacement that happens to land on `target`."""
    mask = (1 << (8 * word)) - 1
    at = code.find(opcode)
    while 0 <= at <= len(code) - DIRECT_CALL_BYTES:  # one turn per opcode byte
        after = at + DIRECT_CALL_BYTES
        displacement = int.from_bytes(code[at + 1 : after], "little", signed=True)
        if (start + after + displacement) & mask == target:
            yield (start + after) & mask
        at = code.find(opcode, at + 1)


def _indirect_call_ends_here(instruction: bytes) -> bool:
    """`[REX] ff /2 modrm [sib] [disp]` of exactly this length."""
    if instruction[0] & 0xF0 == 0x40:
        instruction = instruction[1:]
    if len(instruction) < 2 or instruction[0] != 0xFF or (instruction[1] >> 3) & 7 != 2:
        return False
    return _modrm_length(instruction[1:]) == len(instruction) - 1


def _modrm_length(operand: bytes) -> int:
    """Bytes of a ModRM operand (ModRM, SIB, displacement) in 64-bit mode."""
    modrm = operand[0]
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return 1
    length = 1
    if rm == 4:
        length += 1
        if mod == 0 and len(operand) > 1 and operand[1] & 7 == 5:
            return length + 4
    if mod == 0 and rm == 5:
        return length + 4
    return length + {0: 0, 1: 1, 2: 4}[mod]
