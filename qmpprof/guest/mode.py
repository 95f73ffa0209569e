"""Kernel, user or idle: decided from the CPU state, not from the address."""

from __future__ import annotations

from qmpprof.model import Mode, RegisterSet


def mode_of(registers: RegisterSet) -> Mode:
    """A halted vCPU is idle; otherwise CPL 0 is the kernel and CPL 3 user space."""
    if registers.halted:
        return Mode.IDLE
    return Mode.KERNEL if registers.cpl == 0 else Mode.USER
