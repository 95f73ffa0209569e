"""Aggregate samples into stacks with counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from qmpprof.model import Mode, Sample


@dataclass(frozen=True)
class StackCount:
    """One distinct stack (root first) and how many samples had it."""

    frames: tuple[str, ...]
    count: int


@dataclass
class Profile:
    """Counts of stacks (root-first frame labels) and of samples per mode.

    Idle samples are counted in `modes` but only enter `stacks` with include_idle.
    """

    include_idle: bool = False
    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)
    modes: Counter[Mode] = field(default_factory=Counter)

    def add(self, sample: Sample) -> None:
        self.modes[sample.mode] += 1
        if sample.mode is Mode.IDLE and not self.include_idle:
            return
        self.stacks[tuple(frame.label() for frame in reversed(sample.frames))] += 1

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
