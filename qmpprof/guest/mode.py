"""Kernel, user or idle: decided from the CPU state, not from the address."""

from __future__ import annotations

from qmpprof.model import Mode, RegisterSet


def mode_of(registers: RegisterSet) -> Mode:
    """A halted vCPU is idle; otherwise x86's CPL 0 is the kernel and CPL 3 user space,
    AArch64's EL0 user space and EL1 or above the kernel (RegisterSet.cpl)."""
    if registers.halted:
        return Mode.IDLE
    return Mode.USER if registers.user_mode else Mode.KERNEL
