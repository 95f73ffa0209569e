"""Record what tests/unit/test_linux_modules.py reads: `python -m
tests.unit.data.linux.record_modules` (from the repository root, after `make
linux-guest`; nm and GDB are needed, GDB reads each 600 MB vmlinux for minutes).

For each kernel the tests boot (or those named as arguments, the others' records kept),
it boots the Linux example guest (KASLR on), whose init loads crc8.ko and prints where
/proc/modules puts it, and saves to modules.json:

- GDB's offsets of what the module walk reads (struct module's state, list, name, and
  core_layout.base/text_size or mem[0].base/size) and nm's address of `modules`;
- the guest memory the walk asks for (the list head, then each struct module), read
  with the HMP backend as `record` reads it;
- the slide and the modules init printed (the oracle).

Re-record when the kernel or QEMU changes, and read the diff.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from qmpprof.errors import MemoryFault
from qmpprof.guest.linux.modules import ModuleListLayout, ModuleWalk
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession
from tests.linux_vm import running_linux
from tests.unit.data.linux.record_maps import gdb_output, record_kernels

OUT = Path(__file__).with_name("modules.json")
_GDB_MEMBERS = {
    "state": "state",
    "list": "list",
    "name": "name",
    "name_size": "sizeof(((struct module *)0)->name)",
    "old_base": "core_layout.base",
    "old_size": "core_layout.text_size",
    "new_base": "mem[0].base",
    "new_size": "mem[0].size",
}


def gdb_offsets(vmlinux: Path) -> dict[str, int]:
    """Each member's offset (or size) as GDB reads the vmlinux, in one run; a member
    this kernel lacks is absent (GDB says so on stderr and goes on)."""
    commands = []
    for key, member in _GDB_MEMBERS.items():
        expression = member if "sizeof" in member else f"(long)&((struct module *)0)->{member}"
        commands += ["-ex", f"echo {key}=", "-ex", f"print {expression}", "-ex", "echo \\n"]
    out = gdb_output(vmlinux, commands)
    return {key: int(value) for key, value in re.findall(r"(\w+)=\$\d+ = (\d+)", out)}


def nm_modules(vmlinux: Path) -> int:
    out = subprocess.run(["nm", str(vmlinux)], capture_output=True, text=True, check=True)
    return next(
        int(line.split()[0], 16) for line in out.stdout.splitlines() if line.endswith(" modules")
    )


def layout_of(head: int, gdb: dict[str, int]) -> ModuleListLayout:
    era = "new" if "new_base" in gdb else "old"
    base, size = gdb[f"{era}_base"], gdb[f"{era}_size"]
    span = max(gdb["name"] + gdb["name_size"], base + 8, size + 4)
    return ModuleListLayout(
        head, 0, gdb["state"], gdb["list"], gdb["name"], gdb["name_size"], base, size, 4, span
    )


async def record(qmp: str, layout: ModuleListLayout, slide: int) -> list[list[Any]]:
    session = await QmpSession.connect(qmp)
    memory = await open_memory(session, "hmp")
    await session.execute("stop")
    windows: list[list[Any]] = []
    try:
        walk = ModuleWalk(layout, slide)
        for _ in range(64):
            seen = WindowMemory(MemoryWindow(b, bytes.fromhex(d)) for b, d in windows)
            try:
                walk.advance(seen)
                break
            except MemoryFault as fault:
                data = await memory.read_window(0, fault.address, fault.size)
                windows.append([fault.address, data.hex()])
    finally:
        await session.execute("cont")
        await memory.close()
        await session.close()
    return windows


def record_kernel(abi: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work, running_linux(Path(work), abi=abi) as guest:
        head, gdb = nm_modules(guest.kernel), gdb_offsets(guest.kernel)
        serial = Path(guest.serial).read_text()
        said = re.search(r"kallsyms ([0-9a-f]+) asm_exc_divide_error", serial)
        assert said is not None
        divide_error = next(
            int(line.split()[0], 16)
            for line in subprocess.run(
                ["nm", str(guest.kernel)], capture_output=True, text=True, check=True
            ).stdout.splitlines()
            if line.endswith(" asm_exc_divide_error")
        )
        slide = int(said.group(1), 16) - divide_error
        windows = asyncio.run(record(guest.qmp, layout_of(head, gdb), slide))
    return {
        "nm_modules": f"{head:#x}",
        "gdb_struct_module": gdb,
        "slide": slide,
        "windows": windows,
        "init_modules": re.findall(r"qmpprof-linux: module (\S+) at (0x[0-9a-f]+)", serial),
    }


def main() -> None:
    record_kernels(OUT, record_kernel)


if __name__ == "__main__":
    main()
