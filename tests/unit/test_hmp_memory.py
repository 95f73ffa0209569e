"""HMP `x` listings as QEMU 7.2 prints them, turned into bytes."""

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from qmpprof.target.xdump import parse_hmp_words

DATA = Path(__file__).parent / "data"


def test_listing_that_runs_into_unmapped_memory_keeps_the_readable_prefix() -> None:
    text = (DATA / "hmp_x_runs_into_fault.txt").read_text()
    data = parse_hmp_words(text, 0xFFFFFFE0)
    assert len(data) == 32
    assert data[16:24] == (0x2F3630F000E05BEA).to_bytes(8, "little")


def test_listing_for_another_address_gives_nothing() -> None:
    text = (DATA / "hmp_x_runs_into_fault.txt").read_text()
    assert parse_hmp_words(text, 0x1000) == b""


@given(st.text(max_size=300), st.integers(min_value=0, max_value=2**64 - 1))
def test_any_text_parses_without_raising(text: str, address: int) -> None:
    assert len(parse_hmp_words(text, address)) % 8 == 0
