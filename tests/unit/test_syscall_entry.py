"""x86-64 Linux's system-call entry before pt_regs is whole (guest/linux/syscall_entry.py):
the user's registers come from the vCPU, RIP from RCX and RSP from the vCPU or, once the
entry switched stacks, from the per-CPU word it set the user's RSP aside in. Checked on
real kernels by stepping GDB through every instruction of the entry
(integration/test_linux_gdb_agreement.py); here, the rule's edges."""

from __future__ import annotations

from qmpprof.guest.linux.syscall_entry import SystemCallEntry
from qmpprof.model import RegisterSet
from qmpprof.unwind.rules import RBP, RIP, RSP

ENTRY = SystemCallEntry(start=0xFFFF_FFFF_81C0_0080, end=0xFFFF_FFFF_81C0_00B8, user_stack=0x6014)
BIAS = 0x1000_0000
USER_RSP, USER_RIP, USER_RBP = 0x7FFD_1000, 0x40_17C0, 0x7FFD_1040


def registers(offset: int, rsp: int) -> RegisterSet:
    general = {"rip": ENTRY.start + BIAS + offset, "rsp": rsp, "rbp": USER_RBP, "rcx": USER_RIP}
    return RegisterSet(0, general, cs=0x10, cpl=0, halted=False, bits=64)


def test_before_the_stack_switch_the_user_rsp_is_the_vcpus() -> None:
    asked: list[int] = []

    def per_cpu(regs: RegisterSet, at: int) -> int:
        asked.append(at)
        return 0

    user = ENTRY.user_registers(registers(3, USER_RSP), BIAS, per_cpu)
    assert user is not None and (user[RIP], user[RSP], user[RBP]) == (USER_RIP, USER_RSP, USER_RBP)
    assert not asked


def test_after_the_stack_switch_the_user_rsp_is_the_per_cpu_word() -> None:
    kernel_stack = 0xFFFF_C900_0040_4000
    user = ENTRY.user_registers(registers(0x29, kernel_stack), BIAS, lambda r, at: USER_RSP + at)
    assert user is not None and (user[RIP], user[RSP]) == (USER_RIP, USER_RSP + 0x6014)


def test_outside_the_prologue_there_are_none() -> None:
    end = ENTRY.end - ENTRY.start
    for offset in (-1, end, end + 1):
        assert ENTRY.user_registers(registers(offset, USER_RSP), BIAS, lambda r, at: 0) is None
