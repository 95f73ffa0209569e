"""A Linux process's executable file mappings: the VMA walk and the build-id reader over
guest memory saved from Debian 12's 6.1 and 6.12 kernels (tests/unit/data/linux/
maps.json, recorded by record_maps.py there: each read's bytes, as the walk asked).

The oracles are not qmpprof's: the /proc/PID/maps lines the guest's init printed (the
vDSO's among them), GDB's member offsets and maple node layout, and readelf's build-ids
of the workloads' files, of the vDSO the vmlinux embeds (and of an ELF built here)."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from qmpprof.guest.adapter import GenericAdapter
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.maps import (
    ARANGE_64,
    RANGE_64,
    SHAPES,
    BuildIdRead,
    MappedFile,
    MapsLayout,
    MapsWalk,
    maps_layout,
)
from qmpprof.memory import WindowMemory
from qmpprof.model import KERNEL_HALF, FileMapping, MemoryWindow, RegisterSet
from qmpprof.record.page_reader import PAGE_SIZE
from qmpprof.record.process_maps import (
    LOADING_WALKS,
    PROMPT_WALKS,
    REREAD_INTERVAL_S,
    WALK_TRIES,
    ProcessMaps,
    read_maps,
)
from qmpprof.user_files import GUEST_COPY_TRIES, UserFiles
from tests.elf_tools import readelf_build_id
from tests.linux_tasks import proc_maps
from tests.unit.conftest import build_elf

DATA: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "linux" / "maps.json").read_text()
)
ABIS = sorted(DATA)
CACHE = Path.home() / ".cache" / "qmpprof" / "linux"
CAUGHT = [(abi, name) for abi in ABIS for name in sorted(DATA[abi]["workloads"])]


def gdb_layout(abi: str) -> MapsLayout:
    return MapsLayout(*DATA[abi]["gdb"]["layout"])


def saved(reads: list[list[Any]]) -> WindowMemory:
    return WindowMemory(MemoryWindow(address, bytes.fromhex(data)) for address, data in reads)


def walked(abi: str, name: str) -> tuple[MappedFile, ...]:
    workload = DATA[abi]["workloads"][name]
    return MapsWalk(gdb_layout(abi), workload["task"]).advance(saved(workload["kernel_reads"]))


def printed(abi: str, name: str) -> tuple[FileMapping, ...]:
    """The executable file mappings init printed from the workload's /proc/PID/maps."""
    pid = DATA[abi]["workloads"][name]["pid"]
    return proc_maps("\n".join(DATA[abi]["maps_lines"])).get(pid, ())


def proc_and_readelf(abi: str, name: str) -> list[list[Any]]:
    """Each mapping /proc printed, with readelf's build-id of its file (of the vDSO the
    vmlinux embeds for [vdso]): what a walk and its build-id reads must give."""
    program, vdso = DATA[abi]["workloads"][name]["build_id"], DATA[abi]["vdso_build_id"]
    return [
        [m.start, m.end, m.offset, m.path, vdso if m.path == "[vdso]" else program]
        for m in printed(abi, name)
    ]


def test_every_busy_workload_was_caught_and_has_a_file_mapping() -> None:
    """The recording caught each CPU-bound workload on each kernel; /proc gave each one
    an executable file mapping (else the comparisons below test nothing)."""
    for abi in ABIS:
        assert sorted(DATA[abi]["workloads"]) == ["crunch", "crunchnofp", "pinned", "sysloop"]
    assert all(printed(abi, name) for abi, name in CAUGHT)


@pytest.mark.parametrize(("abi", "name"), CAUGHT)
def test_the_walk_finds_what_proc_maps_printed(abi: str, name: str) -> None:
    found = [(m.start, m.end, m.offset, m.path) for m in walked(abi, name)]
    assert found == [(m.start, m.end, m.offset, m.path) for m in printed(abi, name)]


@pytest.mark.parametrize(("abi", "name"), CAUGHT)
def test_the_build_id_in_guest_memory_is_readelfs(abi: str, name: str) -> None:
    workload = DATA[abi]["workloads"][name]
    memory = saved(workload["user_reads"])
    for mapped in walked(abi, name):
        assert mapped.header is not None
        build_id = BuildIdRead(mapped.header, mapped.header_size).advance(memory)
        expected = DATA[abi]["vdso_build_id"] if mapped.path == "[vdso]" else workload["build_id"]
        assert build_id == bytes.fromhex(expected)


@pytest.mark.parametrize("abi", ABIS)
def test_the_dwarf_layout_is_gdbs(abi: str) -> None:
    vmlinux = CACHE / abi / "vmlinux"
    if not vmlinux.exists():
        pytest.skip(f"{vmlinux} is not cached (make linux-guest)")
    assert maps_layout(ElfTypes(vmlinux)) == gdb_layout(abi)


MAPLE_ABIS = [abi for abi in ABIS if DATA[abi]["gdb"]["ptype"]]


def test_a_kernel_without_a_maple_tree_is_walked_as_a_list() -> None:
    """5.10's VMAs are a list (mm_struct.mmap, vm_next): GDB's layout says so, and the
    walk above read it."""
    listed = [abi for abi in ABIS if abi not in MAPLE_ABIS]
    assert listed, "no kernel of the list era recorded: nothing is tested"
    for abi in listed:
        assert gdb_layout(abi).vm_next is not None
    for abi in MAPLE_ABIS:
        assert gdb_layout(abi).vm_next is None


@pytest.mark.parametrize("abi", MAPLE_ABIS)
def test_the_maple_node_shapes_are_gdbs(abi: str) -> None:
    """Pivots, slots and metadata where GDB's ptype/o puts them, in both node types."""
    ptype = DATA[abi]["gdb"]["ptype"]
    for number, struct_name in ((RANGE_64, "maple_range_64"), (ARANGE_64, "maple_arange_64")):
        members = gdb_members(ptype, struct_name)
        expected = (members["pivot"][0], members["slot"][0], members["slot"][1], members["end"][0])
        shape = SHAPES[number]
        assert (shape.pivots, shape.slots, shape.count, shape.meta_end) == expected


def gdb_members(ptype: str, struct_name: str) -> dict[str, tuple[int, int]]:
    """Each member's offset and element count (1 if not an array), the first of each
    name, from GDB's `ptype/o struct NAME` (a member of a union prints its offset
    alone)."""
    body = ptype[ptype.index(f"type = struct {struct_name} {{") :]
    body = body[: body.find("type = struct", 1)]
    members: dict[str, tuple[int, int]] = {}
    line = r"/\*\s+(\d+)\s+(?:\|\s+\d+\s+)?\*/\s+[^;{]*?\b(\w+)(?:\[(\d+)\])?;"
    for offset, name, count in re.findall(line, body):
        members.setdefault(name, (int(offset), int(count or 1)))
    return members


@pytest.mark.parametrize("build_id", ["sha1", "md5", "none"])
def test_the_build_id_of_an_elf_built_here(build_id: str, tmp_path: Path) -> None:
    """The file's first page as a loader maps it: readelf's build-id, or None."""
    elf = build_elf("symbols.c", tmp_path, "-O1", f"-Wl,--build-id={build_id}")
    header = elf.read_bytes()[:PAGE_SIZE]
    memory = WindowMemory([MemoryWindow(0x5555_0000_0000, header)])
    found = BuildIdRead(0x5555_0000_0000, len(header)).advance(memory)
    assert found == readelf_build_id(elf)
    assert (found is None) == (build_id == "none")


class SavedGuest:
    """A memory backend over the saved reads: each page the walk asks for holds the
    bytes the recording read there (the rest of the page, never read, is zero); a page
    nothing was read from is not readable."""

    def __init__(self, reads: list[list[Any]]) -> None:
        self.pages: dict[int, bytearray] = {}
        for address, data in reads:
            raw = bytes.fromhex(data)
            for at, byte in enumerate(raw):
                page = self.pages.setdefault((address + at) // PAGE_SIZE, bytearray(PAGE_SIZE))
                page[(address + at) % PAGE_SIZE] = byte
        self.reads = 0

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        self.reads += 1
        data = b""
        for page in range(address // PAGE_SIZE, (address + size - 1) // PAGE_SIZE + 1):
            if page not in self.pages:
                break
            data += bytes(self.pages[page])
        return data[: size if data else 0]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def registers(rip: int, cpl: int = 3) -> RegisterSet:
    return RegisterSet(0, {"rip": rip, "rsp": 0, "rbp": 0}, 0x33, cpl, False, 64, cr3=0x1234005)


def saved_maps(abi: str, name: str, clock: Clock) -> tuple[ProcessMaps, SavedGuest, int]:
    workload = DATA[abi]["workloads"][name]
    guest = SavedGuest(workload["kernel_reads"] + workload["user_reads"])
    return ProcessMaps(gdb_layout(abi), guest, clock), guest, workload["task"]  # type: ignore[arg-type]


def test_maps_are_kept_per_address_space_and_read_again_when_their_code_misses() -> None:
    """A user PC outside every mapping the last walk found walks again at once (a new
    process maps its libraries after its first walk), up to PROMPT_WALKS walks a
    second, but not for a page a walk found nothing at already; a PC inside, or none
    (kernel mode), does only in the address space's first second (its process may
    still be mapping its files), LOADING_WALKS walks at most, not counted in PROMPT_WALKS."""
    clock = Clock()
    abi, name = CAUGHT[0]
    maps, guest, task = saved_maps(abi, name, clock)
    expected = proc_and_readelf(abi, name)

    def ask(rip: int, cpl: int = 3) -> tuple[FileMapping, ...] | None:
        return asyncio.run(maps.maps_for(registers(rip, cpl), task))

    found = ask(0x401000)
    assert [[m.start, m.end, m.offset, m.path, (m.build_id or b"").hex()] for m in found or ()] == (
        expected
    )
    assert (maps.stats.walks, maps.stats.reads) == (1, guest.reads)
    for walks in range(2, LOADING_WALKS + 2):
        assert ask(0x401000) == found and maps.stats.walks == walks  # new: walked again
    assert ask(0x401000) == found and maps.stats.walks == LOADING_WALKS + 1  # no more
    assert ask(0x10) == found and maps.stats.walks == LOADING_WALKS + 2  # outside: a budget apart
    clock.now += REREAD_INTERVAL_S
    base = LOADING_WALKS + 2
    assert ask(0x401000) == found and maps.stats.walks == base  # inside: nothing new
    assert ask(0x10, cpl=0) == found and maps.stats.walks == base  # kernel mode: no user PC
    assert ask(0x10) == found and maps.stats.walks == base + 1  # outside: at once
    assert ask(0x10) == found and maps.stats.walks == base + 1  # that page missed already
    for walks in range(2, PROMPT_WALKS + 1):
        assert ask(walks * PAGE_SIZE) == found and maps.stats.walks == base + walks  # a new page
    assert ask(0x7F0000) == found and maps.stats.walks == base + PROMPT_WALKS  # none this second
    clock.now += REREAD_INTERVAL_S / 2
    assert ask(0x7F0000) == found and maps.stats.walks == base + PROMPT_WALKS
    clock.now += REREAD_INTERVAL_S / 2
    assert ask(0x10) == found and maps.stats.walks == base + PROMPT_WALKS + 1  # a second on
    assert ask(0x7F0000) == found and maps.stats.walks == base + PROMPT_WALKS + 2  # a new second's
    assert maps.stats.failed == 0


def test_a_caller_outside_the_known_code_walks_again_too() -> None:
    """A leaf in the program with a caller where no known mapping is (a library the
    first walk came too early for): the unwind stopped there, so that walks again."""
    abi, name = CAUGHT[0]
    maps, _, task = saved_maps(abi, name, Clock())
    found = asyncio.run(maps.maps_for(registers(0x401000), task, (0x401000, 0x401010)))
    assert found and maps.stats.walks == 1
    assert asyncio.run(maps.maps_for(registers(0x401000), task, (0x401000, 0x10))) == found
    assert maps.stats.walks == 2


def test_a_process_past_exit_mm_keeps_the_maps_it_had() -> None:
    """Once do_exit dropped the mm (task->mm zero), a walk finds no maps: the samples
    of its exit still have the user frames of the code it ran, named by the last walk."""
    clock = Clock()
    abi, name = CAUGHT[0]
    maps, guest, task = saved_maps(abi, name, clock)
    found = asyncio.run(maps.maps_for(registers(0x401000), task))
    assert found
    mm = task + gdb_layout(abi).task_mm
    guest.pages[mm // PAGE_SIZE][mm % PAGE_SIZE : mm % PAGE_SIZE + 8] = bytes(8)
    clock.now += REREAD_INTERVAL_S
    assert asyncio.run(maps.maps_for(registers(0x10), task)) == found
    assert maps.stats.walks == 2


def test_two_processes_on_one_cr3_are_kept_apart() -> None:
    """A page directory freed by one process is soon another's CR3: with its tgid, the
    other process gets a walk of its own."""
    abi, name = CAUGHT[0]
    clock = Clock()
    maps, _, task = saved_maps(abi, name, clock)
    first = asyncio.run(maps.maps_for(registers(0x401000), task, process=1))
    clock.now += REREAD_INTERVAL_S  # no longer new (_loading)
    assert asyncio.run(maps.maps_for(registers(0x401000), task, process=1)) == first
    assert maps.stats.walks == 1
    assert asyncio.run(maps.maps_for(registers(0x401000), task, process=2)) == first
    assert maps.stats.walks == 2


def test_a_walk_that_cannot_read_the_kernel_fails_and_is_counted() -> None:
    clock = Clock()
    abi, name = CAUGHT[0]
    maps = ProcessMaps(gdb_layout(abi), SavedGuest([]), clock)  # type: ignore[arg-type]
    task = DATA[abi]["workloads"][name]["task"]
    assert asyncio.run(maps.maps_for(registers(0x401000, cpl=0), task)) is None
    assert asyncio.run(maps.maps_for(registers(0x401000, cpl=0), task)) is None
    assert (maps.stats.walks, maps.stats.failed) == (WALK_TRIES, WALK_TRIES)  # at once
    clock.now += REREAD_INTERVAL_S  # a kernel-mode PC: tried again only a second on
    assert asyncio.run(maps.maps_for(registers(0x401000, cpl=0), task)) is None
    assert (maps.stats.walks, maps.stats.failed) == (2 * WALK_TRIES, 2 * WALK_TRIES)


def test_no_process_maps_without_a_linux_kernel(symbols_elf: Path) -> None:
    types = ElfTypes(symbols_elf)
    guest = SavedGuest([])
    assert ProcessMaps.of_guest(None, LinuxAdapter(), guest) is None  # type: ignore[arg-type]
    assert ProcessMaps.of_guest(types, GenericAdapter(), guest) is None  # type: ignore[arg-type]
    assert ProcessMaps.of_guest(types, LinuxAdapter(), guest) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(("abi", "name"), CAUGHT)
def test_a_task_whose_mm_is_not_the_loaded_one_gets_no_files(abi: str, name: str) -> None:
    """Mid context switch (CR3 already the next task's, `current` still this one) the
    files' first pages would be read in the other process: with its mm's pgd said not
    loaded, the walk reads no build-id and gives no file; said loaded, the files."""
    workload = DATA[abi]["workloads"][name]
    layout, task = gdb_layout(abi), workload["task"]
    asked: list[int] = []

    def check(answer: bool) -> Any:
        async def loaded(reader: object, pgd: int) -> bool:
            asked.append(pgd)
            return answer

        return loaded

    guest = SavedGuest(workload["kernel_reads"] + workload["user_reads"])
    switching = asyncio.run(read_maps(guest, 0, layout, task, check(False)))  # type: ignore[arg-type]
    assert switching is not None and switching.switching and switching.files == ()
    assert len(asked) == 1 and asked[0] >= KERNEL_HALF and asked[0] % PAGE_SIZE == 0
    loaded = asyncio.run(read_maps(guest, 0, layout, task, check(True)))  # type: ignore[arg-type]
    assert loaded is not None and not loaded.switching
    files = [[m.start, m.end, m.offset, m.path] for m in loaded.files]
    assert files == [expected[:4] for expected in proc_and_readelf(abi, name)]


class NeverLoaded(ProcessMaps):
    """Maps whose check says no task's mm is the one CR3 holds (every vCPU seen mid
    context switch, as nonblocking samples often are: the task read after the registers)."""

    def _loaded_check(self, registers: RegisterSet) -> Any:
        async def loaded(reader: object, pgd: int) -> bool:
            return False

        return loaded


def test_a_task_seen_mid_context_switch_is_walked_again_at_most_once_a_second() -> None:
    clock = Clock()
    abi, name = CAUGHT[0]
    workload = DATA[abi]["workloads"][name]
    guest = SavedGuest(workload["kernel_reads"] + workload["user_reads"])
    maps = NeverLoaded(gdb_layout(abi), guest, clock)  # type: ignore[arg-type]
    for _ in range(3):
        assert asyncio.run(maps.maps_for(registers(0x401000), workload["task"])) == ()
    assert (maps.stats.walks, maps.stats.switching) == (1, 1)
    clock.now += REREAD_INTERVAL_S
    assert asyncio.run(maps.maps_for(registers(0x401000), workload["task"])) == ()
    assert (maps.stats.walks, maps.stats.switching) == (2, 2)


def test_a_file_read_that_found_nothing_is_tried_again_in_another_address_space_only() -> None:
    """The workload's files as its maps give them, over a memory where nothing can be
    read (a process exiting): the same address space is not asked again; another one
    is, up to UserFiles' tries."""
    abi, name = CAUGHT[0]
    walked, _, task = saved_maps(abi, name, Clock())
    found = asyncio.run(walked.maps_for(registers(0x401000), task))
    assert found
    maps = ProcessMaps(gdb_layout(abi), SavedGuest([]), Clock())  # type: ignore[arg-type]
    files = UserFiles()

    def copies(cr3: int) -> bool:
        here = replace(registers(0x401000), cr3=cr3)
        return asyncio.run(maps.read_guest_copies(here, found, files))

    assert copies(0x1234005) and maps.stats.images == maps.stats.images_failed == len(found)
    assert not copies(0x1234005) and maps.stats.images == len(found)
    assert copies(0x5678000) and maps.stats.images == 2 * len(found)
    for cr3 in range(GUEST_COPY_TRIES):
        copies(0x9000000 + cr3 * PAGE_SIZE)
    assert maps.stats.images == GUEST_COPY_TRIES * len(found)


def poke(guest: SavedGuest, address: int, value: int, size: int = 8) -> None:
    """Write `value` into the saved guest (a page nothing was read from is made)."""
    for at, byte in enumerate(value.to_bytes(size, "little")):
        page = guest.pages.setdefault((address + at) // PAGE_SIZE, bytearray(PAGE_SIZE))
        page[(address + at) % PAGE_SIZE] = byte


def peek(guest: SavedGuest, address: int) -> int:
    page = guest.pages[address // PAGE_SIZE]
    return int.from_bytes(page[address % PAGE_SIZE : address % PAGE_SIZE + 8], "little")


def exec_started(guest: SavedGuest, layout: MapsLayout, task: int) -> None:
    """The task's mm emptied, as an exec's new mm is before the kernel maps the
    program into it (exec_mmap, then load_elf_binary's mappings)."""
    poke(guest, peek(guest, task + layout.task_mm) + layout.mm_root, 0)


def at(rip: int, cr3: int) -> RegisterSet:
    return replace(registers(rip), cr3=cr3)


def holding(found: tuple[FileMapping, ...] | None, pc: int) -> list[str]:
    return [mapping.path for mapping in found or () if mapping.start <= pc < mapping.end]


def test_a_sample_inside_execve_names_its_pc_from_the_maps_before_the_exec() -> None:
    """Inside execve, once the new mm is loaded (another CR3) and before the new program
    is mapped, the user registers are still those of the program that called execve:
    its pc lies in the process's maps before the exec, which name it, as perf's
    history of a process's mappings does; a pc in none of them stays unnamed."""
    abi, name = CAUGHT[0]
    maps, guest, task = saved_maps(abi, name, Clock())
    before = asyncio.run(maps.maps_for(at(0x401000, 0x1000), task, process=7))
    program = holding(before, 0x401000)
    assert program and maps.stats.from_history == 0
    exec_started(guest, gdb_layout(abi), task)
    found = asyncio.run(maps.maps_for(at(0x401000, 0x2000), task, process=7))
    assert holding(found, 0x401000) == program and maps.stats.from_history == 1
    assert asyncio.run(maps.maps_for(at(0x10, 0x2000), task, process=7)) == ()
    other = asyncio.run(maps.maps_for(at(0x401000, 0x3000), task, process=8))
    assert other == ()  # another process: none of its maps were ever seen


def parent_and_child() -> tuple[ProcessMaps, SavedGuest, int, int]:
    """Maps over the first two workloads' saved reads, the second's task made the child
    of the first's (its real_parent), whose process id is made 41."""
    abi, layout = CAUGHT[0][0], gdb_layout(CAUGHT[0][0])
    first, second = (DATA[abi]["workloads"][name] for _, name in CAUGHT[:2])
    guest = SavedGuest(first["kernel_reads"] + first["user_reads"] + second["kernel_reads"])
    maps = ProcessMaps(layout, guest, Clock())  # type: ignore[arg-type]
    parent, child = first["task"], second["task"]
    assert layout.task_parent is not None and layout.task_tgid is not None
    poke(guest, parent + layout.task_tgid, 41, 4)
    poke(guest, child + layout.task_parent, parent)
    return maps, guest, parent, child


def test_a_forked_process_starts_with_its_parent_s_maps() -> None:
    """A process first seen inside its exec, before its new program is mapped: its
    registers are its parent's code (fork copied the parent's mm), which the parent's
    maps name; the parent is the task's real_parent, its tgid read from the guest."""
    maps, guest, parent, child = parent_and_child()
    layout = gdb_layout(CAUGHT[0][0])
    walked = asyncio.run(maps.maps_for(at(0x401000, 0x1000), parent, process=41))
    program = holding(walked, 0x401000)
    exec_started(guest, layout, child)
    found = asyncio.run(maps.maps_for(at(0x401000, 0x2000), child, process=42))
    assert program and holding(found, 0x401000) == program
    assert layout.task_parent is not None
    poke(guest, child + layout.task_parent, 0)  # pid 42 again: another process, no parent
    assert asyncio.run(maps.maps_for(at(0x401000, 0x3000), child, process=42)) == ()


def test_a_process_whose_parent_no_walk_saw_gets_its_parent_s_maps_read() -> None:
    """The child seen first inside its exec, its parent never sampled (a shell waiting
    for it, or the recording just begun): the parent's VMAs are walked from the child's
    vCPU (kernel memory), its build-ids read from the page cache only (none here), never
    through the child's page tables, which map the new program."""
    maps, guest, _, child = parent_and_child()
    abi, layout = CAUGHT[0][0], gdb_layout(CAUGHT[0][0])
    exec_started(guest, layout, child)
    found = asyncio.run(maps.maps_for(at(0x401000, 0x2000), child, process=42))
    expected = [m for m in proc_and_readelf(abi, CAUGHT[0][1]) if m[0] <= 0x401000 < m[1]]
    assert [[m.start, m.end, m.offset, m.path, m.build_id] for m in found or ()] == [
        [*expected[0][:4], None]
    ]
    assert maps.stats.walks == 2


@pytest.mark.parametrize("users", [0, 1])
def test_an_exiting_task_s_mm_is_walked_while_exit_mmap_tears_it_down(users: int) -> None:
    """Past exit_mm, task->mm is zero but the task still runs on its mm (active_mm): with
    no users left (exit_mmap is unmapping it) its VMAs name the user frame of the exit
    in a process never walked before; with users, it is another process's mm that the
    task borrowed when it was switched in again, and nothing is found."""
    abi, name = CAUGHT[0]
    layout = gdb_layout(abi)
    maps, guest, task = saved_maps(abi, name, Clock())
    assert layout.task_active_mm is not None and layout.mm_users is not None
    mm = peek(guest, task + layout.task_mm)
    poke(guest, task + layout.task_mm, 0)
    poke(guest, task + layout.task_active_mm, mm)
    poke(guest, mm + layout.mm_users, users, 4)
    found = asyncio.run(maps.maps_for(registers(0x10, cpl=0), task, (0x401000,), process=7))
    expected = [m[3] for m in proc_and_readelf(abi, name) if m[0] <= 0x401000 < m[1]]
    assert holding(found, 0x401000) == (expected if users == 0 else [])


class LoadedOnce(ProcessMaps):
    """Maps whose first walk finds the task's mm loaded, and every later one not (the
    task seen again mid context switch, CR3 already the next task's)."""

    def _loaded_check(self, registers: RegisterSet) -> Any:
        async def loaded(reader: object, pgd: int) -> bool:
            self.loaded_walks = getattr(self, "loaded_walks", 0) + 1
            return bool(self.loaded_walks == 1)

        return loaded


def test_mid_context_switch_the_first_user_pc_is_named_from_the_history() -> None:
    """With another process's CR3 loaded nothing is read in it, and the user stack
    past the first frame would be the other process's memory: the first user pc (from
    the task's own pt_regs) is named from the process's history, no other."""
    abi, name = CAUGHT[0]
    workload = DATA[abi]["workloads"][name]
    guest = SavedGuest(workload["kernel_reads"] + workload["user_reads"])
    maps = LoadedOnce(gdb_layout(abi), guest, Clock())  # type: ignore[arg-type]
    task = workload["task"]
    program = holding(asyncio.run(maps.maps_for(at(0x401000, 0x1000), task, process=7)), 0x401000)
    switching = at(0x10, 0x2000)
    found = asyncio.run(maps.maps_for(switching, task, (0x401000, 0x10), process=7))
    assert program and holding(found, 0x401000) == program and len(found or ()) == 1
    assert maps.stats.switching == 1
    assert asyncio.run(maps.maps_for(switching, task, (0x10, 0x401000), process=7)) == ()


def test_a_walk_again_reads_no_build_id_it_read_before() -> None:
    """A new address space is walked at each sample of its first second: a mapping of
    the same open file (`struct file *`) at the same start keeps the build-id read
    before, and its pages are not read again (the VM is paused meanwhile)."""
    abi, name = CAUGHT[0]
    maps, guest, task = saved_maps(abi, name, Clock())
    first = asyncio.run(maps.maps_for(registers(0x401000), task))
    reads = guest.reads
    assert first and all(mapping.build_id for mapping in first)
    assert asyncio.run(maps.maps_for(registers(0x401000), task)) == first
    assert maps.stats.walks == 2 and 0 < guest.reads - reads < reads


def test_a_parent_with_no_maps_is_a_walk_that_did_not_fail() -> None:
    """A process forked by one with no mm (a kernel thread's usermode helper): the
    parent's walk finds nothing, which the summary must not count as a failed walk."""
    maps, guest, parent, child = parent_and_child()
    layout = gdb_layout(CAUGHT[0][0])
    poke(guest, parent + layout.task_mm, 0)
    asyncio.run(maps.maps_for(at(0x401000, 0x2000), child, process=42))
    assert (maps.stats.walks, maps.stats.failed) == (2, 0)
