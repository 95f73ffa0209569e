"""i386 Linux's system-call entries before pt_regs is whole (guest/linux/syscall_entry_32.py):
`int $0x80`'s user registers from the hardware frame at the entry stack's top, `sysenter`'s
from the live EBP and the vDSO's landing pad. Checked on the real kernel by stepping GDB
through every instruction (integration/test_linux_i386_entry.py); here, the windows found
in the real code, and the rules' edges, with the values GDB showed there."""

from __future__ import annotations

from qmpprof.guest.linux.syscall_entry_32 import (
    AT_SYSINFO_EHDR,
    Layout,
    SystemCallEntry32,
    auxv_value,
    call_return,
)
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow, RegisterSet
from qmpprof.unwind.rules import RBP, REGISTER_COUNT, RIP, RSP

#: Debian 12's 6.1.0-50-686-pae, as linked: entry_SYSENTER_32 up to its call of
#: do_SYSENTER_32 (c1922de0), entry_INT80_32 up to its call of do_int80_syscall_32
#: (c1922d10). The latter holds an e8 byte in `mov %fs:0xc1e807f8,%ecx` too.
SYSENTER_AT, SYSENTER_HANDLER = 0xC193_21A0, 0xC192_2DE0
SYSENTER_CODE = bytes.fromhex(
    "9c50eb170f20d8a900100000740d25ffefffff0f22d80d00100000589d8ba4240c2000006a7b6a009c"
    "6a736a0050fc6a000fa050b8d80000008ee05881642410ffff0000f7442410020000007526814c2410"
    "0000002016548304241cff74241cff74241cff74241cff74241cff74241cff74241c061e6ada555756"
    "525153ba7b0000008eda8ec2f744243800410400756589e0e8a80bffff"
)
INT80_AT, INT80_HANDLER = 0xC193_229C, 0xC192_2D10
INT80_CODE = bytes.fromhex(
    "90909050fc6a000fa050b8d80000008ee05881642410ffff0000f7442410020000007526814c2410000000"
    "2016548304241cff74241cff74241cff74241cff74241cff74241cff74241c061e6ada555756525153ba7b"
    "0000008eda8ec2eb170f20d8a900100000740d25ffefffff0f22d80d00100000648b0df807e8c181c10030"
    "000029e181f900100000735c89e689f781e700f0ffff81c7001000008bbf0c2000008b4c243483e10383f9"
    "037211b94400000029cf89fcc1e902fcf3a5eb2989f181e100f0ffff81c10010000029f1814c2434000000"
    "80a90010000074d5814c243400000040ebcb89e0e88409ffff"
)
#: The KASLR slide and what GDB showed in the guest booted with it.
BIAS = 0x1D00_0000
ENTRY_STACK_TOP = 0xFF42_F000
USER_IP, USER_SP, USER_BP, USER_BX = 0x0804_909A, 0xBF84_CEC0, 0xBF84_CEE8, 0x3
VDSO, LANDING_PAD = 0xB7FE_B000, 0x559
TASK, MM = 0xC1C7_C000, 0xC1D0_0000
LAYOUT = Layout(
    entry_stack_top=0xC1E7_3004,
    task_mm=1008,
    saved_auxv=180,
    auxv_size=192,
    landing_pad_offset=0xC193_4A80,
)
ENTRY = SystemCallEntry32(range(INT80_AT, 0xC193_238C), range(SYSENTER_AT, 0xC193_2238), LAYOUT)


def test_each_window_ends_after_the_call_of_its_handler_in_the_real_code() -> None:
    assert call_return(SYSENTER_CODE, SYSENTER_AT, SYSENTER_HANDLER) == 0xC193_2238
    assert call_return(INT80_CODE, INT80_AT, INT80_HANDLER) == 0xC193_238C
    assert call_return(INT80_CODE, INT80_AT, SYSENTER_HANDLER) is None
    assert call_return(INT80_CODE[:-1], INT80_AT, INT80_HANDLER) is None


def registers(pc: int, sp: int, bp: int = USER_BP, bits: int = 32) -> RegisterSet:
    general = {"rip": pc + BIAS, "rsp": sp, "rbp": bp, "rbx": USER_BX, "rax": 0xD8}
    return RegisterSet(0, general, cs=0x60, cpl=0, halted=False, bits=bits)


def words(*values: int) -> bytes:
    return b"".join(value.to_bytes(4, "little") for value in values)


def int80_memory(cs: int = 0x73) -> WindowMemory:
    """The hardware frame int $0x80 pushed: EIP, CS, EFLAGS, ESP, SS."""
    frame = words(USER_IP, cs, 0x246, USER_SP, 0x7B)
    return WindowMemory([MemoryWindow(ENTRY_STACK_TOP - len(frame), frame)])


def no_task() -> int | None:
    raise AssertionError("int $0x80's rule reads no task")


def test_int80_s_user_registers_are_its_hardware_frame_at_the_entry_stack_s_top() -> None:
    asked: list[int] = []

    def per_cpu(regs: RegisterSet, at: int) -> int:
        asked.append(at)
        return ENTRY_STACK_TOP

    # on the entry stack, on the task's stack while copying pt_regs there, at the call
    for pc, sp in ((INT80_AT, 0xFF42_EFEC), (0xC193_2358, 0xC1E7_DFB4), (0xC193_2387, 0xC1E7_DFB4)):
        user = ENTRY.user_registers(registers(pc, sp), BIAS, int80_memory(), per_cpu, no_task)
        assert user is not None
        assert (user[RIP], user[RSP], user[RBP], user[3]) == (USER_IP, USER_SP, USER_BP, USER_BX)
        assert user[0] is None  # EAX: the entry clobbered it
    assert asked == [LAYOUT.entry_stack_top] * 3


def test_int80_s_frame_from_the_kernel_is_not_a_user_s() -> None:
    memory = int80_memory(cs=0x60)
    user = ENTRY.user_registers(
        registers(INT80_AT, 0), BIAS, memory, lambda r, at: ENTRY_STACK_TOP, no_task
    )
    assert user is None


def sysenter_memory(auxv: bytes) -> WindowMemory:
    """The task's mm, its saved auxiliary vector, vdso_image_32's landing pad offset, and
    the user's stack where __kernel_vsyscall pushed EBP, EDX and ECX."""
    return WindowMemory(
        [
            MemoryWindow(TASK + LAYOUT.task_mm, words(MM)),
            MemoryWindow(MM + LAYOUT.saved_auxv, auxv.ljust(LAYOUT.auxv_size, b"\0")),
            MemoryWindow(LAYOUT.landing_pad_offset + BIAS, words(LANDING_PAD)),
            MemoryWindow(USER_SP, words(USER_BP, 0x1000, 0x0804_C020, 0x0804_9148)),
        ]
    )


AUXV = words(16, 0x178BFBFF, 6, 4096, 32, VDSO + 0x540, AT_SYSINFO_EHDR, VDSO, 0, 0)


def test_sysenter_s_user_registers_are_the_landing_pad_and_the_live_ebp() -> None:
    """__kernel_vsyscall's EBP is its ESP at `sysenter`; the kernel returns to
    int80_landing_pad, where the vDSO pops the EBP it pushed."""
    memory = sysenter_memory(AUXV)
    for pc, sp in ((SYSENTER_AT, 0xFF40_4000), (0xC193_2233, 0xC1C7_DFB4)):
        regs = registers(pc, sp, bp=USER_SP)
        user = ENTRY.user_registers(regs, BIAS, memory, lambda r, at: 0, lambda: TASK)
        assert user is not None
        assert (user[RIP], user[RSP], user[RBP]) == (VDSO + LANDING_PAD, USER_SP, USER_BP)


def test_sysenter_s_placeholder_pt_regs_are_completed_as_do_sysenter_32_will() -> None:
    """entry_SYSENTER_32 pushes 0 for IP and SP; do_SYSENTER_32 sets SP from EBP."""
    memory = sysenter_memory(AUXV)
    saved: list[int | None] = [None] * REGISTER_COUNT
    saved[RIP], saved[RSP], saved[RBP] = 0, 0, USER_SP
    user = ENTRY.completed(saved, BIAS, memory, lambda: TASK)
    assert user is not None
    assert (user[RIP], user[RSP], user[RBP]) == (VDSO + LANDING_PAD, USER_SP, USER_BP)
    saved[RIP] = USER_IP
    assert ENTRY.completed(saved, BIAS, memory, lambda: TASK) is saved


def test_a_task_without_a_vdso_has_no_landing_pad() -> None:
    memory = sysenter_memory(words(6, 4096, 0, 0, AT_SYSINFO_EHDR, VDSO))
    regs = registers(SYSENTER_AT, 0xFF40_4000, bp=USER_SP)
    assert ENTRY.user_registers(regs, BIAS, memory, lambda r, at: 0, lambda: TASK) is None
    assert ENTRY.user_registers(regs, BIAS, memory, lambda r, at: 0, lambda: None) is None


def test_outside_the_windows_and_in_64_bit_mode_there_are_none() -> None:
    memory = int80_memory()
    for pc in (INT80_AT - 1, 0xC193_238C, SYSENTER_AT - 1, 0xC193_2238):
        regs = registers(pc, 0xFF42_EFEC)
        assert ENTRY.user_registers(regs, BIAS, memory, lambda r, at: 0, no_task) is None
    regs = registers(INT80_AT, 0xFF42_EFEC, bits=64)
    assert ENTRY.user_registers(regs, BIAS, memory, lambda r, at: 0, no_task) is None


def test_the_auxiliary_vector_ends_at_at_null() -> None:
    assert auxv_value(AUXV, AT_SYSINFO_EHDR) == VDSO
    assert auxv_value(words(0, 0, AT_SYSINFO_EHDR, VDSO), AT_SYSINFO_EHDR) is None
    assert auxv_value(words(AT_SYSINFO_EHDR), AT_SYSINFO_EHDR) is None
