"""Aggregate samples into stacks with counts, per process."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from qmpprof.model import Frame, Mode, Sample, Unsymbolized


class Scope(Enum):
    """Which part of each stack to keep (`--kernel-only`, `--user-only`)."""

    ALL = "all"
    #: Samples taken in the kernel, kernel frames only.
    KERNEL = "kernel"
    #: The user frames of every sample that has any (a syscall counts at its call site).
    USER = "user"


class Grouping(Enum):
    """The levels a profile puts between its root and the stacks (`--group-by`)."""

    #: Process, then thread (perf's and samply's grouping): a process's picture whole.
    THREAD = "thread"
    #: Process, then the vCPU it ran on.
    VCPU = "vcpu"
    #: Process only.
    PROCESS = "process"
    #: Program only (the process's name, its comm): every process of one program merged,
    #: as perf's `--sort comm`; a guest forking hundreds of short-lived processes of a
    #: few programs is then a few roots.
    COMM = "comm"


def group_labels(sample: Sample, grouping: Grouping) -> tuple[str, ...]:
    """The labels above `sample`'s stack, outermost first: its process, then its thread
    or vCPU as `grouping` says (a thread where it ran on no vCPU: a host thread); by
    program, that alone."""
    if grouping is Grouping.COMM:
        return (sample.program(),)
    process = sample.label()
    thread = sample.process.thread_label() if sample.process is not None else None
    if grouping is Grouping.VCPU and sample.vcpu >= 0:
        return process, f"vCPU {sample.vcpu}"
    if grouping is not Grouping.PROCESS and thread is not None:
        return process, thread
    return (process,)


def frames_in_scope(sample: Sample, scope: Scope) -> tuple[Frame, ...]:
    """The frames of `sample` (leaf first) that `scope` keeps; () drops the sample."""
    if scope is Scope.KERNEL:
        if sample.mode is Mode.USER:
            return ()
        return tuple(f for f in sample.frames if f.is_kernel)
    if scope is Scope.USER:
        return tuple(f for f in sample.frames if not f.is_kernel)
    return sample.frames


def counted(sample: Sample, scope: Scope, include_idle: bool) -> tuple[Frame, ...]:
    """The frames a profile counts for `sample` (leaf first); () when it is not counted."""
    if sample.mode is Mode.IDLE and not include_idle:
        return ()
    return frames_in_scope(sample, scope)


@dataclass(frozen=True)
class StackCount:
    """One distinct stack (root first) and how many samples had it."""

    frames: tuple[str, ...]
    count: int


@dataclass
class Profile:
    """Counts of stacks, root first: the group labels (process, thread or vCPU), then
    frame labels.

    Every sample is counted in `modes`; idle samples enter `stacks` only with
    include_idle, and samples with no frame in the scope not at all.
    """

    include_idle: bool = False
    scope: Scope = Scope.ALL
    grouping: Grouping = Grouping.THREAD
    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)
    modes: Counter[Mode] = field(default_factory=Counter)
    #: Samples by process label, or by program where grouped by program (COMM).
    processes: Counter[str] = field(default_factory=Counter)
    unsymbolized: Counter[Unsymbolized] = field(default_factory=Counter)
    torn: int = 0
    #: Samples whose analysis failed (a bug, reported in the summary instead of a crash).
    unanalysed: int = 0
    last_error: str | None = None

    def add(self, sample: Sample) -> None:
        self.modes[sample.mode] += 1
        self.torn += sample.torn
        if sample.unsymbolized is not None:
            self.unsymbolized[sample.unsymbolized] += 1
        if sample.mode is Mode.IDLE and not self.include_idle:
            return
        frames = frames_in_scope(sample, self.scope)
        if not frames:
            return
        label = sample.program() if self.grouping is Grouping.COMM else sample.label()
        self.processes[label] += 1
        groups = group_labels(sample, self.grouping)
        self.stacks[(*groups, *(frame.label() for frame in reversed(frames)))] += 1

    @property
    def total(self) -> int:
        """Every sample added, idle included."""
        return sum(self.modes.values())

    @property
    def stacked(self) -> int:
        """Samples that entered `stacks`."""
        return sum(self.stacks.values())

    def top(self, limit: int) -> list[StackCount]:
        """The `limit` most frequent stacks, heaviest first (ties by name, for stable output)."""
        ordered = sorted(self.stacks.items(), key=lambda item: (-item[1], item[0]))
        return [StackCount(frames, count) for frames, count in ordered[:limit]]
