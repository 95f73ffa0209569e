"""Hostile register text: whatever QEMU (or something posing as it) answers to
`info registers -a`, the parser returns register sets or raises RegisterParseError."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import RegisterParseError
from qmpprof.model import RegisterSet
from qmpprof.target.registers import parse_all
from tests.fuzz.budget import cases, counted

DATA = Path(__file__).parents[1] / "unit" / "data"
DUMPS = [
    (DATA / f"{name}.txt").read_bytes().decode()
    for name in (
        "regs_reset_realmode_smp2",
        "regs_seabios_32bit_smp2",
        "regs_guest_longmode",
        "regs_guest_longmode_smp2_qmp",
        "regs_aarch64_el0_sve_smp2",
    )
]
#: Characters of real dumps, so that random text often looks almost right.
LOOKALIKE = "CPU#RAXBXSIDEFLGHTPZ0123456789abcdef=[]:- \n\r"


def parse_or_refuse(text: str) -> list[RegisterSet]:
    try:
        cpus = parse_all(text)
    except RegisterParseError as error:
        assert "\n" not in str(error)
        return []
    for cpu in cpus:
        assert cpu.bits in (16, 32, 64)
        assert 0 <= cpu.pc < 1 << 64 and 0 <= cpu.sp < 1 << 64
        assert cpu.cpl in range(16)
    return cpus


@settings(max_examples=cases(300))
@given(
    dump=st.sampled_from(DUMPS),
    cut=st.tuples(st.floats(0, 1), st.integers(0, 400)),
    inserted=st.text(alphabet=LOOKALIKE, max_size=60),
)
@counted
def test_register_dump_spliced(dump: str, cut: tuple[float, int], inserted: str) -> None:
    start = int(cut[0] * len(dump))
    parse_or_refuse(dump[:start] + inserted + dump[start + cut[1] :])


@settings(max_examples=cases(300))
@given(text=st.text(alphabet=LOOKALIKE, max_size=3000) | st.text(max_size=500))
@counted
def test_register_text_random(text: str) -> None:
    parse_or_refuse(text)


@settings(max_examples=cases(100))
@given(
    header=st.sampled_from(["CPU#0\n", "CPU#1\r\n", ""]),
    unit=st.text(alphabet=LOOKALIKE, min_size=1, max_size=8),
    repeats=st.integers(1, 4000),
)
@counted
def test_register_text_repeated(header: str, unit: str, repeats: int) -> None:
    """Long runs of one short pattern: the shape that made the old scan quadratic."""
    parse_or_refuse(header + unit * repeats)
