"""What the live `top` view shows, accumulated from samples: pure, no rich."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from qmpprof.model import Mode, Sample


class SortKey(Enum):
    OWN = "own"
    TOTAL = "total"
    NAME = "name"


@dataclass(frozen=True)
class Row:
    """One line of the table: a function (or a process) with its own and total counts."""

    name: str
    module: str
    own: int
    total: int


@dataclass
class TopStats:
    """Counts since the last reset. `ticks` counts sampling instants (for per-CPU percent)."""

    process_filter: str | None = None
    show_kernel: bool = True
    show_user: bool = True
    show_idle: bool = False
    ticks: int = 0
    modes: Counter[Mode] = field(default_factory=Counter)
    vcpus: Counter[int] = field(default_factory=Counter)
    processes: Counter[str] = field(default_factory=Counter)
    #: The same samples by program (the process's name without its pid).
    programs: Counter[str] = field(default_factory=Counter)
    own: Counter[tuple[str, str]] = field(default_factory=Counter)
    total: Counter[tuple[str, str]] = field(default_factory=Counter)

    def count_tick(self) -> None:
        """One sampling instant (its samples may be added later, with `add`)."""
        self.ticks += 1

    def add(self, sample: Sample) -> None:
        name = sample.process.name if sample.process is not None else None
        if self.process_filter is not None and name != self.process_filter:
            return
        self.modes[sample.mode] += 1
        # busy samples per vCPU (a vCPU seen only idle still shows, at 0 %)
        self.vcpus[sample.vcpu] += sample.mode is not Mode.IDLE
        if not self._shown(sample.mode):
            return
        self.processes[sample.label()] += 1
        self.programs[sample.program()] += 1
        keys = [(f.label(), f.module or "?") for f in sample.frames]
        if keys:
            self.own[keys[0]] += 1
        for key in set(keys):
            self.total[key] += 1

    def _shown(self, mode: Mode) -> bool:
        return {
            Mode.KERNEL: self.show_kernel,
            Mode.USER: self.show_user,
            Mode.IDLE: self.show_idle,
        }[mode]

    def reset(self) -> None:
        """Forget the counts; keep the filters."""
        self.ticks = 0
        counters = (self.modes, self.vcpus, self.processes, self.programs, self.own, self.total)
        for counter in counters:
            counter.clear()

    def function_rows(self, key: SortKey, limit: int) -> list[Row]:
        rows = [Row(n, m, self.own[(n, m)], count) for (n, m), count in self.total.items()]
        return _sorted(rows, key)[:limit]

    def process_rows(self, key: SortKey, limit: int, by_program: bool = False) -> list[Row]:
        """A row per process, or per program (every process of one name together)."""
        counts = self.programs if by_program else self.processes
        rows = [Row(label, "", count, count) for label, count in counts.items()]
        return _sorted(rows, key)[:limit]

    def percent(self, count: int) -> float:
        """Percent of one CPU's time: a function busy on two CPUs shows 200 %."""
        return 100.0 * count / self.ticks if self.ticks else 0.0


def _sorted(rows: list[Row], key: SortKey) -> list[Row]:
    if key is SortKey.NAME:
        return sorted(rows, key=lambda r: r.name)
    if key is SortKey.TOTAL:
        return sorted(rows, key=lambda r: (-r.total, -r.own, r.name))
    return sorted(rows, key=lambda r: (-r.own, -r.total, r.name))
