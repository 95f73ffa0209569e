"""Frame-pointer walks over synthetic stacks: the happy path and hostile bytes."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.memory import WindowMemory
from qmpprof.model import FrameKind, MemoryWindow, Recovery, StopReason, UnwoundStack
from qmpprof.unwind.rules import RBP, REGISTER_COUNT, RIP, RSP
from qmpprof.unwind.unwinder import Strategy, unwind
from tests.unit.properties import examples

BASE = 0xFFFFFFFF80200000


def stack_of(words: list[int]) -> WindowMemory:
    return WindowMemory([MemoryWindow(BASE, struct.pack(f"<{len(words)}Q", *words))])


def fp_unwind(memory: WindowMemory, rip: int, rsp: int, rbp: int, depth: int = 128) -> UnwoundStack:
    regs: list[int | None] = [0] * REGISTER_COUNT
    regs[RIP], regs[RSP], regs[RBP] = rip, rsp, rbp
    return unwind(regs, memory, None, Strategy.FP, max_depth=depth)


def test_walks_a_chain_to_a_zero_frame_pointer() -> None:
    # frame 0 at BASE+0x10: saved rbp -> BASE+0x30, return 0x1111
    # frame 1 at BASE+0x30: saved rbp -> 0 (outermost), return 0x2222
    words = [0, 0, BASE + 0x30, 0x1111, 0, 0, 0, 0x2222]
    stack = fp_unwind(stack_of(words), rip=0x9999, rsp=BASE, rbp=BASE + 0x10)
    assert [f.address for f in stack.frames] == [0x9999, 0x1111, 0x2222]
    assert stack.frames[0].kind is FrameKind.INSTRUCTION
    assert stack.frames[1].kind is FrameKind.RETURN
    assert stack.frames[1].how is Recovery.FRAME_POINTER
    assert stack.stop is StopReason.END_OF_STACK


def test_frame_pointer_outside_the_window_is_a_fault_with_its_address() -> None:
    stack = fp_unwind(stack_of([0, 0]), rip=1, rsp=BASE, rbp=BASE + 0x1000)
    assert stack.stop is StopReason.FAULT
    assert stack.fault_address == BASE + 0x1008


def test_a_frame_pointer_that_points_down_did_not_advance() -> None:
    words = [0, 0, BASE - 0x100, 0x1111]
    stack = fp_unwind(stack_of(words), rip=1, rsp=BASE, rbp=BASE + 0x10)
    assert stack.stop is StopReason.NO_PROGRESS
    assert len(stack.frames) == 2


def test_cycle_is_cut() -> None:
    words = [BASE, 0x1111]
    stack = fp_unwind(stack_of(words), rip=1, rsp=BASE, rbp=BASE)
    assert stack.stop is StopReason.NO_PROGRESS


def test_misaligned_frame_pointer_stops() -> None:
    stack = fp_unwind(stack_of([0] * 4), rip=1, rsp=BASE, rbp=BASE + 3)
    assert stack.stop is StopReason.BAD_FRAME


def test_depth_is_bounded() -> None:
    words: list[int] = []
    for index in range(64):
        words += [BASE + 16 * (index + 1), 0x1000 + index]
    stack = fp_unwind(stack_of(words), rip=1, rsp=BASE - 8, rbp=BASE, depth=10)
    assert stack.stop is StopReason.MAX_DEPTH
    assert len(stack.frames) == 10


@pytest.mark.parametrize("examples", examples(400))
def test_any_bytes_end_with_a_reason_within_the_bound(examples: int) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(
        data=st.binary(max_size=512),
        rbp_offset=st.integers(min_value=-64, max_value=600),
        depth=st.integers(min_value=1, max_value=200),
    )
    def check(data: bytes, rbp_offset: int, depth: int) -> None:
        memory = WindowMemory([MemoryWindow(BASE, data)])
        stack = fp_unwind(memory, rip=7, rsp=BASE, rbp=BASE + rbp_offset, depth=depth)
        assert 1 <= len(stack.frames) <= depth
        assert isinstance(stack.stop, StopReason)

    check()


# -- i386 (4-byte words) -------------------------------------------------------------

BASE32 = 0xBFFF_F000
CODE32 = 0x0804_9000


def stack32_of(words: list[int]) -> WindowMemory:
    return WindowMemory([MemoryWindow(BASE32, struct.pack(f"<{len(words)}I", *words))])


def fp_unwind32(
    memory: WindowMemory,
    rip: int,
    rsp: int,
    rbp: int,
    code: WindowMemory | None = None,
    depth: int = 128,
    word: int = 4,
) -> UnwoundStack:
    regs: list[int | None] = [0] * REGISTER_COUNT
    regs[RIP], regs[RSP], regs[RBP] = rip, rsp, rbp
    return unwind(regs, memory, None, Strategy.FP, code, max_depth=depth, word=word)


def test_an_i386_chain_has_4_byte_slots() -> None:
    # frame 0 at BASE32+8: saved ebp -> BASE32+0x18, return 0x8049111
    # frame 1 at BASE32+0x18: saved ebp -> 0 (outermost), return 0x8049222
    words = [0, 0, BASE32 + 0x18, 0x804_9111, 0, 0, 0x0, 0x804_9222]
    stack = fp_unwind32(stack32_of(words), rip=0x804_9999, rsp=BASE32, rbp=BASE32 + 8)
    assert [f.address for f in stack.frames] == [0x804_9999, 0x804_9111, 0x804_9222]
    assert stack.stop is StopReason.END_OF_STACK
    # The same bytes read as 8-byte slots are another (wrong) chain.
    wide = fp_unwind32(stack32_of(words), rip=0x804_9999, rsp=BASE32, rbp=BASE32 + 8, word=8)
    assert [f.address for f in wide.frames] != [f.address for f in stack.frames]


def test_i386_frame_pointers_need_4_byte_alignment_only() -> None:
    words = [0, BASE32 + 0x10, 0x804_9111, 0, 0, 0]
    stack = fp_unwind32(stack32_of(words), rip=0x804_9999, rsp=BASE32, rbp=BASE32 + 4)
    assert [f.address for f in stack.frames] == [0x804_9999, 0x804_9111]
    misaligned = fp_unwind32(stack32_of(words), rip=1, rsp=BASE32, rbp=BASE32 + 2)
    assert misaligned.stop is StopReason.BAD_FRAME


def test_an_i386_frame_pointer_outside_the_window_faults_at_its_slot() -> None:
    stack = fp_unwind32(stack32_of([0, 0]), rip=1, rsp=BASE32, rbp=BASE32 + 0x100)
    assert stack.stop is StopReason.FAULT
    assert stack.fault_address == BASE32 + 0x104


def test_i386_addresses_wrap_at_4_gib() -> None:
    """ebp + 4 past 2**32 is address 0 (and beyond the window: a fault there)."""
    memory = WindowMemory([MemoryWindow(0xFFFF_FFF8, struct.pack("<2I", 0, 0))])
    stack = fp_unwind32(memory, rip=0x804_9000, rsp=0xFFFF_FFF8, rbp=0xFFFF_FFFC)
    assert stack.stop is StopReason.FAULT
    assert stack.fault_address == 0


@pytest.mark.parametrize(
    ("instruction", "slot"),
    [
        (b"\x55", 0),  # push %ebp: at entry
        (b"\xf3\x0f\x1e\xfb", 0),  # endbr32
        (b"\xc3", 0),  # ret
        (b"\x89\xe5", 4),  # mov %esp,%ebp (GCC's encoding) after the push
        (b"\x8b\xec", 4),  # mov %esp,%ebp (the other encoding) after the push
    ],
    ids=["push", "endbr32", "ret", "mov-89", "mov-8b"],
)
def test_an_unframed_i386_leaf_is_recognised_by_its_code(instruction: bytes, slot: int) -> None:
    """ebp still holds the caller's frame; the return address is at esp (+4 after the
    push, whose slot holds the caller's ebp)."""
    leaf_pc = CODE32 + 1
    code = WindowMemory([MemoryWindow(CODE32, b"\x55" + instruction + b"\x90" * 8)])
    caller_frame = BASE32 + 0x20
    words = [0] * 16
    words[slot // 4] = 0x804_9111  # the leaf's return address
    if slot:
        words[0] = caller_frame  # the caller's ebp, pushed
    words[8], words[9] = 0, 0x804_9222  # the caller's frame: outermost, returns here
    regs_rbp = caller_frame
    stack = fp_unwind32(stack32_of(words), rip=leaf_pc, rsp=BASE32, rbp=regs_rbp, code=code)
    assert [f.address for f in stack.frames] == [leaf_pc, 0x804_9111, 0x804_9222]
    assert stack.stop is StopReason.END_OF_STACK


def test_x86_64_encodings_are_not_i386_leaves() -> None:
    """`endbr64` and the REX-prefixed mov are x86-64's: in i386 code the frame pointer
    is followed (here it frames nothing above the stack pointer: no progress)."""
    for instruction in (b"\xf3\x0f\x1e\xfa", b"\x48\x89\xe5"):
        code = WindowMemory([MemoryWindow(CODE32, b"\x55" + instruction)])
        stack = fp_unwind32(stack32_of([0] * 8), CODE32 + 1, BASE32 + 8, BASE32, code)
        assert stack.stop is StopReason.NO_PROGRESS


@pytest.mark.parametrize("examples", examples(400))
def test_any_bytes_end_an_i386_unwind_with_a_reason_within_the_bound(examples: int) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(
        data=st.binary(max_size=512),
        code=st.binary(max_size=16),
        rbp_offset=st.integers(min_value=-64, max_value=600),
        depth=st.integers(min_value=1, max_value=200),
    )
    def check(data: bytes, code: bytes, rbp_offset: int, depth: int) -> None:
        memory = WindowMemory([MemoryWindow(BASE32, data)])
        text = WindowMemory([MemoryWindow(CODE32, code)])
        stack = fp_unwind32(memory, CODE32 + 1, BASE32, BASE32 + rbp_offset, text, depth)
        assert 1 <= len(stack.frames) <= depth
        assert all(0 <= f.address < 1 << 32 for f in stack.frames)
        assert isinstance(stack.stop, StopReason)

    check()
