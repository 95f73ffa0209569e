"""Record what tests/unit/test_linux_maps.py reads: `python -m
tests.unit.data.linux.record_maps` (from the repository root, after `make linux-guest`;
GDB is needed).

For each kernel the tests boot (Debian 12's 6.1, backports' 6.12, bullseye's 5.10; or
those named as arguments: `python -m tests.unit.data.linux.record_maps 5.10.0-46-amd64`
records that one and keeps the others' records), it boots the Linux
example guest (KASLR on), samples it until each CPU-bound workload runs in user mode on
a vCPU, reads that process's memory map there as `record` would (record/process_maps.py,
memory backend `hmp`) and saves to maps.json:

- GDB's offsets of every member the walk reads, and its ptype of the maple nodes (a
  kernel whose VMAs are a list, 5.10: mm_struct.mmap and vm_area_struct.vm_next);
- readelf's build-id of the vDSO the vmlinux embeds (each workload maps it);
- for each workload caught: its pid, the bytes each read of the walk and of the
  build-id reader returned (exactly what they asked for, not whole pages), and the task;
- the lines init printed from /proc/PID/maps (the oracle) and each workload's build-id
  as readelf prints it from examples/linux/build.

Re-record when the kernel, QEMU or the workloads change, and read the diff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.errors import MemoryFault
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.maps import BuildIdRead, MapsLayout, MapsWalk, maps_layout
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import MemoryWindow, RegisterSet
from qmpprof.record.process_maps import read_maps
from qmpprof.target.memory import MemoryBackend
from tests.elf_tools import readelf_build_id
from tests.linux_tasks import catch_running
from tests.linux_vm import ROOT, kernel_abis, running_linux, started_pids, vdso_image

OUT = Path(__file__).with_name("maps.json")
BUILD = ROOT / "examples" / "linux" / "build"
#: The workloads that run most of the time (sleeper dozes: rarely caught running).
BUSY = ("crunch", "crunchnofp", "sysloop", "pinned")
#: GDB expressions for MapsLayout's fields, in its order.
GDB_LAYOUT = (
    "&((struct task_struct *)0)->mm",
    "&((struct mm_struct *)0)->mm_mt.ma_root",
    "&((struct vm_area_struct *)0)->vm_start",
    "&((struct vm_area_struct *)0)->vm_end",
    "&((struct vm_area_struct *)0)->vm_flags",
    "&((struct vm_area_struct *)0)->vm_pgoff",
    "&((struct vm_area_struct *)0)->vm_file",
    "&((struct file *)0)->f_path.dentry",
    "&((struct dentry *)0)->d_parent",
    "&((struct dentry *)0)->d_name.len",
    "&((struct dentry *)0)->d_name.name",
    "&((struct vm_area_struct *)0)->anon_vma",
    "&((struct mm_struct *)0)->pgd",
)
GDB_PTYPES = ("struct maple_range_64", "struct maple_arange_64")
#: Before 6.1 the VMAs are a list: mm_struct.mmap in mm_mt.ma_root's place, and
#: vm_area_struct.vm_next after the above (MapsLayout's order; null with a maple tree).
GDB_LIST_ROOT = "&((struct mm_struct *)0)->mmap"
GDB_LIST_NEXT = "&((struct vm_area_struct *)0)->vm_next"
#: What names a special mapping (the vDSO's), MapsLayout's last fields.
GDB_SPECIAL = (
    "&((struct vm_area_struct *)0)->vm_private_data",
    "&((struct vm_special_mapping *)0)->name",
)
#: Whose process a task was forked from, and the mm an exiting task runs on:
#: MapsLayout's task_parent, task_tgid, task_active_mm and mm_users.
GDB_TASK = (
    "&((struct task_struct *)0)->real_parent",
    "&((struct task_struct *)0)->tgid",
    "&((struct task_struct *)0)->active_mm",
    "&((struct mm_struct *)0)->mm_users",
)


def gdb_output(vmlinux: Path, commands: list[str]) -> str:
    done = subprocess.run(
        ["gdb", "-batch", "-nx", *commands, str(vmlinux)], capture_output=True, text=True
    )
    return done.stdout


def gdb(vmlinux: Path) -> dict[str, Any]:
    """GDB's MapsLayout offsets and its ptype/o of the maple nodes (none for a kernel
    whose VMAs are a list)."""
    maple = "$1 = " in gdb_output(vmlinux, ["-ex", "print sizeof(struct maple_tree)"])
    expressions = list(GDB_LAYOUT)
    if not maple:
        expressions[1] = GDB_LIST_ROOT
        expressions.append(GDB_LIST_NEXT)
    expressions += GDB_SPECIAL + GDB_TASK
    commands = []
    for expression in expressions:
        commands += ["-ex", f"print (long){expression}"]
    for name in GDB_PTYPES if maple else ():
        commands += ["-ex", f"ptype/o {name}"]
    out = gdb_output(vmlinux, commands)
    offsets: list[int | None] = [int(v) for v in re.findall(r"^\$\d+ = (\d+)$", out, re.MULTILINE)]
    assert len(offsets) == len(expressions), out
    if maple:
        offsets.insert(len(GDB_LAYOUT), None)  # no vm_next
    return {"layout": offsets, "ptype": out[out.index("/* offset") :] if maple else ""}


def readelf_build_id_hex(path: Path) -> str | None:
    found = readelf_build_id(path)
    return found.hex() if found else None


class Recorded:
    """A MemoryReader that keeps each read's address and bytes."""

    def __init__(self, memory: MemoryReader) -> None:
        self.memory = memory
        self.reads: list[list[Any]] = []

    def read(self, address: int, size: int) -> bytes:
        data = self.memory.read(address, size)
        self.reads.append([address, data.hex()])
        return data

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")


class RecordingBackend:
    """A memory backend that keeps every window it read."""

    def __init__(self, memory: MemoryBackend) -> None:
        self.memory = memory
        self.windows: list[MemoryWindow] = []

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        data = await self.memory.read_window(cpu, address, size)
        self.windows.append(MemoryWindow(address, data))
        return data


async def record_walk(
    memory: MemoryBackend, vcpu: int, layout: MapsLayout, task: int
) -> dict[str, Any]:
    """The walk of `task`'s maps on `vcpu`, timed; then replayed over the windows it
    read to keep only the bytes each read asked for."""
    backend = RecordingBackend(memory)
    started_at = time.monotonic()
    done = await read_maps(backend, vcpu, layout, task)  # type: ignore[arg-type]
    elapsed = time.monotonic() - started_at
    assert done is not None, "the walk failed"
    pages = WindowMemory(backend.windows)
    kernel, user = Recorded(pages), Recorded(pages)
    for mapped in MapsWalk(layout, task).advance(kernel):
        if mapped.header is not None:
            with contextlib.suppress(MemoryFault):
                BuildIdRead(mapped.header, mapped.header_size).advance(user)
    return {
        "task": task,
        "page_reads": done.reads,
        "ms": round(1000 * elapsed),
        "found": [
            [m.start, m.end, m.offset, m.path, (m.build_id or b"").hex()] for m in done.files
        ],
        "kernel_reads": kernel.reads,
        "user_reads": user.reads,
    }


async def record_guest(qmp: str, vmlinux: Path, pids: set[int]) -> dict[int, dict[str, Any]]:
    options = TargetOptions(qmp, vmlinux, memory="hmp")
    analyzer = build_analyzer(options)
    layout = maps_layout(ElfTypes(vmlinux))
    assert layout is not None and isinstance(analyzer.adapter, LinuxAdapter)
    async with connected(options, analyzer) as (session, memory, _):
        adapter = analyzer.adapter

        async def visit(registers: RegisterSet, task: int) -> dict[str, Any]:
            return await record_walk(memory, registers.vcpu, layout, task)

        return await catch_running(session, memory, adapter, pids, visit)


def record_kernel(abi: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work, running_linux(Path(work), abi=abi) as guest:
        serial = Path(guest.serial).read_text()
        pids = started_pids(serial)
        busy = {pids[name] for name in BUSY if name in pids}
        caught = asyncio.run(record_guest(guest.qmp, guest.kernel, busy))
        oracle = gdb(guest.kernel)
    names = {pid: name for name, pid in pids.items()}
    return {
        "gdb": oracle,
        "vdso_build_id": vdso_build_id(guest.kernel),
        "workloads": {
            names[pid]: {"pid": pid, **walk, "build_id": readelf_build_id_hex(BUILD / names[pid])}
            for pid, walk in sorted(caught.items())
        },
        "maps_lines": re.findall(r"qmpprof-linux: maps .*", serial),
    }


def vdso_build_id(vmlinux: Path) -> str | None:
    """readelf's build-id of the vDSO image `vmlinux` embeds."""
    with tempfile.NamedTemporaryFile(suffix=".so") as image:
        image.write(vdso_image(vmlinux))
        image.flush()
        return readelf_build_id_hex(Path(image.name))


def record_kernels(out: Path, record: Callable[[str], dict[str, Any]]) -> None:
    """`record` of every kernel the tests boot into `out`, or of those named on the
    command line, the others' records kept (each recording script's main)."""
    chosen = sys.argv[1:] or kernel_abis()
    document = json.loads(out.read_text()) if sys.argv[1:] else {}
    document.update({abi: record(abi) for abi in chosen})
    out.write_text(json.dumps(document, indent=1) + "\n")


def main() -> None:
    record_kernels(OUT, record_kernel)


if __name__ == "__main__":
    main()
