"""The realistic samples every output-format test writes, unit tests and real consumers alike.

Kernel and user frames, five vCPU/process pairs, a system call, idle samples, frames no
symbol covers, the same user address in four binaries, and guest strings built to break
markup (`HOSTILE`) or to leave a mark on the page if they ever ran (`MARKER_*`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from qmpprof.model import (
    KERNEL_ONLY,
    Frame,
    FrameAddress,
    FrameKind,
    Mode,
    NoUserSymbols,
    Process,
    Recording,
    Sample,
    StopReason,
    Unsymbolized,
)

KERNEL_BASE = 0xFFFF_FFFF_8010_0000
USER_BASE = 0x40_1000
HOSTILE = "[bold red]x</text><script>alert(1)</script>"
#: Would mark the document if it ever ran: the browser tests look for the mark.
MARKER_SCRIPT = "<script>document.documentElement.setAttribute('data-pwned','1')</script>"
MARKER_ATTRIBUTE = "\" onload=\"document.documentElement.setAttribute('data-pwned','2')"
ODD_FRAME = 'operator"";evil<&>'
CRUNCH, RENDER = Process(1, "crunch"), Process(2, "render")
PERIOD_S = 0.01
RECORDING = Recording(
    started=1_700_000_000.0,
    duration_s=1.1,
    period_s=PERIOD_S,
    qmp_socket="./qmp-socket",
    kernel="/build/kernel.elf",
    command_line="qmpprof --kernel /build/kernel.elf",
)


@dataclass(frozen=True)
class Spec:
    """`count` samples with one stack: frames leaf first as (name or None, module, kernel?)."""

    count: int
    vcpu: int
    mode: Mode
    process: Process | None
    frames: list[tuple[str | None, str | None, bool]] = field(default_factory=list)


def k(name: str | None) -> tuple[str | None, str | None, bool]:
    return (name, "kernel.elf" if name else None, True)


def u(name: str | None, module: str = "crunch.elf") -> tuple[str | None, str | None, bool]:
    return (name, module if name else None, False)


SPECS = {
    "physics": Spec(
        40, 0, Mode.KERNEL, KERNEL_ONLY, [k(n) for n in ("physics_leaf", "physics_step")]
    ),
    "syscall": Spec(
        25, 1, Mode.KERNEL, CRUNCH, [k("checksum_leaf"), k("sys_checksum"), u("crunch_checksum")]
    ),
    "crunch": Spec(15, 1, Mode.USER, CRUNCH, [u("crunch_loop")]),
    "render": Spec(10, 2, Mode.USER, RENDER, [u(ODD_FRAME, "render.elf"), u("main", "render.elf")]),
    "unknown_kernel": Spec(5, 0, Mode.KERNEL, None, [k(None)]),
    "unknown_user": Spec(3, 2, Mode.USER, None, [u(None)]),
    "hostile": Spec(4, 2, Mode.USER, Process(66, HOSTILE), [u("hostile_fn", "evil.elf")]),
    "marker": Spec(2, 3, Mode.USER, Process(67, MARKER_SCRIPT), [u(MARKER_ATTRIBUTE, "m.elf")]),
    "idle0": Spec(5, 0, Mode.IDLE, KERNEL_ONLY, [k("idle_halt"), k("idle_loop")]),
    "idle1": Spec(3, 1, Mode.IDLE, KERNEL_ONLY, [k("idle_halt"), k("idle_loop")]),
}
IDLE = 8
TOTAL = sum(spec.count for spec in SPECS.values())
COUNTED = TOTAL - IDLE
KERNEL_SCOPE = sum(SPECS[n].count for n in ("physics", "syscall", "unknown_kernel"))
#: User-mode samples, and the system calls at their user call site.
USER_SCOPE = sum(s.count for s in SPECS.values() if s.mode is Mode.USER) + SPECS["syscall"].count


def _frames(spec: Spec) -> tuple[Frame, ...]:
    """The spec's frames and the outer frames a stack of its kind has, leaf first."""
    _, module, kernel = spec.frames[-1]
    outer = [k("kernel_main"), k("kernel_entry")] if kernel else []
    if module is not None and not kernel:
        outer = [u("_start", module)]
    return tuple(_frame(i, *frame) for i, frame in enumerate(spec.frames + outer))


def _frame(i: int, name: str | None, module: str | None, kernel: bool) -> Frame:
    """A frame at an address fixed by its name (the same in every user binary)."""
    offset = 0x10 * (zlib.crc32(name.encode()) & 0xFFFF) if name else 0x7
    address = (KERNEL_BASE if kernel else USER_BASE) + offset
    return Frame(
        FrameAddress(address, FrameKind.RETURN if i else FrameKind.INSTRUCTION), name, 3, module
    )


def realistic_samples() -> list[Sample]:
    """Every spec's samples, interleaved in time as a recording would produce them."""
    pending = {name: spec.count for name, spec in SPECS.items()}
    samples: list[Sample] = []
    while any(pending.values()):
        for name, spec in SPECS.items():
            if pending[name]:
                pending[name] -= 1
                samples.append(_sample(spec, len(samples) * PERIOD_S))
    return samples


def _sample(spec: Spec, time: float) -> Sample:
    unsymbolized = None
    if spec.process is None and spec.mode is Mode.USER:
        unsymbolized = Unsymbolized(NoUserSymbols.NO_MATCH, f"cr3:{0x5000 + 0x1000 * spec.vcpu:#x}")
    return Sample(
        time=RECORDING.started + time,
        vcpu=spec.vcpu,
        mode=spec.mode,
        frames=_frames(spec),
        stop=StopReason.END_OF_STACK,
        address_space=0x5000 + 0x1000 * spec.vcpu,
        process=spec.process,
        unsymbolized=unsymbolized,
    )
