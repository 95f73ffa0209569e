"""AArch64's call sites and signed return addresses, on real code and real values."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from elftools.elf.elffile import ELFFile

from qmpprof.isa.aarch64 import follows_call, strip_return
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from tests.unit.conftest import build_elf

#: objdump's A64 calls (Arm ARM C6): BL, BLR, and the authenticated BLRAA/BLRAB(Z).
CALLS = {"bl", "blr", "blraa", "blrab", "blraaz", "blrabz"}
_INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):\s+[0-9a-f]{8}\s+(\S+)", re.MULTILINE)


def test_a_return_address_follows_a_call_exactly_where_objdump_lists_one(
    tmp_path: Path,
) -> None:
    """Every instruction of a static AArch64 program with Debian's arm64 libc (signed
    return addresses): the address after it follows a call for qmpprof where objdump
    calls the instruction one of A64's calls, and nowhere else."""
    flags = ("-O2", "-static", "-mbranch-protection=standard")
    elf = build_elf("cfi_chain.c", tmp_path, *flags, cc="aarch64-linux-gnu-gcc")
    with elf.open("rb") as stream:
        text = ELFFile(stream).get_section_by_name(".text")
        assert text is not None
        code = WindowMemory([MemoryWindow(text["sh_addr"], text.data())])
    listing = subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", "-j", ".text", str(elf)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    instructions = [(int(at, 16), name) for at, name in _INSTRUCTION.findall(listing)]
    assert len(instructions) > 10_000
    calls = 0
    for address, name in instructions:
        calls += name in CALLS
        assert follows_call(code, address + 4) is (name in CALLS), (hex(address), name)
    assert calls > 1000
    assert follows_call(code, instructions[0][0] + 2) is False  # not an instruction's end


def test_signed_return_addresses_seen_on_the_example_guest_are_stripped() -> None:
    """Return addresses gdb-multiarch printed on the AArch64 example guest's user stacks
    (crunch, APIA key 0x0123456789abcdef/0xfedcba9876543210), and where they return to
    (the instruction after crunch_main's calls, objdump of that build)."""
    assert strip_return(0x391B_0000_0040_00E0) == 0x4000E0
    assert strip_return(0x6553_0000_0040_03E0) == 0x4003E0
    assert strip_return(0x642F_0000_0040_03C8) == 0x4003C8
    # an unsigned address, of either half, is left as it is
    assert strip_return(0x4003C8) == 0x4003C8
    assert strip_return(0xFFFF_0000_4020_0F8C) == 0xFFFF_0000_4020_0F8C
