"""Capture one tick: the registers of every vCPU and a window of each one's stack."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from qmpprof.model import MemoryWindow, RawSample, RegisterSet
from qmpprof.target.memory import MemoryBackend
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all

DEFAULT_STACK_BYTES = 16 * 1024
#: Also read this much below RSP: CFI may restore a register from a slot the leaf
#: has already popped (GCC keeps the save rule until the `ret`), and GDB reads it.
BELOW_RSP = 128


@dataclass(frozen=True)
class CaptureConfig:
    """What to capture each tick."""

    stack_bytes: int = DEFAULT_STACK_BYTES
    #: vCPU indexes to sample; empty means all.
    cpus: Collection[int] = ()


async def capture_vcpus(
    session: QmpSession, memory: MemoryBackend, config: CaptureConfig
) -> list[RawSample]:
    """Registers and stack windows of the selected vCPUs, as they are right now.

    The caller decides whether the VM is paused meanwhile. Raises TargetGone,
    CommandFailed or RegisterParseError; a vCPU whose stack cannot be read yields a
    RawSample with `error` set instead.
    """
    now = time.time()
    registers = parse_all(await session.hmp("info registers -a"))
    return [
        await _capture_one(memory, regs, config.stack_bytes, now)
        for regs in registers
        if not config.cpus or regs.vcpu in config.cpus
    ]


async def _capture_one(
    memory: MemoryBackend, regs: RegisterSet, stack_bytes: int, now: float
) -> RawSample:
    if regs.bits != 64:
        return RawSample(now, regs, error=f"vCPU in {regs.bits}-bit mode: stack not read")
    base = regs.rsp - BELOW_RSP
    data = await memory.read_window(regs.vcpu, base, stack_bytes + BELOW_RSP)
    if len(data) <= BELOW_RSP:  # the page below RSP may be unmapped: start at RSP
        base = regs.rsp
        data = await memory.read_window(regs.vcpu, base, stack_bytes)
    if not data:
        return RawSample(now, regs, error=f"stack unreadable at rsp={regs.rsp:#x}")
    return RawSample(now, regs, MemoryWindow(base, data))
