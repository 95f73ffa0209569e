"""`info registers -a` text saved from a real QEMU 7.2, parsed in every CPU mode."""

from pathlib import Path

import pytest

from qmpprof.errors import RegisterParseError
from qmpprof.target.registers import parse_all

DATA = Path(__file__).parent / "data"


def test_real_mode_cpus_at_reset_parse_eip() -> None:
    cpus = parse_all((DATA / "regs_reset_realmode_smp2.txt").read_text())
    assert [c.vcpu for c in cpus] == [0, 1]
    assert cpus[0].rip == 0xFFF0
    assert cpus[0].cs == 0xF000
    assert cpus[0].bits == 16
    assert not cpus[0].halted


def test_protected_mode_bios_is_32_bit_with_the_ap_halted() -> None:
    cpus = parse_all((DATA / "regs_seabios_32bit_smp2.txt").read_text())
    assert len(cpus) == 2
    first, second = cpus
    assert first.bits == second.bits == 32
    assert not first.halted and second.halted
    assert first.cpl == 0
    assert first.rip == 0x2B36
    assert first.rsp == 0x000A1F08 and first.rbp == 0x022E4CB0
    assert first.general["rax"] == 0xFAC83000 and first.general["rcx"] == 0x0001F408
    assert first.cr0 == 0x11
    assert second.rip == 0xFD09A


def test_long_mode_guest_is_64_bit_kernel() -> None:
    cpus = parse_all((DATA / "regs_guest_longmode.txt").read_text())
    first = cpus[0]
    assert first.bits == 64
    assert first.cpl == 0
    assert first.rip >= 0xFFFFFFFF80000000
    assert first.general["r15"] is not None
    assert first.efer & 0x500 == 0x500  # LME and LMA
    assert first.cr3 != 0


def test_garbage_raises_parse_error() -> None:
    with pytest.raises(RegisterParseError):
        parse_all("unknown command: 'info'\n")


def test_block_without_rip_raises_parse_error() -> None:
    with pytest.raises(RegisterParseError, match="rip"):
        parse_all("CPU#0\nRAX=0000000000000000\nCS =0008 0 ffffffff 00a09b00\n")
