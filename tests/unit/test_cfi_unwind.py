"""The CFI unwinder against GDB, at every instruction of a real program.

cfi_chain.c is built several ways; GDB stops on each instruction of the chain and
records registers, stack bytes and its own frames. Unwinding those bytes offline
must give GDB's frames.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import cast

from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.symbols.image import load_code
from qmpprof.unwind.cfi import load_cfi
from qmpprof.unwind.rules import DWARF_REGISTER_NAMES
from qmpprof.unwind.unwinder import Strategy, unwind

NAMES = DWARF_REGISTER_NAMES


def unwind_stop(stop: dict[str, object], elf: Path, strategy: Strategy) -> list[int]:
    registers = stop["registers"]
    assert isinstance(registers, dict)
    regs: list[int | None] = [registers[name] for name in NAMES]
    stack = bytes.fromhex(str(stop["stack"]))
    memory = WindowMemory([MemoryWindow(int(str(stop["stack_base"])), stack)])
    result = unwind(regs, memory, load_cfi_cached(elf), strategy, code=load_code_cached(elf))
    return [frame.address for frame in result.frames]


# Each ELF is read once for all of its stops, not once a stop.
load_cfi_cached = functools.cache(load_cfi)
load_code_cached = functools.cache(load_code)


def test_cfi_unwind_matches_gdb_at_every_instruction(
    chain_capture: tuple[str, Path, list[dict[str, object]]],
) -> None:
    name, elf, stops = chain_capture
    assert len(stops) > 40, "GDB stopped too rarely: the capture did not work"
    wrong = [
        (stop["frames"], ours)
        for stop in stops
        if (ours := unwind_stop(stop, elf, Strategy.AUTO)) != stop["frames"]
    ]
    for gdb_frames, ours in wrong[:3]:
        gdb_hex = [hex(a) for a in cast(list[int], gdb_frames)]
        print(f"{name}\n  gdb:  {gdb_hex}\n  ours: {[hex(a) for a in ours]}")
    assert not wrong, f"{len(wrong)} of {len(stops)} stops differ from GDB ({name})"
