"""The mend of ORC's rows where a return stack buffer fill runs (unwind/orc_mends.py), on
Debian's 6.1 and 6.12: their ORC entries in and around each function a fill is patched
into, and that function's code as a running guest has it
(tests/unit/data/orc/fills-*.json, made by extract_fills.py).

The rows expected are laid out by hand from the kernel's source and the guest's code:
__switch_to_asm has pushed six registers over its return address (struct
inactive_task_frame, 56 bytes: the caller's stack pointer is RSP + 56) when its fill
runs, each slot (`call 1f; int3; 1:`) pushes 8 bytes more and the `add $16, %rsp` after
two drops them. As the guests run it (both kernels):

    mov  $0x10, %r12          ; 56
    1: call 2f; int3; 2:      ; 56  (the first slot)
    call 3f; int3; 3:         ; 64  (the second)
    add  $0x10, %rsp          ; 72
    dec  %r12                 ; 56
    jnz  1b                   ; 56
    lfence                    ; 56
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.symbols.elf import Symbol, SymbolTable
from qmpprof.unwind import rules as r
from qmpprof.unwind.orc import Layout, OrcTable
from qmpprof.unwind.orc_mends import mend_return_buffer_fills

DATA = Path(__file__).parent / "data" / "orc"
KERNELS = ("debian-6.1.0-50", "debian-6.12.95")
SLOT = bytes.fromhex("e801000000cc")
#: Offsets from the first slot of each instruction of the loop (as in the docstring),
#: with the bytes the caller's stack pointer lies above RSP there.
SWITCH_FILL = {0: 56, 6: 64, 12: 72, 16: 56, 19: 56, 21: 56}


def fills(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"fills-{name}.json").read_text())
    return data


def table(data: dict[str, Any]) -> OrcTable:
    ips = [ip for ip, _ in data["entries"]]
    base = min(ips) - 0x1000
    offsets = b"".join(
        (ip - base - 4 * i).to_bytes(4, "little", signed=True) for i, ip in enumerate(ips)
    )
    entries = b"".join(bytes.fromhex(entry) for _, entry in data["entries"])
    layout = Layout.FROM_6_4 if data["orc_header"] else Layout.BEFORE_6_4
    return OrcTable(offsets, base, entries, layout, max(ips) + 1)


def symbols(data: dict[str, Any]) -> SymbolTable:
    found = [Symbol(name, f["address"], f["size"]) for name, f in data["functions"].items()]
    return SymbolTable("vmlinux", found)


def running_code(data: dict[str, Any]) -> WindowMemory:
    return WindowMemory(
        [MemoryWindow(f["address"], bytes.fromhex(f["code"])) for f in data["functions"].values()]
    )


def first_slot(data: dict[str, Any]) -> int:
    switch = data["functions"]["__switch_to_asm"]
    at = bytes.fromhex(switch["code"]).find(SLOT)
    assert at >= 0, "the guest ran no fill in __switch_to_asm"
    return int(switch["address"]) + at


def caller_stack_above(orc: OrcTable, address: int) -> int | None:
    row = orc.row_for(address)
    assert row is not None and row.cfa.register == r.RSP, row
    assert dict(row.rules)[r.RIP] == r.SavedAt(-8), row  # the return address below it
    return row.cfa.offset


@pytest.mark.parametrize("name", KERNELS)
def test_each_instruction_of_the_fill_is_described_by_what_it_has_pushed(name: str) -> None:
    data = fills(name)
    orc, first = table(data), first_slot(data)
    mend_return_buffer_fills(orc, symbols(data), running_code(data))
    found = {offset: caller_stack_above(orc, first + offset) for offset in SWITCH_FILL}
    assert found == SWITCH_FILL


def test_6_1_s_table_describes_another_alternative_where_the_fill_runs() -> None:
    """Before the mend: 6.1's objtool put the single-slot alternative's rows where the
    loop runs (a slot of it pushed at the first slot, none at the second or the `add`);
    6.12's are right, and the mend leaves them as they are."""
    data = fills("debian-6.1.0-50")
    orc, first = table(data), first_slot(data)
    assert [caller_stack_above(orc, first + offset) for offset in (0, 6, 12)] == [64, 56, 56]
    data = fills("debian-6.12.95")
    orc, first = table(data), first_slot(data)
    found = {offset: caller_stack_above(orc, first + offset) for offset in SWITCH_FILL}
    assert found == SWITCH_FILL


@pytest.mark.parametrize("name", KERNELS)
def test_code_without_a_fill_keeps_the_table_s_rows(name: str) -> None:
    """entry_ibpb's fill is patched in only on CPUs whose IBPB leaves return predictions
    (X86_BUG_IBPB_NO_RET): the guest's runs the `jmp` past it."""
    data = fills(name)
    ibpb = data["functions"]["entry_ibpb"]
    assert SLOT not in bytes.fromhex(ibpb["code"])
    span = range(ibpb["address"], ibpb["address"] + ibpb["size"])
    orc, before = table(data), table(data)
    mend_return_buffer_fills(orc, symbols(data), running_code(data))
    assert [orc.row_for(a) for a in span] == [before.row_for(a) for a in span]


@pytest.mark.parametrize("name", KERNELS)
def test_a_fill_that_does_not_loop_back_or_leave_the_stack_as_it_found_it_is_not_mended(
    name: str,
) -> None:
    data = fills(name)
    switch = data["functions"]["__switch_to_asm"]
    code = bytes.fromhex(switch["code"])
    at = code.find(SLOT)
    for broken in (
        code[: at + 12] + bytes.fromhex("4883c408") + code[at + 16 :],  # drops one slot of two
        code[: at + 19] + bytes.fromhex("75ec") + code[at + 21 :],  # jumps elsewhere
    ):
        switch["code"] = broken.hex()
        orc, before = table(data), table(data)
        mend_return_buffer_fills(orc, symbols(data), running_code(data))
        span = range(switch["address"], switch["address"] + switch["size"])
        assert [orc.row_for(a) for a in span] == [before.row_for(a) for a in span]
