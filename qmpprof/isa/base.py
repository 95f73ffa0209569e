"""The `Isa` type: what one instruction set decides, for the parts of qmpprof that ask."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from qmpprof.memory import MemoryReader

Registers = list[int | None]


class Progress(Enum):
    """Where a frame-pointer step's caller may lie, against its callee's stack."""

    #: Above it (a call pushed, or a frame lies between them).
    UP = "up"
    #: There or above: a leaf whose caller is still in a register.
    UP_OR_SAME = "up-or-same"
    #: On another stack: a frame record an exception entry stored, linking the handler's
    #: stack to the interrupted code's.
    OTHER_STACK = "other-stack"


class FrameStep(Protocol):
    def __call__(
        self,
        regs: Registers,
        leaf: bool,
        memory: MemoryReader,
        code: MemoryReader | None,
        word: int,
        at_entry: bool,
        start: int | None = None,
    ) -> tuple[Registers, Progress]:
        """The caller's registers by the frame-pointer convention, and where its stack
        may lie; `start`: where a leaf's function starts, when a symbol says. Raises
        StopUnwind."""
        ...


@dataclass(frozen=True, slots=True)
class Isa:
    """One instruction set, as the unwinder and the CFI decoder see it."""

    name: str
    #: Bytes of an address and a stack slot.
    word: int
    #: The unwinder's number (unwind/numbering.py) of each DWARF register number.
    to_internal: Callable[[int], int]
    #: Internal numbers of the registers a call preserves.
    callee_saved: tuple[int, ...]
    #: The RegisterSet.general name of each internal register (None: no such register).
    register_names: tuple[str | None, ...]
    #: One step up the frame-pointer chain.
    frame_step: FrameStep
    #: A call leaves the return address in a register (AArch64's link register), not on
    #: the stack: a function's caller is in that register until the function saves it,
    #: and a leaf's caller may have the same stack pointer.
    returns_through_register: bool = False
    #: Return addresses may be signed: the address with its signature taken off.
    strip_return: Callable[[int], int] | None = None
    #: x86-64's `syscall` edge and the call-site tests of x86 code bytes apply.
    x86: bool = False
    #: Whether a call instruction ends right before a return address (None: the code
    #: cannot be read). Set by each module.
    follows_call: Callable[[MemoryReader, int], bool | None] = lambda code, address: None
