"""A Linux guest's kernel modules: the module list read from guest memory saved from
Debian 12's 6.1 and 6.12 kernels booted with KASLR (tests/unit/data/linux/modules.json,
recorded by record_modules.py there), then mapped by name in the kernel's half.

The oracles are not qmpprof's: GDB's offsets of struct module's members, nm's address
of `modules`, and the names and addresses /proc/modules gave the guest's init."""

from __future__ import annotations

import asyncio
import json
import lzma
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from qmpprof.analysis import Analyzer
from qmpprof.errors import BadRecord, MemoryFault
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.modules import (
    MAX_NAME,
    ModuleListLayout,
    ModuleWalk,
    module_list_layout,
)
from qmpprof.memory import WindowMemory
from qmpprof.model import (
    KERNEL_HALF,
    CapturedSample,
    KernelModule,
    MemoryWindow,
    RawSample,
    Recording,
    RegisterSet,
    StopReason,
    UnwoundStack,
)
from qmpprof.modules import unread_module
from qmpprof.record.kernel_modules import REREAD_INTERVAL_S, KernelModules
from qmpprof.record.qmpcap_schema import MAX_KERNEL_MODULES, decode_header, encode_header
from qmpprof.symbols.kernel_object import ModuleFiles, load_kernel_object
from qmpprof.unwind.orc import ENTRY_SIZE, Layout, decode_entry, entry_row
from tests.linux_vm import INITRAMFS, initramfs_file
from tests.unit.conftest import build_elf
from tests.unit.data.linux.record_modules import layout_of
from tests.unit.test_symbols import nm_functions

DATA: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "linux" / "modules.json").read_text()
)
ABIS = sorted(DATA)
CACHE = Path.home() / ".cache" / "qmpprof" / "linux"


def saved_layout(abi: str) -> ModuleListLayout:
    kernel = DATA[abi]
    return layout_of(int(kernel["nm_modules"], 16), kernel["gdb_struct_module"])


def saved_memory(abi: str) -> WindowMemory:
    return WindowMemory(MemoryWindow(b, bytes.fromhex(d)) for b, d in DATA[abi]["windows"])


def init_said(abi: str) -> list[tuple[str, int]]:
    return [(name, int(address, 16)) for name, address in DATA[abi]["init_modules"]]


@pytest.mark.parametrize("abi", ABIS)
def test_the_walk_finds_what_proc_modules_said(abi: str) -> None:
    walk = ModuleWalk(saved_layout(abi), DATA[abi]["slide"])
    found = walk.advance(saved_memory(abi))
    assert [(m.name, m.base) for m in found] == init_said(abi)
    assert all(0 < m.size < 1 << 20 for m in found)  # crc8's text: a page or two


@pytest.mark.parametrize("abi", ABIS)
def test_the_walk_resumes_after_each_fault(abi: str) -> None:
    """As the capture step reads it: nothing, then one more window per fault."""
    windows: list[MemoryWindow] = []
    saved = saved_memory(abi)
    walk = ModuleWalk(saved_layout(abi), DATA[abi]["slide"])
    for _ in range(len(DATA[abi]["windows"]) + 1):
        try:
            found = walk.advance(WindowMemory(windows[-1:]))
            break
        except MemoryFault as fault:
            windows.append(MemoryWindow(fault.address, saved.read(fault.address, fault.size)))
    assert [(m.name, m.base) for m in found] == init_said(abi)
    assert len(windows) == len(DATA[abi]["windows"])


@pytest.mark.parametrize("abi", ABIS)
def test_the_layout_from_dwarf_is_gdbs(abi: str) -> None:
    vmlinux = CACHE / abi / "vmlinux"
    if not vmlinux.exists():
        pytest.skip(f"{vmlinux} not fetched (make linux-guest)")
    found = module_list_layout(ElfTypes(vmlinux))
    expected = saved_layout(abi)
    assert found is not None
    assert (found.head, found.list, found.name, found.name_size) == (
        expected.head,
        expected.list,
        expected.name,
        MAX_NAME,
    )
    assert (found.state, found.base, found.size) == (expected.state, expected.base, expected.size)


def test_a_list_that_points_back_into_itself_ends() -> None:
    """A node whose next is itself: read once, then the walk stops."""
    layout = saved_layout(ABIS[-1])
    node = KERNEL_HALF + 0x1000
    span = bytearray(layout.span)
    span[layout.list : layout.list + 8] = node.to_bytes(8, "little")
    span[layout.name : layout.name + 4] = b"loop"
    span[layout.base : layout.base + 8] = (KERNEL_HALF + 0x10_0000).to_bytes(8, "little")
    span[layout.size : layout.size + 4] = (0x1000).to_bytes(4, "little")
    head = MemoryWindow(layout.head, node.to_bytes(8, "little"))
    memory = WindowMemory([head, MemoryWindow(node - layout.list, bytes(span))])
    found = ModuleWalk(layout, 0).advance(memory)
    assert found == (KernelModule("loop", KERNEL_HALF + 0x10_0000, 0x1000),)


#: A kernel of 16 MiB at Linux's default text address, as its file would map it.
KERNEL_TEXT = 0xFFFF_FFFF_8100_0000
KERNEL = replace(
    unread_module(KernelModule("vmlinux", 0, 1)), extent=(KERNEL_TEXT, KERNEL_TEXT + (16 << 20))
)


def analyzer_with(abi: str) -> tuple[Analyzer, KernelModule]:
    analyzer = Analyzer(KERNEL)
    analyzer.relocate_kernel(DATA[abi]["slide"])
    walk = ModuleWalk(saved_layout(abi), DATA[abi]["slide"])
    loaded = walk.advance(saved_memory(abi))
    analyzer.place_kernel_modules(loaded)
    return analyzer, loaded[0]


def leaf(address: int) -> RawSample:
    registers = RegisterSet(0, {"rip": address, "rsp": 0, "rbp": 0}, 0x10, 0, False, 64)
    return RawSample(0.0, registers)


@pytest.mark.parametrize("abi", ABIS)
def test_a_pc_in_a_module_is_its_name_and_offset(abi: str) -> None:
    analyzer, crc8 = analyzer_with(abi)
    sample = analyzer.analyze(leaf(crc8.base + 0x1A))
    frame = sample.frames[0]
    assert (frame.function, frame.offset, frame.module) == ("[crc8]", 0x1A, "crc8")
    assert analyzer.analyze(leaf(crc8.end)).frames[0].function != "[crc8]"
    assert not sample.torn


@pytest.mark.parametrize("abi", ABIS)
def test_modules_that_overlap_the_kernel_or_each_other_are_left_out(abi: str) -> None:
    analyzer, crc8 = analyzer_with(abi)
    kernel_start = KERNEL_TEXT + analyzer.kernel_bias
    over_kernel = KernelModule("over", kernel_start + 0x1000, 0x1000)
    twin = KernelModule("twin", crc8.base + 0x10, crc8.size)
    analyzer.place_kernel_modules([crc8, over_kernel, twin])
    assert analyzer.kernel_modules == (crc8,)


def test_a_capture_keeps_the_kernel_modules() -> None:
    loaded = (KernelModule("crc8", 0xFFFF_FFFF_C041_F000, 0x1000),)
    recording = Recording(1.0, 2.0, 0.01, kernel_bias=0x2320_0000, kernel_modules=loaded)
    assert decode_header(json.loads(encode_header(recording)))[0] == recording


@pytest.mark.parametrize(
    ("modules", "field"),
    [
        ([{"name": "x" * (MAX_NAME + 1), "base": 0, "size": 1}], "kernel_modules.name"),
        ([{"name": "x", "base": (1 << 64) - 1, "size": 2}], "kernel_modules.size"),
        ([{"name": "x", "base": -1, "size": 2}], "kernel_modules.base"),
        ([{"name": "x", "base": 0, "size": 1}] * (MAX_KERNEL_MODULES + 1), "kernel_modules"),
    ],
)
def test_a_capture_with_bad_kernel_modules_names_the_field(
    modules: list[dict[str, Any]], field: str
) -> None:
    header = json.loads(encode_header(Recording(1.0, 2.0, 0.01)))
    header["recording"]["kernel_modules"] = modules
    with pytest.raises(BadRecord, match=f"'recording.{field}'"):
        decode_header(header)


@pytest.fixture(scope="module")
def kernel_object(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_elf("kernel_module.c", tmp_path_factory.mktemp("ko"), "-c", "-O2")
    return built.rename(built.with_name("fake_module.ko"))


def readelf_sections(path: Path) -> dict[str, tuple[int, int]]:
    """(size, alignment) of each section, as readelf reads them."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True)
    found = {}
    for line in out.stdout.splitlines():
        fields = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+\S+\s+\S+\s+(\S+)\s.*\s(\d+)$", line)
        if fields:
            found[fields.group(1)] = (int(fields.group(2), 16), int(fields.group(3)))
    return found


def test_a_ko_is_laid_out_as_the_kernel_lays_out_its_text(kernel_object: Path) -> None:
    """.text first, .text.unlikely after it at its alignment, .init.text nowhere: nm's
    values placed so are where the symbols are found."""
    sections = readelf_sections(kernel_object)
    values = {name: address for name, (address, _) in nm_functions(kernel_object).items()}
    text_size = sections[".text"][0]
    align = sections[".text.unlikely"][1]
    unlikely = -(-text_size // align) * align
    module = load_kernel_object(kernel_object, "fake_module")
    work = module.symbols.lookup(values["module_work"])
    assert work is not None and work[0].name == "module_work"
    rare = module.symbols.lookup(unlikely + values["module_rare"])
    assert rare is not None and rare[0].name == "module_rare"
    assert module.symbols.find("module_setup") is None


def test_module_files_match_dashes_and_underscores_and_xz(
    kernel_object: Path, tmp_path: Path
) -> None:
    (tmp_path / "fake-module.ko.xz").write_bytes(lzma.compress(kernel_object.read_bytes()))
    (tmp_path / "broken.ko").write_bytes(b"not an ELF")
    said: list[str] = []
    files = ModuleFiles([tmp_path], said.append)
    loaded = [KernelModule(n, KERNEL_HALF, 0x1000) for n in ("fake_module", "broken", "absent")]
    found = files.for_modules(loaded)
    assert list(found) == ["fake_module"] and found["fake_module"].symbols.find("module_work")
    assert len(said) == 1 and "broken.ko" in said[0] and "by name only" in said[0]
    files.for_modules(loaded)
    assert len(said) == 1  # told once


def test_a_module_file_larger_than_the_guests_text_is_not_used(kernel_object: Path) -> None:
    """A .ko whose text does not fit the module's is another build: name only."""
    analyzer, crc8 = analyzer_with(ABIS[-1])
    module = load_kernel_object(kernel_object, "crc8")
    small = replace(crc8, size=module.extent[1] - 1)
    analyzer.place_kernel_modules([small], {"crc8": module})
    assert analyzer.analyze(leaf(small.base)).frames[0].function == "[crc8]"
    analyzer.place_kernel_modules([crc8], {"crc8": module})
    assert analyzer.analyze(leaf(crc8.base)).frames[0].function != "[crc8]"


class SavedMemory:
    """The guest memory saved in modules.json as a MemoryBackend: what it holds, counted."""

    name = "saved"
    through_monitor = False

    def __init__(self, abi: str) -> None:
        self._memory = saved_memory(abi)
        self.reads = 0

    def set_registers(self, registers: object) -> None:
        pass

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        self.reads += 1
        try:
            return self._memory.read(address, size)
        except MemoryFault:
            return b""

    async def close(self) -> None:
        pass


def test_an_unknown_kernel_pc_rereads_the_list_at_most_once_a_second() -> None:
    abi = ABIS[-1]
    analyzer = Analyzer(KERNEL)
    analyzer.relocate_kernel(DATA[abi]["slide"])
    memory, now = SavedMemory(abi), [100.0]
    modules = KernelModules(analyzer, memory, 0, saved_layout(abi), clock=lambda: now[0])
    crc8 = init_said(abi)[0][1]
    in_kernel = KERNEL_TEXT + analyzer.kernel_bias + 0x10

    def check(pc: int) -> int:
        before = memory.reads
        asyncio.run(
            modules.check([CapturedSample(leaf(pc), UnwoundStack((), StopReason.NO_STACK), None)])
        )
        return memory.reads - before

    assert check(in_kernel) == 0  # the kernel's own code: nothing to learn
    assert check(crc8 + 4) == 2  # the head, then crc8's struct module
    assert analyzer.kernel_module_at(crc8 + 4) is not None
    assert check(crc8 + 4) == 0  # known now
    unknown = KERNEL_HALF + 0x1000
    now[0] += REREAD_INTERVAL_S / 2
    assert check(unknown) == 0  # read half a second ago
    now[0] += REREAD_INTERVAL_S
    assert check(unknown) == 2


def guest_crc8(abi: str, directory: Path) -> Path:
    """The crc8.ko the Linux example guest loads on kernel `abi` (from its initramfs)."""
    if not INITRAMFS.exists():
        pytest.skip(f"{INITRAMFS} not built (make linux-guest)")
    path = directory / "crc8.ko"
    path.write_bytes(initramfs_file(f"lib/modules/{abi}/crc8.ko"))
    return path


def readelf_orc_addresses(path: Path) -> dict[int, int]:
    """Entry index -> text offset of each .orc_unwind_ip entry: readelf's relocations
    (all against .text, which is first in the module's text, at offset 0)."""
    out = subprocess.run(["readelf", "-rW", str(path)], capture_output=True, text=True).stdout
    table = out.split("'.rela.orc_unwind_ip'", 1)[1].split("\n\n", 1)[0]
    found = {}
    for offset, addend in re.findall(
        r"^([0-9a-f]+) .*R_X86_64_PC32 .* \.text \+ ([0-9a-f]+)$", table, re.M
    ):
        found[int(offset, 16) // 4] = int(addend, 16)
    return found


@pytest.mark.parametrize("abi", ABIS)
def test_a_kos_orc_rows_are_its_entries_at_their_relocated_addresses(
    abi: str, tmp_path: Path
) -> None:
    path = guest_crc8(abi, tmp_path)
    module = load_kernel_object(path, "crc8")
    with path.open("rb") as stream:
        elf = ELFFile(stream)
        section = elf.get_section_by_name(".orc_unwind")
        assert section is not None
        entries = section.data()
        layout = Layout.FROM_6_4 if elf.get_section_by_name(".orc_header") else Layout.BEFORE_6_4
    addresses = readelf_orc_addresses(path)
    assert module.orc is not None and len(module.orc) == len(addresses) > 0
    for index, address in addresses.items():
        expected = entry_row(decode_entry(entries, index * ENTRY_SIZE, layout))
        assert module.orc.row_for(address) == expected, hex(address)
