"""The ORC decoder against the kernel's own objtool, and ORC rows against the kernel's rules.

tests/unit/data/orc/*.json hold entries of Debian's 6.1 and 6.12 kernels (their
layouts differ) beside the line objtool's `--dump` printed for each (re-made by
tests/unit/data/orc/extract.py). The rows are checked on a stack laid out by hand as
arch/x86/kernel/unwind_orc.c reads it.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qmpprof.memory import WindowMemory
from qmpprof.model import FrameKind, MemoryWindow, Recovery
from qmpprof.unwind.orc import (
    ENTRY_SIZE,
    PT_REGS,
    FrameType,
    Layout,
    OrcEntry,
    OrcTable,
    decode_entry,
    entry_row,
)
from qmpprof.unwind.rules import RBP, REGISTER_COUNT, RIP, RSP
from qmpprof.unwind.unwinder import unwind
from tests.unit.conftest import NoFunctionFacts

DATA = Path(__file__).parent / "data" / "orc"
KERNELS = ("debian-6.1.0-50", "debian-6.12.95")

_OLD_LINE = re.compile(
    r"\S+: sp:(?P<sp>\S+) bp:(?P<bp>\S+) type:(?P<type>call|regs|regs \(partial\)) end:(?P<end>\d)"
)
_NEW_LINE = re.compile(
    r"(?P<address>[0-9a-f]+):type:(?P<type>call|\(und\)|end|regs|regs \(partial\)) "
    r"sp:(?P<sp>\S+) bp:(?P<bp>\S+) signal:(?P<signal>\d)"
)
_TYPES = {
    "call": FrameType.CALL,
    "regs": FrameType.REGS,
    "regs (partial)": FrameType.REGS_PARTIAL,
    "(und)": FrameType.UNKNOWN,
    "end": FrameType.END,
}
_REGISTERS = {"prevsp": 1, "dx": 2, "di": 3, "bp": 4, "sp": 5, "r10": 6, "r13": 7}


def _kernel(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def _layout(kernel: dict[str, Any]) -> Layout:
    return Layout.FROM_6_4 if kernel["orc_header"] else Layout.BEFORE_6_4


def _register(spec: str) -> tuple[int, int | None]:
    """objtool's print_reg() read back: (ORC register number, offset or None)."""
    if spec == "(und)":
        return 0, None
    if found := re.fullmatch(r"\(bp([-+]\d+)\)", spec):
        return 8, int(found[1])
    if found := re.fullmatch(r"\(sp\)([-+]\d+)", spec):
        return 9, int(found[1])
    found = re.fullmatch(r"([a-z0-9]+)([-+]\d+)", spec)
    assert found, spec
    return _REGISTERS[found[1]], int(found[2])


def _objtool_says(line: str, layout: Layout) -> tuple[FrameType, bool, str, str]:
    """(frame type, signal, sp, bp) of an objtool line, as the kernel's unwinder reads them."""
    if layout is Layout.FROM_6_4:
        found = _NEW_LINE.fullmatch(line)
        assert found, line
        return _TYPES[found["type"]], found["signal"] == "1", found["sp"], found["bp"]
    found = _OLD_LINE.fullmatch(line)
    assert found, line
    kind = _TYPES[found["type"]]
    if found["sp"] == "(und)":  # 6.1 ends the stack at an undefined sp with `end` set
        kind = FrameType.END if found["end"] == "1" else FrameType.UNKNOWN
    signal = kind in (FrameType.REGS, FrameType.REGS_PARTIAL)
    return kind, signal, found["sp"], found["bp"]


def _entry(kernel: dict[str, Any], row: list[Any]) -> OrcEntry:
    return decode_entry(bytes.fromhex(row[2]), 0, _layout(kernel))


@pytest.mark.parametrize("name", KERNELS)
def test_every_entry_decodes_as_objtool_prints_it(name: str) -> None:
    kernel = _kernel(name)
    layout = _layout(kernel)
    for row in kernel["entries"]:
        entry = _entry(kernel, row)
        kind, signal, sp, bp = _objtool_says(row[3], layout)
        assert (entry.type, entry.signal) == (kind, signal), row
        if kind not in (FrameType.END, FrameType.UNKNOWN):
            sp_reg, sp_offset = _register(sp)
            assert (entry.sp_reg, sp_offset) == (sp_reg, entry.sp_offset), row
        bp_reg, bp_offset = _register(bp)
        assert entry.bp_reg == bp_reg, row
        assert bp_offset is None or bp_offset == entry.bp_offset, row


def test_entry_addresses_are_where_objtool_puts_them() -> None:
    """6.12's vmlinux has no relocations for .orc_unwind_ip, so objtool prints each
    entry's address from the offsets, as OrcTable reads them."""
    kernel = _kernel("debian-6.12.95")
    for index, relative, _, line in kernel["entries"]:
        offsets = bytearray(4 * (index + 1))
        struct.pack_into("<i", offsets, 4 * index, relative)
        table = OrcTable(
            bytes(offsets),
            kernel["ip_base"],
            b"\0" * ENTRY_SIZE * (index + 1),
            Layout.FROM_6_4,
            1 << 64,
        )
        assert table._ip(index) == int(line.split(":")[0], 16)


def test_the_layouts_the_kernels_use_are_told_apart() -> None:
    assert _layout(_kernel("debian-6.1.0-50")) is Layout.BEFORE_6_4
    assert _layout(_kernel("debian-6.12.95")) is Layout.FROM_6_4


# --- rows, against a stack laid out by hand -------------------------------------------

STACK = 0xFFFF_C900_0000_0000
CALLER_PC = 0xFFFF_FFFF_8100_1234
USER_PC, USER_SP = 0x40_1730, 0x7FFF_FFFF_E000


def _first(name: str, objtool_text: str) -> OrcEntry:
    """The first entry of `name`'s data whose objtool line has `objtool_text`."""
    kernel = _kernel(name)
    row = next(row for row in kernel["entries"] if objtool_text in row[3])
    return _entry(kernel, row)


def _register_frame(name: str, kind: str, sp: str) -> OrcEntry:
    """The first entry of `name`'s data that objtool prints as a `kind` frame (`regs`,
    `regs (partial)`) with the caller's stack at `sp`, in that kernel's line layout."""
    if "6.1." in name:
        return _first(name, f"sp:{sp} bp:(und) type:{kind} end")
    return _first(name, f"type:{kind} sp:{sp} ")


def _registers(**values: int) -> list[int | None]:
    regs: list[int | None] = [None] * REGISTER_COUNT
    names = {"rsp": RSP, "rbp": RBP, "rip": RIP, "rbx": 3}
    for name, value in values.items():
        regs[names[name]] = value
    return regs


def _memory(words: dict[int, int]) -> WindowMemory:
    data = bytearray(0x400)
    for address, value in words.items():
        struct.pack_into("<Q", data, address - STACK, value)
    return WindowMemory([MemoryWindow(STACK, bytes(data))])


@pytest.mark.parametrize("name", KERNELS)
def test_a_call_frame_returns_below_the_callers_stack_pointer(name: str) -> None:
    row = entry_row(_first(name, "sp:sp+16 bp:(und)"))
    assert row is not None
    regs = _registers(rsp=STACK + 0x100, rbp=0x55, rbx=0x66, rip=0x1)
    caller = row.caller_registers(regs, _memory({STACK + 0x108: CALLER_PC}))
    assert (caller[RIP], caller[RSP], caller[RBP], caller[3]) == (
        CALLER_PC,
        STACK + 0x110,
        0x55,
        0x66,
    )
    assert not row.signal_frame


@pytest.mark.parametrize("name", KERNELS)
def test_a_frame_based_on_rbp_restores_rbp_from_the_previous_stack(name: str) -> None:
    row = entry_row(_first(name, "sp:bp+16 bp:prevsp-16"))
    assert row is not None
    regs = _registers(rsp=STACK + 0x80, rbp=STACK + 0x100, rip=0x1)
    memory = _memory({STACK + 0x100: STACK + 0x200, STACK + 0x108: CALLER_PC})
    caller = row.caller_registers(regs, memory)
    assert (caller[RIP], caller[RSP], caller[RBP]) == (CALLER_PC, STACK + 0x110, STACK + 0x200)


@pytest.mark.parametrize("name", KERNELS)
def test_a_full_register_frame_gives_the_interrupted_user_registers(name: str) -> None:
    row = entry_row(_register_frame(name, "regs", "sp+0"))
    assert row is not None and row.signal_frame
    pt_regs = STACK + 0x100
    words = {pt_regs + PT_REGS[RIP]: USER_PC, pt_regs + PT_REGS[RSP]: USER_SP}
    words |= {pt_regs + PT_REGS[RBP]: 0x7FFF_0000, pt_regs + PT_REGS[3]: 0xB8}
    caller = row.caller_registers(_registers(rsp=pt_regs, rbp=1, rbx=2, rip=3), _memory(words))
    assert (caller[RIP], caller[RSP], caller[RBP], caller[3]) == (
        USER_PC,
        USER_SP,
        0x7FFF_0000,
        0xB8,
    )


@pytest.mark.parametrize("name", KERNELS)
def test_an_iret_frame_gives_pc_and_stack_and_keeps_the_rest(name: str) -> None:
    row = entry_row(_register_frame(name, "regs (partial)", "sp+8"))
    assert row is not None and row.signal_frame
    iret = STACK + 0x108  # the hardware's frame, above an error code
    memory = _memory({iret: USER_PC, iret + 24: USER_SP})
    caller = row.caller_registers(_registers(rsp=STACK + 0x100, rbp=7, rbx=8, rip=3), memory)
    assert (caller[RIP], caller[RSP], caller[RBP], caller[3]) == (USER_PC, USER_SP, 7, 8)


@pytest.mark.parametrize("name", KERNELS)
def test_the_irq_stack_links_back_through_its_saved_stack_pointer(name: str) -> None:
    """sp:(sp)+N: the previous stack pointer is stored where rsp points (the top of
    the IRQ stack), and the caller's frame begins N bytes above it."""
    entry = _first(name, "sp:(sp)+")
    row = entry_row(entry)
    assert row is not None and row.switches_stack and entry.bp_reg in (0, 1)
    offset = entry.sp_offset
    task_stack = STACK + 0x300
    memory = _memory({STACK + 0x10: task_stack, task_stack + offset - 8: CALLER_PC})
    caller = row.caller_registers(_registers(rsp=STACK + 0x10, rbp=1, rip=3), memory)
    assert (caller[RIP], caller[RSP]) == (CALLER_PC, task_stack + offset)


@pytest.mark.parametrize("name", KERNELS)
def test_the_end_of_the_stack_has_no_caller(name: str) -> None:
    text = "end:1" if "6.1." in name else "type:end"
    row = entry_row(_first(name, text))
    assert row is not None
    caller = row.caller_registers(_registers(rsp=STACK, rip=3), _memory({}))
    assert caller[RIP] is None


def test_where_orc_knows_nothing_there_is_no_row() -> None:
    assert entry_row(_first("debian-6.12.95", "type:(und)")) is None
    assert entry_row(_first("debian-6.1.0-50", "sp:(und) bp:(und) type:call end:0")) is None


@pytest.mark.parametrize("name", KERNELS)
def test_lookup_finds_the_entry_starting_at_or_below_an_address(name: str) -> None:
    kernel = _kernel(name)
    rows = kernel["entries"]
    ips = [kernel["ip_base"] + 4 * index + relative for index, relative, _, _ in rows]
    table = _table_of(kernel, end=ips[-1])
    assert table.row_for(ips[0] - 1) is None
    assert table.row_for(ips[-1]) is None  # the kernel's code ends there
    for n, row in enumerate(rows[:-1]):
        expected = entry_row(_entry(kernel, row))
        if ips[n + 1] > ips[n]:
            assert table.row_for(ips[n]) == expected
            assert table.row_for(ips[n + 1] - 1) == expected


def _table_of(kernel: dict[str, Any], end: int) -> OrcTable:
    """The kernel's sampled entries as a table of their own: each offset rewritten to
    its new position, so the entries keep their addresses."""
    rows, base = kernel["entries"], kernel["ip_base"]
    ips = [base + 4 * index + relative for index, relative, _, _ in rows]
    offsets = b"".join(struct.pack("<i", ip - (base + 4 * n)) for n, ip in enumerate(ips))
    entries = b"".join(bytes.fromhex(row[2]) for row in rows)
    return OrcTable(offsets, base, entries, _layout(kernel), end)


@given(st.binary(max_size=64), st.binary(max_size=96), st.integers(0, (1 << 64) - 1))
def test_hostile_tables_give_rows_or_none(offsets: bytes, entries: bytes, address: int) -> None:
    for layout in Layout:
        table = OrcTable(offsets, 0xFFFF_FFFF_8100_0000, entries, layout, 1 << 64)
        row = table.row_for(address)
        assert row is None or row.cfa is not None


def test_a_vcpu_at_the_system_call_entry_unwinds_to_the_user_code_that_called() -> None:
    """At the entry's first instructions (and at `sysret`) the kernel runs on the user's
    stack, which `syscall` left alone, and RCX holds the address after the `syscall`
    (Intel SDM, SYSCALL): the user's frame comes from there, the rest from its CFI."""
    kernel_pc = 0xFFFF_FFFF_8180_0000
    regs: list[int | None] = [None] * REGISTER_COUNT
    regs[RIP], regs[RSP], regs[2], regs[RBP] = kernel_pc, USER_SP, USER_PC, 0
    stack = unwind(regs, WindowMemory([MemoryWindow(USER_SP, bytes(64))]), None)
    assert [f.address for f in stack.frames[:2]] == [kernel_pc, USER_PC]
    assert stack.frames[1].kind is FrameKind.INSTRUCTION
    assert stack.frames[1].how is Recovery.SYSTEM_CALL


@dataclass(frozen=True)
class Thunk:
    """A Debian kernel's retpoline thunk and a call to it, their bytes as its vmlinux
    holds them (objdump -d), each from 8 bytes before (a call is looked for there):
    padding, `call` to the thunk's `mov %rax, (%rsp)` (`mov_at`), the speculation trap
    between, `jmp __x86_return_thunk` after (ktime_get's calls are 6.12's)."""

    kernel: str
    #: Where the kernel's ORC calls the thunk the end of the stack, up to its `jmp`
    #: (6.1: 0x10); None where it does not describe the thunk (6.12).
    orc_end_before: int | None
    address: int
    code: bytes
    mov_at: int
    caller_return: int
    call: bytes


THUNKS = (
    Thunk(
        "debian-6.1.0-50",
        0x10,
        0xFFFF_FFFF_81E0_1580,
        bytes.fromhex("cccccccccccccccce807000000f3900faee8ebf948890424e99b070000"),
        0xC,
        0xFFFF_FFFF_8115_7F2B,  # tk_clock_read
        bytes.fromhex("488b07e85596ca00"),
    ),
    Thunk(
        "debian-6.12.95",
        None,
        0xFFFF_FFFF_81CE_13C0,
        bytes.fromhex("cccccccccccccccce801000000cc48890424e9210c0000"),
        0x6,
        0xFFFF_FFFF_811B_695D,  # ktime_get
        bytes.fromhex("488b07e863aab200"),
    ),
)


class _ThunkCfi(NoFunctionFacts):
    """The kernel's ORC where it has an entry for the thunk (6.1: the end of the stack),
    nothing elsewhere (the sampled entries around are other functions'); its symbol."""

    def __init__(self, thunk: Thunk) -> None:
        self._thunk = thunk
        self._table = _table_of(_kernel(thunk.kernel), end=thunk.address + 0x1000)

    def row_for(self, address: int) -> Any:
        end = self._thunk.orc_end_before
        if end is None or not 0 <= address - self._thunk.address < end:
            return None
        return self._table.row_for(address)

    def starts_function(self, address: int) -> bool:
        return address == self._thunk.address


def _thunk_cases() -> list[Any]:
    cases = []
    for t in THUNKS:
        mov, back, ret = t.address + t.mov_at, t.address + 5, t.caller_return
        cases += [
            # at the call into the thunk: its caller's return address at RSP
            pytest.param(t, 0, [ret], [t.address, ret], id=f"{t.kernel}-entry"),
            # at the mov: the thunk's own call returns to +5, above it the caller's frame
            pytest.param(t, t.mov_at, [back, ret], [mov, back, ret], id=f"{t.kernel}-mov"),
            # at the mov, but the word at RSP returns from a call to elsewhere: no caller
            pytest.param(t, t.mov_at, [ret], [mov], id=f"{t.kernel}-mov-not-called"),
        ]
    return cases


@pytest.mark.parametrize(("thunk", "offset", "stack", "expected"), _thunk_cases())
def test_a_retpoline_thunk_unwinds_to_its_caller(
    thunk: Thunk, offset: int, stack: list[int], expected: list[int]
) -> None:
    """GDB's frames at a pause at each (the 6.1 mov case seen by the Linux oracle:
    ksoftirqd in tk_clock_read, GDB went on to ret_from_fork where qmpprof stopped)."""
    memory = _memory({STACK + 0x10 + 8 * n: value for n, value in enumerate(stack)})
    code = WindowMemory(
        [
            MemoryWindow(thunk.address - 8, thunk.code),
            MemoryWindow(thunk.caller_return - 8, thunk.call),
        ]
    )
    regs = _registers(rip=thunk.address + offset, rsp=STACK + 0x10, rbp=STACK + 0x300)
    cfi = _ThunkCfi(thunk)
    frames = unwind(regs, memory, cfi, code=code, max_depth=len(expected) + 1).frames
    assert [f.address for f in frames[: len(expected)]] == expected
    if len(expected) == 1:
        assert len(frames) == 1
