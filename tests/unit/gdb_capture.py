"""Run inside GDB (gdb -batch -x gdb_capture.py): the oracle for CFI unwinding.

Breaks once on every instruction of the functions named in $QMPPROF_FUNCTIONS of the
program in $QMPPROF_PROGRAM; at each stop records the registers, $QMPPROF_STACK_BYTES
of stack above RSP and GDB's frames (pcs, leaf first), and writes them as JSON lines
to $QMPPROF_OUTPUT.

A 32-bit (i386) program's registers are recorded under the names a 32-bit vCPU's
RegisterSet gives them (EAX as rax, ..., EIP as rip; no r8-r15), with "bits": 32.
"""

import json
import os
from typing import TextIO

import gdb

BELOW_RSP = 128
#: In DWARF order, as qmpprof.unwind.rules numbers them; spelled out, not imported: this
#: runs in GDB's own Python, and an oracle should share no code with what it checks.
REGISTERS = (
    "rax",
    "rdx",
    "rcx",
    "rbx",
    "rsi",
    "rdi",
    "rbp",
    "rsp",
    "r8",
    "r9",
    "r10",
    "r11",
    "r12",
    "r13",
    "r14",
    "r15",
    "rip",
)
#: An i386 inferior's registers, by the x86-64 name each is recorded under.
I386_REGISTERS = {
    "rax": "eax",
    "rdx": "edx",
    "rcx": "ecx",
    "rbx": "ebx",
    "rsi": "esi",
    "rdi": "edi",
    "rbp": "ebp",
    "rsp": "esp",
    "rip": "eip",
}


def instruction_addresses(function: str) -> list[int]:
    listing = gdb.execute(f"disassemble {function}", to_string=True)
    return [
        int(line.split("<")[0].replace("=>", "").strip(), 16)
        for line in listing.splitlines()
        if line.strip().startswith(("0x", "=> 0x"))
    ]


def readable_prefix(address: int, size: int) -> bytes:
    """The bytes from `address` up to `size` or the first unreadable page."""
    data = b""
    while len(data) < size:
        chunk = min(size - len(data), 4096 - (address + len(data)) % 4096)
        try:
            data += bytes(gdb.selected_inferior().read_memory(address + len(data), chunk))
        except gdb.MemoryError:
            break
    return data


def capture(stream: TextIO, stack_bytes: int) -> None:
    frame = gdb.newest_frame()
    if frame.architecture().name() == "i386":
        names, bits = I386_REGISTERS, 32
    else:
        names, bits = {name: name for name in REGISTERS}, 64
    registers = {
        name: int(frame.read_register(theirs)) & (2**bits - 1) for name, theirs in names.items()
    }
    base = registers["rsp"] - BELOW_RSP
    stack = readable_prefix(base, stack_bytes)
    pcs: list[int] = []
    while frame is not None and len(pcs) < 64:
        pcs.append(int(frame.pc()))
        frame = frame.older()
    record = {
        "registers": registers,
        "stack_base": base,
        "stack": stack.hex(),
        "frames": pcs,
        "bits": bits,
    }
    # Where GDB sees `main` at run time: a position-independent program's load bias is
    # this minus main's address in the file.
    main_symbol = gdb.lookup_global_symbol("main")
    if main_symbol is not None:
        record["main"] = int(main_symbol.value().address) & (2**64 - 1)
    stream.write(json.dumps(record) + "\n")


def main() -> None:
    gdb.execute("set pagination off")
    gdb.execute("set confirm off")
    gdb.execute("set backtrace past-main on")
    gdb.execute("set backtrace past-entry on")
    gdb.execute(f"file {os.environ['QMPPROF_PROGRAM']}")
    if os.environ.get("QMPPROF_PIE"):  # addresses are known once the program is loaded
        gdb.execute("starti", to_string=True)
    addresses = []
    for function in os.environ["QMPPROF_FUNCTIONS"].split(","):
        addresses += instruction_addresses(function)
    for address in addresses:
        gdb.Breakpoint(f"*{address:#x}", internal=True, temporary=True)
    stack_bytes = int(os.environ.get("QMPPROF_STACK_BYTES", "4096"))
    with open(os.environ["QMPPROF_OUTPUT"], "w") as stream:
        gdb.execute("continue" if os.environ.get("QMPPROF_PIE") else "run", to_string=True)
        while gdb.selected_inferior().pid:
            capture(stream, stack_bytes)
            gdb.execute("continue", to_string=True)


main()
