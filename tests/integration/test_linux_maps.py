"""Each process's memory map, read by qmpprof from a booted Linux guest's kernel.

The oracle is the guest's own word: examples/linux's init prints each workload's
/proc/PID/maps on the console, and readelf gives the build-id of each workload's file
and of the vDSO (the image the vmlinux embeds, which the kernel maps into each process:
named and unwound as `nm -D` and its CFI say, in a guest that reads the clock there).
Every workload's task is found from outside by walking init_task's task list, and its
executable file mappings read from there are those /proc printed (a process whose
printed maps hold no file mapping is skipped, and the test says so). ProcessMaps, the
capture's reader, is asked while each busy workload runs in user mode on a vCPU (its
build-id is in that process's memory, read through that vCPU's page tables)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.maps import maps_layout
from qmpprof.model import FileMapping, RegisterSet
from qmpprof.record.page_reader import UNREADABLE, PageReader
from qmpprof.record.process_maps import ProcessMaps, read_maps
from tests.elf_tools import build_id_of, nm_functions, nm_names_at
from tests.integration.conftest import run_cached
from tests.linux_tasks import TaskList, catch_running, proc_maps
from tests.linux_vm import (
    ROOT,
    LinuxGuest,
    kernel_abis,
    running_linux,
    started_pids,
    vdso_image,
)

BUILD = ROOT / "examples" / "linux" / "build"
BUSY = ("crunch", "crunchnofp", "sysloop", "pinned")


@pytest.fixture(scope="module", params=kernel_abis())
def maps_guest(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LinuxGuest]:
    with running_linux(tmp_path_factory.mktemp("maps"), abi=request.param) as guest:
        yield guest


def without_build_ids(maps: tuple[FileMapping, ...]) -> list[tuple[int, int, int, str]]:
    return [(m.start, m.end, m.offset, m.path) for m in maps]


def test_every_workloads_maps_are_those_proc_printed(maps_guest: LinuxGuest) -> None:
    serial = Path(maps_guest.serial).read_text()
    pids, printed = started_pids(serial), proc_maps(serial)
    with_files = {name: pid for name, pid in pids.items() if printed.get(pid)}
    skipped = sorted(set(pids) - set(with_files))
    assert len(with_files) >= 4, f"too few workloads with file mappings (skipped: {skipped})"
    options = TargetOptions(maps_guest.qmp, maps_guest.kernel)
    analyzer = build_analyzer(options)
    layout, tasks = maps_layout(ElfTypes(maps_guest.kernel)), TaskList.of(maps_guest.kernel)
    assert layout is not None

    async def read_all() -> dict[str, list[tuple[int, int, int, str]]]:
        async with connected(options, analyzer) as (session, memory, _):
            await session.execute("stop")
            try:
                reader = PageReader(memory, 0)
                found = await reader.run(tasks.walk(analyzer.kernel_bias))
                assert found is not UNREADABLE
                read = {}
                for name, pid in with_files.items():
                    done = await read_maps(memory, 0, layout, found[pid])
                    assert done is not None, f"the walk of {name}'s maps failed"
                    read[name] = without_build_ids(done.files)
                kthreadd = await read_maps(memory, 0, layout, found[2])  # pid 2: no mm
                assert kthreadd is not None and not kthreadd.has_mm and kthreadd.files == ()
                return read
            finally:
                await session.execute("cont")

    read = asyncio.run(read_all())
    assert read == {name: without_build_ids(printed[pid]) for name, pid in with_files.items()}


def test_process_maps_gives_a_running_workloads_maps_and_build_id(
    maps_guest: LinuxGuest,
) -> None:
    serial = Path(maps_guest.serial).read_text()
    pids, printed = started_pids(serial), proc_maps(serial)
    busy = {pids[name]: name for name in BUSY if printed.get(pids[name])}
    options = TargetOptions(maps_guest.qmp, maps_guest.kernel)
    analyzer = build_analyzer(options)

    async def catch() -> dict[int, tuple[FileMapping, ...] | None]:
        async with connected(options, analyzer) as (session, memory, _):
            maps = ProcessMaps.of_guest(analyzer.kernel_types, analyzer.adapter, memory)
            assert maps is not None and isinstance(analyzer.adapter, LinuxAdapter)

            async def visit(registers: RegisterSet, task: int) -> tuple[FileMapping, ...] | None:
                return await maps.maps_for(registers, task)

            found = await catch_running(session, memory, analyzer.adapter, set(busy), visit)
            assert maps.stats.failed == 0
            return found

    found = asyncio.run(catch())
    assert sorted(busy[pid] for pid in found) == sorted(busy.values())
    vdso = Path(maps_guest.serial).parent / "vdso.so"
    vdso.write_bytes(vdso_image(maps_guest.kernel))
    for pid, maps in found.items():
        name = busy[pid]
        expected = [
            FileMapping(m.start, m.end, m.offset, m.path, build_id_of(BUILD / name))
            if m.path != "[vdso]"
            else FileMapping(m.start, m.end, m.offset, m.path, build_id_of(vdso))
            for m in printed[pid]
        ]
        assert list(maps or ()) == expected, name


def test_the_vdso_is_named_as_its_image_says_and_unwound_through(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """timeloop reads the clock in the vDSO (the TSC clocksource: no system call): with no
    file of the guest's on this host, its vDSO frames are named as `nm -D` names the
    kernel's image at their offset, and the stack goes on through glibc's clock_gettime
    to main."""
    boot = ("--workloads", "timeloop", "--append", "clocksource=tsc tsc=reliable")
    workdir = tmp_path_factory.mktemp("vdso")
    with running_linux(workdir, *boot) as guest:
        image = workdir / "vdso.so"
        image.write_bytes(vdso_image(guest.kernel))
        vdso, program = nm_functions(image, "-D"), nm_functions(BUILD / "timeloop")
        serial = Path(guest.serial).read_text()
        pid = started_pids(serial)["timeloop"]
        base = next(m.start for m in proc_maps(serial)[pid] if m.path == "[vdso]")
        seen = 0
        for _ in range(40):  # a bound: timeloop is in the vDSO most of the time
            done = run_cached("dump", "--json", "--qmp-socket", guest.qmp)
            assert done.returncode == 0, done.stderr
            for cpu in json.loads(done.stdout)["vcpus"]:
                seen += vdso_frames_checked(cpu, base, vdso, program)
            if seen >= 3:
                break
        assert seen >= 3, "timeloop was seen in the vDSO fewer than three times"


def vdso_frames_checked(
    cpu: dict[str, Any],
    base: int,
    vdso: list[tuple[int, int, str]],
    program: list[tuple[int, int, str]],
) -> bool:
    """Whether this vCPU's stack has vDSO frames; each named as nm names its offset (none
    where the image's dynamic symbols name none: make test 2026-11-28 stopped a vCPU in
    __arch_get_hw_counter.constprop.0, a local function the stripped image has no symbol
    for), and the frames below them timeloop's own, named as nm names them, down to main."""
    frames = [f for f in cpu["frames"] if int(f["address"], 16) < 1 << 47 and not f["inlined"]]
    inside = [n for n, f in enumerate(frames) if f["module"] == "[vdso]"]
    if not inside:
        return False
    for number in inside:
        offset = int(frames[number]["address"], 16) - base
        truth = nm_names_at(vdso, offset) | (nm_names_at(vdso, offset - 1) if number else set())
        named = frames[number]["function"]
        assert (named in truth) if truth else named is None, frames[number]
    below = frames[inside[-1] + 1 :]
    assert below and all(f["module"] == "timeloop" for f in below), frames
    assert below[0]["function"] == "clock_gettime", frames
    for frame in below:
        address = int(frame["address"], 16)
        assert frame["function"] in nm_names_at(program, address - 1), frame
    assert "main" in [f["function"] for f in below], frames
    return True
