"""The kernel's code that the ORC mends read (unwind/orc_mends.py) is guest memory: a
function's code of random bytes, or the real fill with bytes replaced, never raises,
and rows are mended only inside the function and only as a fill that leaves the stack
as it found it can push (at most 8 bytes a slot of it)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.unwind.orc_mends import FILL_INSTRUCTIONS, mend_return_buffer_fills
from qmpprof.unwind.rules import RSP
from tests.fuzz.budget import cases, counted
from tests.unit.test_orc_mends import KERNELS, fills, running_code, symbols, table


@settings(max_examples=cases(300), deadline=None)
@given(
    st.sampled_from(KERNELS),
    st.one_of(
        st.binary(max_size=300),
        st.lists(st.tuples(st.integers(0, 255), st.binary(min_size=1, max_size=4)), max_size=6),
    ),
)
@counted
def test_random_code_where_a_fill_may_run(
    name: str, change: bytes | list[tuple[int, bytes]]
) -> None:
    data = fills(name)
    switch = data["functions"]["__switch_to_asm"]
    code = bytearray(bytes.fromhex(switch["code"]))
    if isinstance(change, bytes):
        code = bytearray(change)
    else:
        for at, replacement in change:
            code[at : at + len(replacement)] = replacement
    switch["code"] = bytes(code).hex()
    orc, before = table(data), table(data)
    mend_return_buffer_fills(orc, symbols(data), running_code(data))
    start, size = switch["address"], switch["size"]
    rows = [before.row_for(a) for a in range(start, start + size)]
    highest = max(row.cfa.offset for row in rows if row is not None)
    for address in range(start - 64, start + size + 64):
        row = orc.row_for(address)
        if row == before.row_for(address):
            continue
        assert start <= address < start + size
        assert row is not None and row.cfa.register == RSP, row
        assert 0 < row.cfa.offset <= highest + 8 * FILL_INSTRUCTIONS, row
