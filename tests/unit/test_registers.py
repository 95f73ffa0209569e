"""`info registers -a` text saved from a real QEMU 7.2, parsed in every CPU mode."""

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import RegisterParseError
from qmpprof.target import registers
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


#: The first three were saved with plain newlines; the last is a reply's text exactly
#: as QMP delivers it, with CR LF line ends.
SAVED_DUMPS = (
    "regs_reset_realmode_smp2",
    "regs_seabios_32bit_smp2",
    "regs_guest_longmode",
    "regs_guest_longmode_smp2_qmp",
)


def saved_dump(name: str) -> str:
    """A saved dump with its line ends as they are (read_text would turn CR LF into LF)."""
    return (DATA / f"{name}.txt").read_bytes().decode()


@pytest.mark.parametrize("name", SAVED_DUMPS)
def test_qemu_7s_layout_is_matched_where_it_is_expected(name: str) -> None:
    """Each vCPU block of QEMU 7.2's dumps takes the fast path, not the fallback scan."""
    text = saved_dump(name)
    blocks = re.split(r"CPU#\d+\r?\n", text)[1:]
    assert blocks
    assert all(registers._laid_out(block) is not None for block in blocks)


@pytest.mark.parametrize("name", SAVED_DUMPS)
def test_an_unfamiliar_layout_parses_like_qemu_7s(name: str) -> None:
    """A register QEMU might print first some day moves every other one: the parser
    falls back from matching QEMU 7's layout to collecting each NAME=value."""
    text = saved_dump(name)
    unfamiliar = re.sub(r"^([RE]AX=)", r"NEW=0 \1", text, flags=re.MULTILINE)
    assert unfamiliar != text
    assert parse_all(unfamiliar) == parse_all(text)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(SAVED_DUMPS),
    start=st.integers(min_value=0, max_value=3000),
    length=st.integers(min_value=0, max_value=200),
    inserted=st.text(alphabet="RAXCSEF0123456789abcdef= \n[]#", max_size=30),
)
def test_damaged_dumps_parse_or_raise_parse_error(
    name: str, start: int, length: int, inserted: str
) -> None:
    text = saved_dump(name)
    damaged = text[:start] + inserted + text[start + length :]
    try:
        cpus = parse_all(damaged)
    except RegisterParseError:
        return
    assert all(cpu.bits in (16, 32, 64) for cpu in cpus)
