"""One profile of the QEMU process: perf's host stacks, and the guest's stacks where a
vCPU thread was running guest code (`record --host`).

Every host sample becomes one `Sample` of the QEMU process, on the thread perf saw. A
sample on a vCPU thread whose leaf is guest code (TCG's generated code, or a guest IP
that KVM reported) takes the guest stack qmpprof sampled on that vCPU nearest in time:
its frames, then the guest's process label and a `[guest]` frame, then the host frames
below the generated code (none under TCG: perf cannot unwind out of it). So the guest's
share of each vCPU thread is what perf measured, and its stacks are qmpprof's.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from qmpprof.host.perf_script import HostFrame, HostSample
from qmpprof.model import (
    Frame,
    FrameAddress,
    FrameKind,
    Mode,
    Process,
    Sample,
    StopReason,
    is_kernel_address,
)

#: The frame that marks where a vCPU thread's host stack gives way to the guest's.
GUEST_FRAME = "[guest]"
#: Where a vCPU thread ran guest code with no guest sample of its vCPU near that time.
NOT_SAMPLED = "[no guest sample]"

#: perf's names for code with no file: a JIT's perf map (TCG's code buffer is anonymous
#: executable memory, which perf names /tmp/perf-PID.map), anonymous memory, and KVM's
#: guest (perf's guest machine: `[guest.kernel.kallsyms]`, `[guest.kernel]`, ...).
_GUEST_CODE = re.compile(r"/tmp/perf-\d+\.map|//anon|\[anon[^\]]*\]|\[JIT\].*|\[guest.*")


class HostPart(Enum):
    """Where a host sample of a vCPU thread was."""

    GUEST = "guest"
    QEMU = "QEMU user space"
    HOST_KERNEL = "host kernel"


def part_of(frames: Sequence[HostFrame]) -> HostPart:
    """Which part `frames` (leaf first) ran in: the leaf decides."""
    if not frames:
        return HostPart.QEMU
    leaf = frames[0]
    if _GUEST_CODE.fullmatch(leaf.dso):
        return HostPart.GUEST
    if leaf.dso.startswith("[kernel") or is_kernel_address(leaf.address):
        return HostPart.HOST_KERNEL
    return HostPart.QEMU


@dataclass(frozen=True)
class QemuThreads:
    """The QEMU process perf recorded: its pid and name, and which vCPUs each vCPU
    thread runs (one thread runs them all under single-threaded TCG)."""

    pid: int
    name: str
    vcpus: Mapping[int, tuple[int, ...]]


@dataclass
class HostSplit:
    """Where the vCPU threads' time went (nanoseconds per part) and the other threads'."""

    vcpu_ns: Counter[HostPart] = field(default_factory=Counter)
    other_ns: int = 0
    #: Guest-code samples with no guest sample of their vCPU near them.
    unmatched: int = 0
    samples: int = 0
    #: The vCPU threads' CPU time over the same interval by the kernel's own account
    #: (schedstat), where it was read: what perf's samples should add up to.
    scheduled_ns: int | None = None

    def describe(self) -> str:
        """The summary's line: the vCPU threads' split, then everything else."""
        total = sum(self.vcpu_ns.values())
        parts = ", ".join(
            f"{part.value} {100 * self.vcpu_ns[part] / (total or 1):.1f}% "
            f"({self.vcpu_ns[part] / 1e9:.2f} s)"
            for part in HostPart
        )
        scheduled = (
            f" (the kernel's schedstat: {self.scheduled_ns / 1e9:.2f} s)"
            if self.scheduled_ns is not None
            else ""
        )
        line = (
            f"host (perf, {self.samples} samples): vCPU threads on a host CPU "
            f"{total / 1e9:.2f} s{scheduled}: {parts}; other QEMU threads "
            f"{self.other_ns / 1e9:.2f} s"
        )
        if self.unmatched:
            line += f"; {self.unmatched} guest-code samples had no guest sample near them"
        return line


class _GuestSamples:
    """Each vCPU's guest samples in time order, for the nearest one to a host sample."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        by_vcpu: dict[int, list[Sample]] = {}
        for sample in samples:
            by_vcpu.setdefault(sample.vcpu, []).append(sample)
        self._samples = {v: sorted(s, key=lambda x: x.time) for v, s in by_vcpu.items()}
        self._times = {v: [s.time for s in samples] for v, samples in self._samples.items()}

    def nearest(self, vcpus: Iterable[int], time: float, within: float) -> Sample | None:
        best: Sample | None = None
        for vcpu in vcpus:
            times = self._times.get(vcpu, [])
            at = bisect.bisect_left(times, time)
            for index in (at - 1, at):
                if 0 <= index < len(times) and abs(times[index] - time) <= within:
                    candidate = self._samples[vcpu][index]
                    if best is None or abs(candidate.time - time) < abs(best.time - time):
                        best = candidate
        return best


def merge(
    host: Iterable[HostSample],
    threads: QemuThreads,
    guest: Iterable[Sample],
    offset_s: float,
    within_s: float,
) -> tuple[list[Sample], HostSplit]:
    """The merged samples and the split. `offset_s` turns perf's monotonic clock into
    the guest samples' (wall) clock; a guest sample further than `within_s` from a
    host sample is not its."""
    guest_samples = _GuestSamples(guest)
    split = HostSplit()
    merged = []
    for sample in host:
        if sample.pid != threads.pid:
            continue
        split.samples += 1
        vcpus = threads.vcpus.get(sample.tid, ())
        part = part_of(sample.frames)
        if not vcpus:
            split.other_ns += sample.period
            merged.append(_host_sample(sample, threads, part, offset_s))
            continue
        split.vcpu_ns[part] += sample.period
        if part is not HostPart.GUEST:
            merged.append(_host_sample(sample, threads, part, offset_s))
            continue
        matched = guest_samples.nearest(vcpus, sample.time_s + offset_s, within_s)
        split.unmatched += matched is None
        merged.append(_guest_sample(sample, threads, matched, offset_s))
    return merged, split


def _process(sample: HostSample, threads: QemuThreads) -> Process:
    vcpus = threads.vcpus.get(sample.tid, ())
    name: str | None = sample.comm
    if sample.comm == threads.name:  # QEMU names its threads only with debug-threads=on
        name = "vCPU " + ",".join(map(str, vcpus)) if vcpus else None
    return Process(threads.pid, threads.name, sample.tid, name)


def _host_sample(sample: HostSample, threads: QemuThreads, part: HostPart, offset: float) -> Sample:
    vcpus = threads.vcpus.get(sample.tid, ())
    return Sample(
        time=sample.time_s + offset,
        vcpu=min(vcpus, default=-1),
        mode=Mode.KERNEL if part is HostPart.HOST_KERNEL else Mode.USER,
        frames=tuple(host_frames(sample.frames)),
        stop=StopReason.END_OF_STACK,
        process=_process(sample, threads),
    )


def _guest_sample(
    sample: HostSample, threads: QemuThreads, guest: Sample | None, offset: float
) -> Sample:
    below = [f for f in sample.frames if part_of((f,)) is not HostPart.GUEST]
    if guest is None:
        upper: tuple[Frame, ...] = (pseudo_frame(NOT_SAMPLED),)
        mode = Mode.USER
    else:
        upper = (*guest.frames, pseudo_frame(guest.label()))
        mode = Mode.KERNEL if guest.mode is Mode.IDLE else guest.mode
    return Sample(
        time=sample.time_s + offset,
        vcpu=min(threads.vcpus[sample.tid]),
        mode=mode,
        frames=(*upper, pseudo_frame(GUEST_FRAME), *host_frames(below)),
        stop=guest.stop if guest is not None else StopReason.END_OF_STACK,
        process=_process(sample, threads),
        fault_address=guest.fault_address if guest is not None else None,
    )


def host_frames(frames: Sequence[HostFrame]) -> list[Frame]:
    """perf's frames (leaf first) as profile frames: the leaf an instruction, the rest
    return addresses; a frame perf could not name is `FILE+offset`."""
    return [
        Frame(
            FrameAddress(f.address, FrameKind.RETURN if depth else FrameKind.INSTRUCTION),
            f.symbol,
            f.address,
            os.path.basename(f.dso) or f.dso,
        )
        for depth, f in enumerate(frames)
    ]


def pseudo_frame(label: str) -> Frame:
    """A frame that stands for no code: where the guest begins, the guest's process."""
    return Frame(FrameAddress(0, FrameKind.INSTRUCTION), label, 0, None)
