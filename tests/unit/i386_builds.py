"""The 32-bit x86 (i386) programs the unit and fuzz tests unwind, built from data/i386/.

They need no C library (a 64-bit host seldom has the 32-bit one, and gcc -m32 links no
hosted program without it): freestanding, -nostdlib, static, with their own `_start`.
Each build is compiled once a session (conftest.build_elf).
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.conftest import build_elf

#: What every i386 build gets: 32-bit code and no C library, at its link address.
I386 = ("-m32", "-ffreestanding", "-nostdlib", "-static", "-fno-pie", "-fno-stack-protector")
CHAIN = "i386/chain.c"
#: cfi_chain.c's chain (data/i386/chain.c), built each way: CFI only (.eh_frame, or
#: .debug_frame alone), frame pointers (with CFI too), and frame pointers after endbr32.
CHAIN_BUILDS = {
    "O2-omit-fp": ("-O2", "-fomit-frame-pointer"),
    "O2-omit-fp-debug-frame-only": (
        "-O2",
        "-fomit-frame-pointer",
        "-fno-asynchronous-unwind-tables",
    ),
    "O0-fp": ("-O0", "-fno-omit-frame-pointer"),
    "O0-fp-endbr32": ("-O0", "-fno-omit-frame-pointer", "-fcf-protection=full"),
}
#: The chain's functions whose every instruction a frame-pointer unwind gets right: not
#: `realigned` nor (on i386) `main`, whose prologues realign the stack through ECX
#: before EBP frames them (GDB follows their CFI there; nothing tells frame pointers).
FRAMED_FUNCTIONS = "leaf,keeps_registers,variable_array"


def build_chain(name: str, out: Path) -> Path:
    """data/i386/chain.c built as CHAIN_BUILDS[name] says, with debug information."""
    return build_elf(CHAIN, out, *I386, "-g", *CHAIN_BUILDS[name])


def build_i386(source: str, out: Path, *flags: str) -> Path:
    """An i386 program from data/`source` (assembly too), with `flags`."""
    return build_elf(source, out, *I386, *flags)
