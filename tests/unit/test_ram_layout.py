"""QEMU 7.2's RAM layout text (saved `info mtree -f`, `info ramblock`, `gpa2hva` output)."""

from pathlib import Path

import pytest

from qmpprof.errors import DirectMemoryUnavailable
from qmpprof.target.ram_layout import (
    RamRange,
    parse_flat_ram,
    parse_gpa2hva,
    parse_ramblocks,
)

DATA = Path(__file__).parent / "data"


def test_flat_ram_of_the_example_guest_with_a_memory_backend() -> None:
    ranges = parse_flat_ram((DATA / "mtree_f_memory_backend_128m.txt").read_text())
    assert ranges == [
        RamRange(0x0, 0xA0000, "mem", 0x0),
        RamRange(0xC0000, 0x8000000 - 0xC0000, "mem", 0xC0000),  # PAM pieces merged
        RamRange(0xFD000000, 0x1000000, "vga.vram", 0x0),
        RamRange(0xFFFC0000, 0x40000, "pc.bios", 0x0),
    ]


def test_flat_ram_above_4g_continues_the_block_after_the_pci_hole() -> None:
    q35 = parse_flat_ram((DATA / "mtree_f_q35_5g.txt").read_text())
    assert RamRange(0x1_0000_0000, 0xC000_0000, "mem", 0x8000_0000) in q35
    assert RamRange(0x10_0000, 0x7FF0_0000, "mem", 0x10_0000) in q35
    kvm = parse_flat_ram((DATA / "mtree_f_pc_kvm_5g.txt").read_text())  # " KVM" suffixes
    assert [(r.start, r.region, r.offset) for r in kvm] == [
        (0x0, "pc.ram", 0x0),
        (0xC0000, "pc.rom", 0x0),
        (0xE0000, "pc.bios", 0x20000),
        (0x100000, "pc.ram", 0x100000),
        (0xFFFC0000, "pc.bios", 0x0),
        (0x1_0000_0000, "pc.ram", 0xC000_0000),
    ]


def test_ramblocks() -> None:
    blocks = parse_ramblocks((DATA / "ramblock_pc_kvm_5g.txt").read_text())
    assert len(blocks) == 9
    assert (blocks[0].name, blocks[0].used) == ("pc.ram", 0x1_4000_0000)
    assert blocks[1].name == "0000:00:02.0/vga.vram"


def test_unknown_layouts_are_refused() -> None:
    with pytest.raises(DirectMemoryUnavailable, match="unknown layout"):
        parse_flat_ram('FlatView #0\n AS "I/O", root: io\n')
    with pytest.raises(DirectMemoryUnavailable, match="is not RAM"):
        parse_gpa2hva("Memory at address 0xa0000 is not RAM\n")
    assert parse_gpa2hva("Host virtual address for 0x0 (mem) is 0x7fcde3fff000\n") == (
        "mem",
        0x7FCDE3FFF000,
    )
