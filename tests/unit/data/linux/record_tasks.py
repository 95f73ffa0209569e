"""Record what tests/unit/test_linux_adapter.py reads: `python -m
tests.unit.data.linux.record_tasks` (from the repository root, after `make
linux-guest`; nm and GDB are needed, GDB reads the 600 MB vmlinux for minutes).

It boots the Linux example guest (Debian 12's 6.1 kernel, KASLR on, 2 vCPUs), waits
until init has started its processes, stops the VM and saves to tasks.json:

- `info registers -a` as QEMU printed it;
- for each vCPU, the guest memory qmpprof's Linux adapter asks for (its
  __per_cpu_offset entry, GDT descriptor, per-CPU area, task_struct), read page by page
  as the capture step would;
- the task_structs of `init_task` (CPU 0's idle task) and `*kthreadd_task` (kthreadd,
  pid 2, the first kernel thread), and the guest's `linux_banner`.

The oracles come from outside qmpprof: nm's symbol addresses, GDB's task_struct
offsets, the vmlinux's banner as pyelftools reads it at nm's address, and what the
guest's init printed (the pids it started, where /proc/kallsyms puts
asm_exc_divide_error: the slide).
Re-record when the kernel or QEMU changes, and read the diff.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from qmpprof.errors import MemoryFault
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.linux.adapter import CPUNODE_OFFSET, LinuxAdapter, TaskLayout
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.linux_vm import running_linux

OUT = Path(__file__).with_name("tasks.json")
SYMBOLS = (
    "__per_cpu_offset",
    "current_task",
    "init_task",
    "kthreadd_task",
    "linux_banner",
    "asm_exc_divide_error",
)
MEMBERS = ("pid", "tgid", "flags", "comm")
PAGE = 4096


def nm_symbols(vmlinux: Path, names: tuple[str, ...] = SYMBOLS) -> dict[str, int]:
    """The addresses nm gives these symbols of `vmlinux`."""
    out = subprocess.run(["nm", str(vmlinux)], capture_output=True, text=True, check=True)
    found = {}
    for line in out.stdout.splitlines():
        address, _, name = line.split(" ", 2)
        if name in names:
            found[name] = int(address, 16)
    return found


def gdb_offsets(vmlinux: Path) -> dict[str, int]:
    commands = [f"print (long)&((struct task_struct *)0)->{m}" for m in MEMBERS]
    commands.append("print sizeof(((struct task_struct *)0)->comm)")
    args = ["gdb", "-batch", "-nx", *(x for c in commands for x in ("-ex", c)), str(vmlinux)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    values = [int(v) for v in re.findall(r"^\$\d+ = (\d+)$", out, re.MULTILINE)]
    return dict(zip((*MEMBERS, "comm_size"), values, strict=True))


def elf_banner(vmlinux: Path, address: int) -> str:
    """The NUL-terminated string at link address `address`, read with pyelftools alone
    (`strings` finds another "Linux version" first: not the banner the kernel prints)."""
    with vmlinux.open("rb") as stream:
        for section in ELFFile(stream).iter_sections():
            start = section["sh_addr"]
            if (
                section["sh_type"] == "SHT_PROGBITS"
                and start <= address < start + section["sh_size"]
            ):
                stream.seek(section["sh_offset"] + address - start)
                return stream.read(512).split(b"\0", 1)[0].decode()
    raise SystemExit("no linux_banner bytes in the vmlinux")


async def record(guest: Any, symbols: dict[str, int], offsets: dict[str, int]) -> dict[str, Any]:
    serial = Path(guest.serial).read_text()
    said = re.search(r"kallsyms ([0-9a-f]+) asm_exc_divide_error", serial)
    assert said is not None
    slide = int(said.group(1), 16) - symbols["asm_exc_divide_error"]
    members = {m: Member(offsets[m], offsets["comm_size"] if m == "comm" else 4) for m in MEMBERS}
    task = TaskLayout.from_members(members)
    adapter = LinuxAdapter(symbols["__per_cpu_offset"], symbols["current_task"], task)
    adapter.relocate(slide)
    session = await QmpSession.connect(guest.qmp)
    memory = await open_memory(session, "hmp")
    await session.execute("stop")
    try:
        text = await session.hmp("info registers -a")
        registers = parse_all(text)
        memory.set_registers(registers)

        async def page_at(vcpu: int, address: int) -> list[Any]:
            base = address - address % PAGE
            data = await memory.read_window(vcpu, base, 2 * PAGE)
            return [base, data.hex()]

        vcpus = []
        for regs in registers:
            windows: list[list[Any]] = []
            for _ in range(8):
                seen = WindowMemory(MemoryWindow(b, bytes.fromhex(d)) for b, d in windows)
                try:
                    adapter.process(regs, seen)
                    break
                except MemoryFault as fault:
                    windows.append(await page_at(regs.vcpu, fault.address))
            # both ways to the CPU number, whichever the adapter took
            areas = symbols["__per_cpu_offset"] + slide + 8 * regs.vcpu
            windows.append(await page_at(regs.vcpu, areas))
            windows.append(await page_at(regs.vcpu, regs.gdt_base + CPUNODE_OFFSET))
            vcpus.append({"vcpu": regs.vcpu, "windows": windows})
        kthreadd_pointer = await page_at(0, symbols["kthreadd_task"] + slide)
        pointer_at = symbols["kthreadd_task"] + slide - kthreadd_pointer[0]
        kthreadd = int.from_bytes(
            bytes.fromhex(kthreadd_pointer[1])[pointer_at : pointer_at + 8], "little"
        )
        tasks = {
            "init_task": [
                symbols["init_task"] + slide,
                await page_at(0, symbols["init_task"] + slide),
            ],
            "kthreadd": [kthreadd, await page_at(0, kthreadd)],
        }
        banner = await page_at(0, symbols["linux_banner"] + slide)
    finally:
        await session.execute("cont")
        await memory.close()
        await session.close()
    return {
        "registers": text,
        "vcpus": vcpus,
        "tasks": tasks,
        "banner_window": banner,
        "started": dict(re.findall(r"started (\w+) pid (\d+)", serial)),
        "kallsyms_divide_error": said.group(1),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as work, running_linux(Path(work), "--smp", "2") as guest:
        symbols = nm_symbols(guest.kernel)
        offsets = gdb_offsets(guest.kernel)
        captured = asyncio.run(record(guest, symbols, offsets))
        banner = elf_banner(guest.kernel, symbols["linux_banner"])
    document = {
        "kernel": guest.kernel.parent.name,
        "nm": {name: f"{address:#x}" for name, address in sorted(symbols.items())},
        "gdb_task_struct": offsets,
        "elf_banner": banner,
        **captured,
    }
    OUT.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
