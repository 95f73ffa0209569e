"""QEMU's own description of guest RAM, parsed: `info mtree -f`, `info ramblock`,
`gpa2hva`. Pure text parsing, for the direct memory backend (target/direct.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from qmpprof.errors import DirectMemoryUnavailable

_FLATVIEW = re.compile(r"^FlatView #\d+\s*$", re.MULTILINE)
_FLAT_RANGE = re.compile(
    r"^\s+([0-9a-f]+)-([0-9a-f]+) \(prio -?\d+, (?:nv-)?([a-z/]+)\): (.+?)(?: @([0-9a-f]+))?"
    r"(?: (?:KVM|HVF|WHPX|NVMM|Xen))*\s*$"  # accelerators that hold the range (" KVM")
)
_READABLE_KINDS = frozenset({"ram", "rom", "romd"})  # not "ramd": device memory (VFIO BARs)
_RAMBLOCK = re.compile(
    r"^\s*(\S+)\s+\d+ [KMGT]?i?B\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s*$"
)
_GPA2HVA = re.compile(r"Host virtual address for 0x([0-9a-f]+) \((.*)\) is (?:0x)?([0-9a-f]+)")


@dataclass(frozen=True)
class RamRange:
    """Guest physical [start, start + size) is RAM block memory from `offset` in the
    memory region `region` (as `info mtree -f` names it)."""

    start: int
    size: int
    region: str
    offset: int

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class RamBlock:
    """One line of `info ramblock`: a RAM block and its bytes in use."""

    name: str
    offset: int
    used: int
    total: int


def parse_flat_ram(text: str) -> list[RamRange]:
    """The readable RAM/ROM ranges of the system address space (`AS "memory"`) in
    `info mtree -f` output, sorted, contiguous pieces merged. Raises
    DirectMemoryUnavailable when there is no such flat view or no RAM in it."""
    view = _system_flat_view(text)
    ranges: list[RamRange] = []
    for line in view.splitlines():
        match = _FLAT_RANGE.match(line)
        if match is None or match.group(3) not in _READABLE_KINDS:
            continue
        start, last = int(match.group(1), 16), int(match.group(2), 16)
        offset = int(match.group(5) or "0", 16)
        ranges.append(RamRange(start, last - start + 1, match.group(4), offset))
    if not ranges:
        raise DirectMemoryUnavailable("unknown layout: no RAM in QEMU's 'info mtree -f'")
    return _merge(sorted(ranges, key=lambda r: r.start))


def _system_flat_view(text: str) -> str:
    for view in _FLATVIEW.split(text):
        if re.search(r'^\s*AS "memory"', view, re.MULTILINE):
            return view
    raise DirectMemoryUnavailable('unknown layout: no flat view of AS "memory" in mtree')


def _merge(ranges: Iterable[RamRange]) -> list[RamRange]:
    """Adjacent ranges of one region at consecutive offsets become one range."""
    merged: list[RamRange] = []
    for current in ranges:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last.end == current.start
            and last.region == current.region
            and last.offset + last.size == current.offset
        ):
            merged[-1] = RamRange(last.start, last.size + current.size, last.region, last.offset)
        else:
            merged.append(current)
    return merged


def parse_ramblocks(text: str) -> list[RamBlock]:
    """The blocks listed by `info ramblock` (header and unknown lines skipped)."""
    blocks = []
    for line in text.splitlines():
        match = _RAMBLOCK.match(line)
        if match is not None:
            offset, used, total = (int(match.group(i), 16) for i in (2, 3, 4))
            blocks.append(RamBlock(match.group(1), offset, used, total))
    return blocks


def parse_gpa2hva(text: str) -> tuple[str, int]:
    """(region name, host address) from HMP `gpa2hva` output. Raises
    DirectMemoryUnavailable with QEMU's words when it gave no address."""
    match = _GPA2HVA.search(text)
    if match is None:
        raise DirectMemoryUnavailable(f"unknown layout: gpa2hva said {text.strip()!r}")
    return match.group(2), int(match.group(3), 16)
