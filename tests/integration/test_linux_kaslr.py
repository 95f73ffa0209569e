"""A stock Linux guest with KASLR on: qmpprof finds the kernel's slide from the IDT, names
kernel frames with the unrelocated debug vmlinux, names the task on each vCPU, and a
capture replays with it.

The oracles are the guest's own words on its console: examples/linux's init prints where
/proc/kallsyms puts `asm_exc_divide_error` (nm says where the vmlinux links it) and the
pid of each process it starts under the name it gives it; and Linux's own fact that
kthreadd, pid 2, is its first kernel thread (`kthreadd_task` points at it)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.registry import choose_adapter
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow, Process
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.elf_tools import nm_functions, nm_names_at
from tests.integration.conftest import run_cached
from tests.linux_vm import (
    LinuxGuest,
    kallsyms_slide,
    kernel_abis,
    nm_symbols,
    running_linux,
    started_pids,
)
from tests.unit.conftest import build_elf


@pytest.fixture(scope="module", params=kernel_abis())
def kaslr_guest(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LinuxGuest]:
    """The guest booted with KASLR on, once more when KASLR left the kernel at its link
    address (a slide of 0 is one of its few hundred choices: seen once, on 5.10), which
    would leave nothing to test; a second such boot fails the test."""
    for attempt in range(2):
        workdir = tmp_path_factory.mktemp("kaslr")
        with running_linux(workdir, "--smp", "2", abi=request.param) as guest:
            if attempt or guest_slide(guest) != 0:
                yield guest
                return


def guest_slide(guest: LinuxGuest) -> int:
    """The handler's address in the guest's /proc/kallsyms minus nm's in the vmlinux."""
    slide = kallsyms_slide(Path(guest.serial).read_text(), guest.kernel)
    assert slide is not None, "the guest's init did not print its kallsyms line"
    return slide


def nm_address(kernel: Path, name: str) -> int:
    nm = subprocess.run(["nm", str(kernel)], capture_output=True, text=True, check=True)
    found = re.search(rf"^([0-9a-f]+) \w {name}$", nm.stdout, re.MULTILINE)
    assert found is not None, name
    return int(found.group(1), 16)


def test_the_guest_runs_its_kernel_away_from_its_link_address(kaslr_guest: LinuxGuest) -> None:
    assert guest_slide(kaslr_guest) != 0, "KASLR did not move the kernel: nothing is tested"


def test_record_names_kernel_frames_and_report_replays_them(
    kaslr_guest: LinuxGuest, tmp_path: Path
) -> None:
    """A recording long enough for the kernel check (20 kernel-mode samples) passes it,
    its capture holds the slide, and `report` gives the same folded profile."""
    folded, capture = tmp_path / "live.folded", tmp_path / "run.qmpcap"
    target = ["--qmp-socket", kaslr_guest.qmp, "--kernel", str(kaslr_guest.kernel)]
    done = run_cached(
        "record", *target, "--duration", "3", "--rate", "50", "-o", str(folded), "-o", str(capture)
    )
    assert done.returncode == 0, done.stderr
    kernel_frames = [line for line in folded.read_text().splitlines() if "do_syscall_64" in line]
    assert kernel_frames, "no system call named in a guest that makes them all the time"
    replayed = tmp_path / "replayed.folded"
    again = run_cached("report", str(capture), "-o", str(replayed))
    assert again.returncode == 0, again.stderr
    assert replayed.read_text() == folded.read_text()
    assert f"kernel: vmlinux, KASLR slide {guest_slide(kaslr_guest):#x}" in done.stdout


def started(guest: LinuxGuest) -> dict[str, int]:
    """Each process init started, by name: its pid, as init printed it."""
    return started_pids(Path(guest.serial).read_text())


def test_samples_are_labelled_with_the_task_the_guest_says_it_started(
    kaslr_guest: LinuxGuest, tmp_path: Path
) -> None:
    """crunch runs in user space all the time and sysloop in system calls: both are
    sampled on a 2-vCPU guest, under the pid init gave them."""
    folded = tmp_path / "tasks.folded"
    target = ["--qmp-socket", kaslr_guest.qmp, "--kernel", str(kaslr_guest.kernel)]
    done = run_cached("record", *target, "--duration", "2", "--rate", "50", "-o", str(folded))
    assert done.returncode == 0, done.stderr
    roots = {line.split(";", 1)[0] for line in folded.read_text().splitlines()}
    pids = started(kaslr_guest)
    assert {"crunch", "sysloop"} <= pids.keys(), "init did not say what it started"
    for name in ("crunch", "sysloop"):
        assert f"{name} ({pids[name]})" in roots, sorted(roots)


def test_dump_json_names_the_kernel_leaf_of_kernel_mode_vcpus(kaslr_guest: LinuxGuest) -> None:
    """A vCPU in the kernel (or idle in it) has its leaf named as nm names its pc less the
    slide the guest's own /proc/kallsyms gives. Dumps are taken until one has such a
    vCPU (sysloop lives in system calls; a vCPU with nothing to run idles in the kernel)."""
    target = ["--qmp-socket", kaslr_guest.qmp, "--kernel", str(kaslr_guest.kernel)]
    functions, slide = nm_functions(kaslr_guest.kernel), guest_slide(kaslr_guest)
    symbols = nm_symbols(kaslr_guest.kernel)
    checked = 0
    for _ in range(20):
        done = run_cached("dump", "--json", *target)
        assert done.returncode == 0, done.stderr
        for vcpu in json.loads(done.stdout)["vcpus"]:
            # Inlined calls are listed above their caller at the same address: the last
            # frame there is the function that holds the pc, the one nm sizes.
            leaf = [f for f in vcpu["frames"] if f["address"] == vcpu["frames"][0]["address"]][-1]
            truth = nm_names_at(functions, int(vcpu["pc"], 16) - slide)
            if vcpu["mode"] == "user" or leaf["module"] != "vmlinux" or not truth:
                continue  # user mode, a module's code, or code nm gives no size to
            linked = int(vcpu["pc"], 16) - slide
            start = min(at for at, size, name in functions if name in truth and at <= linked)
            # An assembly label nm lists inside the function, below the pc, names it too.
            label = any(start <= at <= linked for at in symbols.get(leaf["function"], ()))
            assert leaf["function"] in truth or label, (vcpu["pc"], leaf, truth)
            checked += 1
        if checked:
            return
    raise AssertionError("20 dumps and no vCPU in the vmlinux's sized functions")


def test_dump_json_gives_each_process_its_tgid_and_thread(kaslr_guest: LinuxGuest) -> None:
    """Every vCPU runs a workload, a kernel thread or the idle task: a process carries
    the pid init gave it as its process id; a single-threaded one has it as its thread's
    id too, `pinned`'s second thread an id of its own, after its process's."""
    target = ["--qmp-socket", kaslr_guest.qmp, "--kernel", str(kaslr_guest.kernel)]
    done = run_cached("dump", "--json", *target)
    assert done.returncode == 0, done.stderr
    pids = started(kaslr_guest)
    for vcpu in json.loads(done.stdout)["vcpus"]:
        process = vcpu["process"]
        assert process is not None
        if process["pid"] is not None:
            assert pids[process["name"]] == process["pid"], process
            if process["name"] == "pinned":  # its second thread has an id of its own
                assert process["tid"] >= process["pid"], process
            else:
                assert process["tid"] == process["pid"], process
        else:
            assert process["name"].startswith("["), process


async def read_kthreadd(guest: LinuxGuest, adapter: LinuxAdapter, slide: int) -> Process:
    """kthreadd's label, read from the running guest through *kthreadd_task."""
    session = await QmpSession.connect(guest.qmp)
    memory = await open_memory(session, "hmp")
    try:
        memory.set_registers(parse_all(await session.hmp("info registers -a")))
        pointer = nm_address(guest.kernel, "kthreadd_task") + slide
        task = int.from_bytes(await memory.read_window(0, pointer, 8), "little")
        span = await memory.read_window(0, task, 2 * 4096)
    finally:
        await memory.close()
        await session.close()
    assert adapter.task is not None
    return adapter.task.read(WindowMemory([MemoryWindow(task, span)]), task)


def test_a_kernel_thread_is_labelled_with_its_name_in_brackets(kaslr_guest: LinuxGuest) -> None:
    adapter = choose_adapter(kaslr_guest.kernel)
    assert isinstance(adapter, LinuxAdapter)
    kthreadd = asyncio.run(read_kthreadd(kaslr_guest, adapter, guest_slide(kaslr_guest)))
    assert kthreadd == Process(None, "[kthreadd]", 2)


def test_a_kernel_that_is_not_the_guests_is_a_one_line_error(
    kaslr_guest: LinuxGuest, tmp_path: Path
) -> None:
    """A Linux-shaped ELF (linux_banner, init_task) that is not the guest's kernel:
    no KASLR slide moves it onto the guest's divide-error handler."""
    probe = build_elf("linux_probe.c", tmp_path, "-g", "-O0")
    target = ["--qmp-socket", kaslr_guest.qmp, "--kernel", str(probe)]
    for command in (["dump"], ["record", "-o", str(tmp_path / "never.folded")]):
        done = run_cached(*command, *target)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "does not match the guest" in lines[0], done.stderr
        assert "asm_exc_divide_error" in lines[0]
