"""FetchingMemory: a sample's windows that grow while it is examined on a paused guest.

The guest here is plain bytes with holes (pages that cannot be read), read through
capture.window_fetch as the capturer reads a paused guest's RAM. The invariant that
matters: whatever the examination read live, the windows it leaves behind give the
same answer to every read when examined alone later (a capture file, `report`).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.defaults import PAGE_SIZE
from qmpprof.errors import MemoryFault
from qmpprof.memory import FetchingMemory, WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.record.capture import window_fetch
from tests.unit.properties import examples

BASE = 0x7FFF_0000_0000
PAGES = 8


class HoledGuest:
    """PAGES pages from BASE, each byte its offset's low bits; `holes` are unreadable.
    Counts the reads made of it."""

    def __init__(self, holes: set[int]) -> None:
        self.holes = holes
        self.reads = 0

    def byte_at(self, address: int) -> int:
        return (address - BASE) * 7 % 251

    def readable(self, address: int) -> bool:
        page = (address - BASE) // PAGE_SIZE
        return 0 <= page < PAGES and page not in self.holes

    def read_prefix(self, address: int, size: int) -> bytes:
        self.reads += 1
        out = bytearray()
        while len(out) < size and self.readable(address + len(out)):
            out.append(self.byte_at(address + len(out)))
        return bytes(out)

    def truth(self, address: int, size: int) -> bytes | None:
        if not all(self.readable(a) for a in range(address, address + size)):
            return None
        return bytes(self.byte_at(a) for a in range(address, address + size))


def outcome(memory: FetchingMemory | WindowMemory, address: int, size: int) -> bytes | None:
    try:
        return memory.read(address, size)
    except MemoryFault:
        return None


def fetching(guest: HoledGuest, limit: int = 16, first: int = 3) -> FetchingMemory:
    """Starting with one window: page `first` whole (as a stack window would be)."""
    start = BASE + first * PAGE_SIZE
    stack = MemoryWindow(start, guest.read_prefix(start, PAGE_SIZE))
    return FetchingMemory([stack], window_fetch(guest.read_prefix), limit)


def test_a_read_outside_the_windows_fetches_one_there_and_keeps_it() -> None:
    guest = HoledGuest(holes=set())
    memory = fetching(guest)
    address = BASE + 6 * PAGE_SIZE + 40
    assert memory.read(address, 16) == guest.truth(address, 16)
    assert memory.read_u64(address + 8) == int.from_bytes(
        guest.truth(address + 8, 8) or b"", "little"
    )
    assert len(memory.windows) == 2
    window = memory.windows[1]
    assert window.base == address - 128 and window.end == BASE + 7 * PAGE_SIZE


def test_an_unreadable_address_is_asked_for_once() -> None:
    guest = HoledGuest(holes={5})
    memory = fetching(guest)
    address = BASE + 5 * PAGE_SIZE + 64
    for _ in range(3):
        with pytest.raises(MemoryFault):
            memory.read_u64(address)
    assert guest.reads == 1 + 2  # the first window; then below the address, and at it
    assert len(memory.windows) == 1


def test_no_fetch_beyond_the_limit() -> None:
    guest = HoledGuest(holes=set())
    memory = fetching(guest, limit=2)
    for page in (0, 1):
        memory.read_u64(BASE + page * PAGE_SIZE + 512)
    reads = guest.reads
    with pytest.raises(MemoryFault):
        memory.read_u64(BASE + 6 * PAGE_SIZE + 512)
    assert guest.reads == reads


@pytest.mark.parametrize("examples", examples(1000))
def test_the_windows_left_answer_every_read_as_the_live_examination_did(examples: int) -> None:
    span = PAGES * PAGE_SIZE
    reads = st.lists(
        st.tuples(st.integers(-PAGE_SIZE, span + PAGE_SIZE), st.integers(0, 2 * PAGE_SIZE)),
        max_size=30,
    )

    @settings(max_examples=examples, deadline=None)
    @given(
        holes=st.sets(st.integers(0, PAGES - 1), max_size=4), reads=reads, limit=st.integers(0, 6)
    )
    def check(holes: set[int], reads: list[tuple[int, int]], limit: int) -> None:
        guest = HoledGuest(holes)
        live = fetching(guest, limit, first=min(set(range(PAGES)) - holes, default=0))
        answers = [outcome(live, BASE + offset, size) for offset, size in reads]
        for answer, (offset, size) in zip(answers, reads, strict=True):
            assert answer is None or answer == guest.truth(BASE + offset, size)
        assert len(live.windows) <= 1 + limit
        replay = WindowMemory(live.windows)
        assert [outcome(replay, BASE + offset, size) for offset, size in reads] == answers

    check()
