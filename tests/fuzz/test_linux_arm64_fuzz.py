"""Hostile memory for the arm64 Linux reader (guest/linux/arm64.py, btf_search.py): a
guest's per-CPU areas, tasks, stacks and page-table pointers are random words, some of
them pointing back into the memory read, and its read-only data holds planted BTF
headers. Every lookup ends in a bounded number of reads with an answer of the right
shape, None, or MemoryFault; a found BTF starts as one and is no larger than MAX_BTF;
the BTF of Debian's arm64 kernel, damaged, gives BadBtf or bounded offsets."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadBtf, MemoryFault
from qmpprof.guest.adapter import NAME_LIMIT
from qmpprof.guest.btf import Btf
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.linux.adapter import TaskLayout
from qmpprof.guest.linux.arm64 import (
    MAX_SEARCH_PAGES,
    PER_CPU_SECTION,
    PER_CPU_VARIABLES,
    THREAD_SIZE,
    Arm64Layout,
    Arm64LinuxAdapter,
    LinearMap,
)
from qmpprof.guest.linux.btf_search import HEADER_START, MAX_BTF, find_btf
from qmpprof.memory import WindowMemory
from qmpprof.model import KERNEL_HALF, MemoryWindow, RegisterSet
from qmpprof.unwind.numbering import PC, REGISTER_COUNT
from tests.fuzz.budget import cases, counted

KERNEL = 0xFFFF_0000_4000_0000
SIZE = 0x4000
LINEAR = LinearMap(0xFFFF_0000_0000_0000, 1 << 47, 0x4000_0000)
TASK = TaskLayout.from_members(
    {name: Member(at, 4) for name, at in (("pid", 8), ("tgid", 12), ("flags", 16))}
    | {"comm": Member(24, 16)}
)


class CountingMemory(WindowMemory):
    """Counts reads: a lookup's reads are bounded whatever the memory holds."""

    reads = 0

    def read(self, address: int, size: int) -> bytes:
        self.reads += 1
        return super().read(address, size)


def hostile_memory(rng: random.Random) -> CountingMemory:
    """A kernel-half page run of random words, a quarter of them pointers into it."""
    data = bytearray(rng.randbytes(SIZE))
    for at in range(0, SIZE, 8):
        if rng.random() < 0.25:
            data[at : at + 8] = (KERNEL + rng.randrange(SIZE) // 8 * 8).to_bytes(8, "little")
    return CountingMemory([MemoryWindow(KERNEL, bytes(data))])


@settings(max_examples=cases(300))
@given(
    seed=st.integers(0, 1 << 64),
    offsets=st.lists(st.integers(0, SIZE), min_size=7, max_size=7),
    search=st.tuples(st.integers(0, 1 << 64), st.integers(0, 1 << 40)),
    tpidr=st.integers(0, (1 << 64) - 1),
)
@counted
def test_arm64_lookups_over_random_memory_end_bounded(
    seed: int, offsets: list[int], search: tuple[int, int], tpidr: int
) -> None:
    rng = random.Random(seed)
    memory = hostile_memory(rng)
    assert TASK is not None
    start = rng.choice([KERNEL - tpidr, search[0]]) % (1 << 64)
    adapter = Arm64LinuxAdapter(Arm64Layout(*offsets), TASK, (start, start + search[1]), LINEAR)
    general = {"pc": KERNEL, "sp": KERNEL}
    registers = RegisterSet(0, general, 0, 1, False, 64, isa="aarch64", tpidr=tpidr)
    try:
        root = adapter.user_root(registers, memory)
        assert root is None or (root % 4096 == 0 and root >= LINEAR.phys_offset)
        stack = adapter.kernel_stack(registers, memory)
        assert stack is None or (stack[0] >= KERNEL_HALF and stack[1] == THREAD_SIZE)
        user = adapter.user_registers(registers, memory)
        assert user is None or (len(user) == REGISTER_COUNT and (user[PC] or 0) < KERNEL_HALF)
        process = adapter.process(registers, memory)
        assert process is None or len(process.name) <= NAME_LIMIT + 2
    except MemoryFault:
        pass
    assert memory.reads <= 3 * MAX_SEARCH_PAGES + 16


@settings(max_examples=cases(200))
@given(
    seed=st.integers(0, 1 << 64),
    planted=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, (1 << 32) - 1)), max_size=8),
)
@counted
def test_planted_btf_headers_are_found_whole_or_passed_over(
    seed: int, planted: list[tuple[int, int]]
) -> None:
    rng = random.Random(seed)
    data = bytearray(rng.randbytes(1 << 16))
    for at, length in planted:
        at = min(at, len(data) - 24) // 4 * 4
        header = HEADER_START + bytes(4) + length.to_bytes(4, "little") * 2
        data[at : at + 24] = header + (rng.randrange(1 << 12)).to_bytes(4, "little")
    image = bytes(data)

    def read(address: int, size: int) -> bytes:
        if address < 0 or address + size > len(image):
            raise MemoryFault(address, size)
        return image[address : address + size]

    found = find_btf(read, 0, len(image))
    assert found is None or (found.startswith(HEADER_START) and len(found) <= MAX_BTF)


ARM64_VMLINUX = (
    Path.home() / ".cache" / "qmpprof" / "linux-arm64" / "6.1.0-50-cloud-arm64" / "vmlinux"
)


@pytest.fixture(scope="module")
def kernel_btf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    if not ARM64_VMLINUX.exists():
        pytest.skip(f"no {ARM64_VMLINUX}: make linux-guest-aarch64 fetches it")
    out = tmp_path_factory.mktemp("arm64-btf") / "btf"
    command = ["aarch64-linux-gnu-objcopy", "-O", "binary", "--only-section=.BTF"]
    subprocess.run([*command, str(ARM64_VMLINUX), str(out)], check=True)
    return out.read_bytes()


@settings(max_examples=cases(20), deadline=None)
@given(
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=8),
    cut=st.one_of(st.none(), st.floats(0, 1)),
)
@counted
def test_debian_s_arm64_btf_damaged_gives_bad_btf_or_bounded_offsets(
    kernel_btf: bytes, edits: list[tuple[float, int]], cut: float | None
) -> None:
    data = bytearray(kernel_btf)
    for where, value in edits:
        data[int(where * len(data))] = value
    if cut is not None:
        data = data[: int(cut * len(data))]
    try:
        offsets = Btf(bytes(data)).section_variables(PER_CPU_SECTION, set(PER_CPU_VARIABLES))
    except BadBtf:
        return
    assert set(offsets) <= PER_CPU_VARIABLES
    assert all(0 <= offset < 1 << 32 for offset in offsets.values())
