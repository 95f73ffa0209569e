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
