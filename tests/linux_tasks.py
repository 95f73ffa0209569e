"""A booted Linux example guest's tasks and memory maps, as tests read them from outside:
the workloads init started (its serial log), each one's /proc/PID/maps as init printed
it, and the guest's task list walked from `init_task` (with offsets GDB-free: the
vmlinux's DWARF through qmpprof's reader, which tests/unit checks against GDB)."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from qmpprof.guest.dwarf_types import read_layout
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.memory import MemoryReader
from qmpprof.model import FileMapping, RegisterSet
from qmpprof.record.page_reader import UNREADABLE, PageReader
from qmpprof.target.memory import MemoryBackend
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all

#: More tasks than the example guest runs (a few dozen kernel threads, init, 5 workloads).
MAX_TASKS = 1024
_MAPS_LINE = re.compile(
    r"qmpprof-linux: maps (\d+) ([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) \S+ \d+\s*(.*)"
)


def proc_maps(serial: str) -> dict[int, tuple[FileMapping, ...]]:
    """Each pid's executable file mappings, as /proc/PID/maps printed them, the vDSO's
    (an ELF image the kernel maps, `[vdso]`) among them."""
    found: dict[int, list[FileMapping]] = {}
    for pid, start, end, perms, offset, path in _MAPS_LINE.findall(serial):
        found.setdefault(int(pid), [])
        if "x" in perms and (path.startswith("/") or path.strip() == "[vdso]"):
            mapping = FileMapping(int(start, 16), int(end, 16), int(offset, 16), path.strip())
            found[int(pid)].append(mapping)
    return {pid: tuple(maps) for pid, maps in found.items()}


@dataclass(frozen=True)
class TaskList:
    """Where the vmlinux keeps init_task and task_struct's `tasks` and `pid`."""

    init_task: int
    tasks: int
    pid: int

    @classmethod
    def of(cls, vmlinux: Path) -> TaskList:
        layout = read_layout(vmlinux, {"init_task"}, {"task_struct"}, ("tasks", "pid"))
        task = layout.structs["task_struct"]
        return cls(layout.variables["init_task"], task["tasks"].offset, task["pid"].offset)

    def walk(self, slide: int) -> Callable[[MemoryReader], dict[int, int]]:
        """A step for PageReader.run: each task's pid and address."""

        def step(memory: MemoryReader) -> dict[int, int]:
            head = self.init_task + slide + self.tasks
            found: dict[int, int] = {}
            node = memory.read_u64(head)
            while node != head and len(found) < MAX_TASKS:
                task = node - self.tasks
                pid = int.from_bytes(memory.read(task + self.pid, 4), "little")
                found[pid] = task
                node = memory.read_u64(node)
            return found

        return step


#: How long a test samples to catch each busy workload running (TCG, a busy host).
CATCH_S = 300
T = TypeVar("T")


async def catch_running(
    session: QmpSession,
    memory: MemoryBackend,
    adapter: LinuxAdapter,
    pids: set[int],
    visit: Callable[[RegisterSet, int], Awaitable[T]],
) -> dict[int, T]:
    """Stop the guest again and again until each process in `pids` was seen running in
    user mode on a vCPU; `visit(registers, task)` each one the first time, while the
    guest is stopped. Gives each pid's answer (those caught within CATCH_S)."""
    caught: dict[int, T] = {}
    deadline = time.monotonic() + CATCH_S
    while set(caught) != pids and time.monotonic() < deadline:
        registers = parse_all(await session.hmp("info registers -a", first="stop"))
        memory.set_registers(registers)
        for regs in registers:
            reader = PageReader(memory, regs.vcpu)
            task = await reader.run(functools.partial(adapter.task_address, regs))
            label = await reader.run(functools.partial(adapter.process, regs))
            if task is UNREADABLE or task is None or regs.cpl != 3:
                continue
            pid = None if label is UNREADABLE or label is None else label.pid
            if pid in pids and pid not in caught:
                caught[pid] = await visit(regs, task)
        await session.execute("cont")
        await asyncio.sleep(0.1)  # let the guest run: not a synchronisation
    return caught
