"""Hostile BTF: pahole's BTF of tests/unit/data/btf_layouts.c with bytes changed, cut
short or grown. Reading it is BadBtf or layouts, never another exception or an endless
loop; each struct's members are bounded (MAX_MEMBERS) and lie at offsets a 32-bit bit
offset can give."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadBtf
from qmpprof.guest.btf import MAX_MEMBERS, Btf
from tests.fuzz.budget import cases, counted
from tests.unit.conftest import build_elf
from tests.unit.test_btf import btf_bytes, with_btf

NAMES = {"task", "hot", "list", "state", "pid_type"}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    program = build_elf("btf_layouts.c", tmp_path_factory.mktemp("btf-fuzz"), "-g", "-O0")
    data = btf_bytes(with_btf(program))
    assert Btf(data).structs(NAMES, None).keys() == {"task", "hot", "list"}
    return data


@settings(max_examples=cases(300))
@given(
    edits=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=6
    ),
    cut=st.one_of(st.none(), st.floats(0, 1)),
    words=st.lists(st.integers(0, (1 << 32) - 1), max_size=4),
)
@counted
def test_damaged_btf_is_bad_btf_or_bounded_layouts(
    pristine: bytes, edits: list[tuple[float, int]], cut: float | None, words: list[int]
) -> None:
    data = bytearray(pristine)
    for where, value in edits:
        data[int(where * len(data))] = value
    for word in words:  # a whole word: a kind, a vlen, an id or an offset at once
        at = word % max(len(data) - 4, 1) // 4 * 4
        data[at : at + 4] = word.to_bytes(4, "little")
    if cut is not None:
        data = data[: int(cut * len(data))]
    try:
        layouts = Btf(bytes(data)).structs(NAMES, None)
    except BadBtf:
        return
    for members in layouts.values():
        assert 0 < len(members) <= MAX_MEMBERS
        for offset, size in members.values():
            assert 0 <= offset < 1 << 32  # four levels of 29-bit byte offsets at most
            assert size is None or size >= 0
