"""QEMU's AArch64 register dump (qemu-system-aarch64 7.2, -cpu max, FP and SVE on) parsed:
the values the program that was running set (data/aarch64/el0.S), its exception level."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.errors import RegisterParseError
from qmpprof.guest.mode import mode_of
from qmpprof.model import Mode
from qmpprof.target.registers import ParsedRegisters, parse_all

DUMP = (Path(__file__).parent / "data" / "regs_aarch64_el0_sve_smp2.txt").read_text()


def test_both_vcpus_are_read_with_what_the_program_set() -> None:
    el0, reset = parse_all(DUMP)
    assert (el0.vcpu, el0.isa, reset.isa) == (0, "aarch64", "aarch64")
    # el0.S: `mov x29, #0x1234`, `mov x30, #0x5678`, SP_EL0 = 0x40100000, then EL0 at
    # `user` (0x40080034 in the linked file) looping over `add x3`/`b`.
    assert el0.general["x29"] == 0x1234 and el0.general["x30"] == 0x5678
    assert el0.sp == 0x40100000 and el0.general["x1"] == 0x40100000
    assert el0.general["x2"] == 0x40080034 and el0.pc in (0x40080038, 0x4008003C)
    assert (el0.cpl, mode_of(el0)) == (0, Mode.USER)
    # vCPU 1 is held powered off at the entry QEMU gives every vCPU (-Ttext=0x40080000)
    assert (reset.cpl, mode_of(reset), reset.pc, reset.sp) == (1, Mode.KERNEL, 0x40080000, 0)


def test_any_order_of_the_same_values_is_read_alike() -> None:
    """A dump laid out otherwise (another QEMU) is read name by name."""
    block = DUMP.split("CPU#1")[0]
    head, tail = block.split("CPU#0")[1].split("PSTATE=")
    lines = head.strip().splitlines()
    shuffled = "CPU#0\n" + "\n".join(reversed(lines)) + "\nPSTATE=" + tail
    assert parse_all(shuffled) == parse_all(block)


def test_the_vector_state_is_not_needed() -> None:
    cut = DUMP.split("CPU#1")[0].split("P00=")[0]
    assert parse_all(cut)[0] == parse_all(DUMP)[0]


def test_a_block_without_its_pc_is_refused_in_one_line() -> None:
    with pytest.raises(RegisterParseError, match="vCPU 0: no PC"):
        parse_all(DUMP.split("CPU#1")[0].replace(" PC=", " QC="))


def test_aarch32_state_is_refused() -> None:
    text = DUMP.split("CPU#1")[0].replace("PSTATE=00000000", "PSTATE=00000010")
    with pytest.raises(RegisterParseError, match="AArch32"):
        parse_all(text)


def test_successive_dumps_parse_alike() -> None:
    parsed = ParsedRegisters()
    assert parsed.parse(DUMP) == parsed.parse(DUMP) == parse_all(DUMP)
