"""Record what the i386 tests of tests/unit/test_linux_adapter.py and test_kaslr.py read:
`python -m tests.unit.data.linux.i386.record_tasks QMP_SOCKET SERIAL_LOG MEMORY_FILE`
(from the repository root) with the i386 Linux guest running, booted by
examples/linux/i386/boot.sh with KASLR on (its default) and `--memory-backend
MEMORY_FILE`, after init said it is ready.

It stops the VM and saves to tasks.json:

- `info registers -a` as QEMU printed it (its FPU and vector lines left out);
- the 8 bytes of vector 0's IDT gate, read with `x /2wx` at the IDT base `info registers`
  gives (QEMU's monitor, through vCPU 0's page tables: the IDT is cpu_entry_area's
  read-only alias, which PTI maps for user mode too);
- for each vCPU, the guest memory the Linux adapter asks for (its `__per_cpu_offset`
  entry, its GDT's per-CPU descriptor, its `current_task`, the task_struct), read page by
  page as the capture step would; and the pages of both ways to the per-CPU offset;
- the guest's `linux_banner` page.

Lowmem pages (the kernel image, per-CPU areas, task_structs) are read from the memory
backend file at their physical address, virtual less PAGE_OFFSET (0xc0000000: i386 KASLR
moves the kernel's virtual and physical addresses together), not through qmpprof's page
walk or a vCPU's page tables (under PTI a vCPU in user mode maps none of them);
cpu_entry_area's pages (the GDT) through QEMU's monitor. The oracles come from outside
qmpprof: nm's symbol addresses, GDB's task_struct offsets (gdb -batch on the vmlinux),
and what init printed (the pids it started, /proc/kallsyms's asm_exc_divide_error: the
slide). Re-record when the kernel or QEMU changes, and read the diff.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from qmpprof.errors import MemoryFault
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.linux.adapter import PERCPU_OFFSET_32, LinuxAdapter, TaskLayout
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.unit.data.linux.record_tasks import MEMBERS, gdb_offsets, nm_symbols

OUT = Path(__file__).with_name("tasks.json")
KERNEL = Path.home() / ".cache/qmpprof/linux/6.1.0-50-686-pae/vmlinux"
SYMBOLS = (
    "__per_cpu_offset",
    "current_task",
    "cpu_current_top_of_stack",
    "linux_banner",
    "asm_exc_divide_error",
)
PAGE = 4096
PAGE_OFFSET = 0xC000_0000
LOWMEM_END = 0xF800_0000


async def record(
    qmp: str, serial: str, ram: str, symbols: dict[str, int], offsets: dict[str, int]
) -> dict[str, Any]:
    said = re.search(r"kallsyms ([0-9a-f]+) asm_exc_divide_error", Path(serial).read_text())
    assert said is not None
    slide = int(said.group(1), 16) - symbols["asm_exc_divide_error"]
    members = {m: Member(offsets[m], offsets["comm_size"] if m == "comm" else 4) for m in MEMBERS}
    task = TaskLayout.from_members(members)
    adapter = LinuxAdapter(
        symbols["__per_cpu_offset"],
        symbols["current_task"],
        task,
        top_of_stack=symbols["cpu_current_top_of_stack"],
        word=4,
    )
    adapter.relocate(slide)
    session = await QmpSession.connect(qmp)
    memory = await open_memory(session, "hmp")
    await session.execute("stop")
    try:
        text = await session.hmp("info registers -a")
        text = "\n".join(
            line for line in text.splitlines() if not line.startswith(("FPR", "XMM", "YMM"))
        )
        registers = parse_all(text)
        memory.set_registers(registers)
        idt = re.search(r"IDT=\s*([0-9a-f]+) ", text)
        assert idt is not None
        gate = await session.hmp(f"x /2wx 0x{idt.group(1)}")

        async def page_at(vcpu: int, address: int) -> list[Any]:
            base = address - address % PAGE
            if PAGE_OFFSET <= base < LOWMEM_END:
                with open(ram, "rb") as file:
                    file.seek(base - PAGE_OFFSET)
                    data = file.read(2 * PAGE)
            else:
                data = await memory.read_window(vcpu, base, 2 * PAGE)
            return [base, data.hex()]

        vcpus = []
        for regs in registers:
            windows: list[list[Any]] = []
            for _ in range(8):
                seen = WindowMemory(MemoryWindow(b, bytes.fromhex(d)) for b, d in windows)
                try:
                    adapter.process(regs, seen)
                    adapter.user_registers(regs, seen)
                    break
                except MemoryFault as fault:
                    windows.append(await page_at(regs.vcpu, fault.address))
                adapter.new_connection()
            adapter.new_connection()
            # both ways to the per-CPU offset, whichever the adapter took
            areas = symbols["__per_cpu_offset"] + slide + 4 * regs.vcpu
            windows.append(await page_at(regs.vcpu, areas))
            windows.append(await page_at(regs.vcpu, regs.gdt_base + PERCPU_OFFSET_32))
            vcpus.append({"vcpu": regs.vcpu, "windows": windows})
        banner = await page_at(0, symbols["linux_banner"] + slide)
    finally:
        await session.execute("cont")
        await memory.close()
        await session.close()
    return {
        "registers": text,
        "idt_gate_0": gate.strip(),
        "vcpus": vcpus,
        "banner_window": banner,
        "started": dict(re.findall(r"started (\w+) pid (\d+)", Path(serial).read_text())),
        "kallsyms_divide_error": said.group(1),
    }


def main() -> None:
    qmp, serial, ram = sys.argv[1:4]
    symbols = nm_symbols(KERNEL, SYMBOLS)
    offsets = gdb_offsets(KERNEL)
    captured = asyncio.run(record(qmp, serial, ram, symbols, offsets))
    document = {
        "kernel": KERNEL.parent.name,
        "nm": {name: f"{address:#x}" for name, address in sorted(symbols.items())},
        "gdb_task_struct": offsets,
        **captured,
    }
    OUT.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
