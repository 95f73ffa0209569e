"""A vCPU in `error_entry`, called by an interrupt's stub from user mode, unwinds to the
stub and on to the user code the interrupt stopped (unwind/orc_mends.py; issue 48: the
kernel's ORC rows go from `error_entry` straight to the user code, the stub left out).

On each Debian kernel's vmlinux (its ORC, mended as qmpprof loads it, and its code):
`objdump -d` lists `error_entry`'s instructions, and the test runs those that move the
stack or the registers the unwind reads (the pushes, the return address moved to RSI
and pushed again, 5.10's `pop %r12`, the clearing `xor`s) on a stack laid out as the
CPU leaves it (the interrupt frame, the stub's -1 and its return address). At each
instruction up to the copy to the task's stack the frames must be error_entry's pc, the
stub's return address (objdump: after its `call error_entry`), the interrupted user pc
and its caller (through the user's RBP, live or pushed). Checked against GDB on running
guests by integration/test_linux_gdb_agreement.py
(test_every_instruction_of_an_interrupt_entry_from_user_mode_agrees_with_gdb)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.modules import Module, load_module
from qmpprof.unwind.rules import DWARF_REGISTER_NAMES, REGISTER_COUNT, RIP, RSP, UnwindRow
from qmpprof.unwind.unwinder import unwind
from tests.linux_vm import nm_symbols
from tests.unit.conftest import NoFunctionFacts

CACHE = Path.home() / ".cache" / "qmpprof" / "linux"
ABIS = ("5.10.0-46-amd64", "6.1.0-50-amd64", "6.12.95+deb12-amd64")
STUB = "asm_sysvec_apic_timer_interrupt"
#: The CPU's entry stack (its top), and the user's stack and code.
ENTRY_STACK_TOP = 0xFFFF_FE00_0000_3000
USER_RIP, USER_CALLER, USER_RSP, USER_RBP = 0x40_16D8, 0x40_16FD, 0x7FFD_0F00, 0x7FFD_1000
USER_CS, USER_SS, RFLAGS = 0x33, 0x2B, 0x202
#: An interrupt taken in kernel mode: at a function's first instruction (its ORC row
#: reads the return address at RSP), on a stack whose return address is zero.
KERNEL_FUNCTION, KERNEL_RSP, KERNEL_CS = "default_idle", 0xFFFF_C900_0000_3F00, 0x10
_LINE = re.compile(r"^\s*([0-9a-f]+):\t(\S+)[ \t]*([^#\n]*)", re.MULTILINE)
OBJDUMP = ("objdump", "-d", "--no-show-raw-insn")
_WIDE = {"e" + n: "r" + n for n in ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp")}


def vmlinux(abi: str) -> Path:
    path = CACHE / abi / "vmlinux"
    if not path.exists():
        pytest.skip(f"no {path}: make linux-guest fetches it")
    return path


@cache
def kernel(abi: str) -> Module:
    return load_module(vmlinux(abi))


def disassembly(elf: Path, start: int, size: int) -> list[tuple[int, str, str]]:
    done = subprocess.run(
        [*OBJDUMP, f"--start-address={start:#x}", f"--stop-address={start + size:#x}", str(elf)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [(int(a, 16), op, args.strip()) for a, op, args in _LINE.findall(done.stdout)]


def returns_to(elf: Path) -> int:
    """The address after the stub's `call error_entry`, as objdump lists it."""
    (stub,) = nm_symbols(elf)[STUB]
    code = disassembly(elf, stub, 0x40)
    calls = [i for i, (_, op, args) in enumerate(code) if op == "call" and "<error_entry>" in args]
    return code[calls[0] + 1][0]


def register(operand: str) -> str:
    name = operand.lstrip("%")
    return _WIDE.get(name, name[:-1] if name.endswith("d") else name)


class Machine:
    """The registers and the entry stack the instructions run on (only what they touch)."""

    def __init__(self, returns: int, interrupted: tuple[int, int, int, int] | None = None) -> None:
        """`interrupted`: the RIP, CS, RSP and SS the interrupt frame holds (the user's
        by default)."""
        rip, cs, rsp, ss = interrupted or (USER_RIP, USER_CS, USER_RSP, USER_SS)
        self.regs = {name: 0x1000 + 8 * n for n, name in enumerate(DWARF_REGISTER_NAMES)}
        self.regs["rbp"] = USER_RBP
        frame = [returns, (1 << 64) - 1, rip, cs, RFLAGS, rsp, ss]
        self.regs["rsp"] = ENTRY_STACK_TOP - 8 * len(frame)
        self.stack = {self.regs["rsp"] + 8 * n: word for n, word in enumerate(frame)}

    def run(self, op: str, args: str) -> None:
        rsp = self.regs["rsp"]
        operands = args.split(",")
        if op == "push":
            self.regs["rsp"] = rsp - 8
            self.stack[rsp - 8] = self.regs[register(args)]
        elif op == "pop":
            self.regs[register(args)] = self.stack[rsp]
            self.regs["rsp"] = rsp + 8
        elif op == "mov" and operands == ["0x8(%rsp)", "%rsi"]:
            self.regs["rsi"] = self.stack[rsp + 8]
        elif op == "mov" and operands == ["%rdi", "0x8(%rsp)"]:
            self.stack[rsp + 8] = self.regs["rdi"]
        elif op == "mov" and operands == ["%rsp", "%rdi"]:
            self.regs["rdi"] = rsp
        elif op == "xor" and operands[0] == operands[1]:
            self.regs[register(operands[0])] = 0

    def memory(self) -> WindowMemory:
        low = min(self.stack)
        words = b"".join(
            self.stack.get(a, 0).to_bytes(8, "little") for a in range(low, ENTRY_STACK_TOP, 8)
        )
        user = (0).to_bytes(8, "little") + USER_CALLER.to_bytes(8, "little")
        # The interrupted kernel stack: a zero return address, where the stack ends.
        kernel = bytes(16)
        windows = [MemoryWindow(low, words), MemoryWindow(USER_RBP, user)]
        return WindowMemory([*windows, MemoryWindow(KERNEL_RSP, kernel)])

    def unwind_from(self, pc: int, module: Module) -> list[int]:
        regs: list[int | None] = [None] * REGISTER_COUNT
        for number, name in enumerate(DWARF_REGISTER_NAMES[:RIP]):
            regs[number] = self.regs[name]
        regs[RIP], regs[RSP] = pc, self.regs["rsp"]
        stack = unwind(regs, self.memory(), KernelRows(module), code=module.code)
        return [frame.address for frame in stack.frames]


class KernelRows(NoFunctionFacts):
    """The kernel's (mended) ORC as the unwinder asks for it; no rows for user code."""

    def __init__(self, module: Module) -> None:
        self.module = module

    def row_for(self, address: int) -> UnwindRow | None:
        assert self.module.orc is not None
        return self.module.orc.row_for(address) if address >= 1 << 63 else None

    def starts_function(self, address: int) -> bool:
        return self.module.symbols.starts_at(address)


@pytest.mark.parametrize("abi", ABIS)
def test_every_instruction_of_error_entry_from_user_mode_unwinds_through_the_stub(
    abi: str,
) -> None:
    elf, module = vmlinux(abi), kernel(abi)
    (start,) = nm_symbols(elf)["error_entry"]
    code = {a: (op, args) for a, op, args in disassembly(elf, start, 0x200)}
    returns = returns_to(elf)
    machine, pc, seen = Machine(returns), start, []
    while "<sync_regs>" not in code[pc][1]:
        seen.append((pc, machine.unwind_from(pc, module)))
        op, args = code[pc]
        machine.run(op, args)
        following = [a for a in code if a > pc]
        jumped = op == "jmp" and "<error_entry+" in args
        pc = int(args.split()[0], 16) if jumped else min(following)  # `je`: not from user
    wrong = [
        (hex(a), [hex(f) for f in frames])
        for a, frames in seen
        if frames[:4] != [a, returns, USER_RIP, USER_CALLER]
    ]
    assert len(seen) >= 30 and not wrong, wrong


def kernel_mode_path(code: dict[int, tuple[str, str]], start: int) -> list[int]:
    """error_entry's instructions from `start` that an entry from kernel mode runs, in
    order, to its return (`jmp __x86_return_thunk`): the `je` after the test of CS taken
    (.Lerror_kernelspace), the next two not (the interrupted pc is no iretq), the `jne`
    taken (nor .Lgs_change)."""
    path, pc, je_seen = [], start, 0
    while True:
        path.append(pc)
        op, args = code[pc]
        if "<__x86_return_thunk>" in args or op == "ret":
            return path
        taken = op == "jne" or (op == "je" and je_seen == 0)
        je_seen += op == "je"
        pc = int(args.split()[0], 16) if taken else min(a for a in code if a > pc)


@pytest.mark.parametrize("abi", ABIS)
def test_every_instruction_of_error_entry_from_kernel_mode_unwinds_through_the_stub(
    abi: str,
) -> None:
    """The same on error_entry's path from kernel mode (.Lerror_kernelspace): the frames
    must be error_entry's pc, the stub's return address and the interrupted kernel pc."""
    elf, module = vmlinux(abi), kernel(abi)
    symbols = nm_symbols(elf)
    (start,) = symbols["error_entry"]
    interrupted = min(symbols[KERNEL_FUNCTION])
    code = {a: (op, args) for a, op, args in disassembly(elf, start, 0x200)}
    returns = returns_to(elf)
    machine = Machine(returns, (interrupted, KERNEL_CS, KERNEL_RSP, 0))
    seen = []
    for pc in kernel_mode_path(code, start):
        seen.append((pc, machine.unwind_from(pc, module)))
        machine.run(*code[pc])
    wrong = [
        (hex(a), [hex(f) for f in frames])
        for a, frames in seen
        if frames[:3] != [a, returns, interrupted]
    ]
    assert len(seen) >= 20 and not wrong, wrong
