"""Where a kernel's ORC table is wrong, mended from the kernel's code.

objtool writes the table from the code as it is linked; two kinds of place run otherwise.

The returns from `error_entry` (`mend_error_entry_returns`): since 5.19 each interrupt
and exception stub calls `error_entry`, which pushes the interrupted registers
(pt_regs) and, coming from user mode, copies them to the task's stack (`sync_regs`, a
tail call on 6.12), then returns with them still pushed; the stub then moves to the
stack it returned (`mov %rax, %rsp`). objtool takes that call for one that leaves the
stack as it found it, so its entry for the return address (and the `mov`) puts the
interrupt frame 8 bytes above RSP: a vCPU stopped there, or in `sync_regs` (6.12) was
unwound through the wrong words, a user stack address for its pc. There pt_regs lie at
RSP, as the entry after the `mov` says of the stack it moved to.

`error_entry` itself (`_mend_error_entry`, issue 48): its table's rows take its frame
for pt_regs (REGS) or an interrupt frame (IRET) wherever it has pushed them, so the
kernel's unwinder, and qmpprof, went from it straight to the interrupted code and left
out the stub that called it, which GDB lists. The stub's return address is at RSP once
the registers are pushed, in RSI while they are pushed (PUSH_AND_CLEAR_REGS save_ret=1
moves it there and writes RDI over its slot) and, on 5.10, in R12 while the function
switches to the task's stack (`popq %r12` ... `pushq %r12`). Each row is mended to
return there: while pushing, to the stub's stack as it was at the call (its row there
says the interrupt frame is 8 bytes up, and the registers not yet pushed are still the
interrupted code's own); once they are pushed, as an interrupted frame (`signal_frame`),
so that the stub's row is the one at its return address, pt_regs at RSP. Where 6.12's
`error_entry` jumps to `sync_regs`, `sync_regs`'s rows say the same of its caller.

The return stack buffer fills (`mend_return_buffer_fills`): on a context switch
(`__switch_to_asm`, spectre v2) and on some entries (`entry_ibpb`) the kernel patches in
at boot, over a `jmp` past padding, a loop of calls that each push a return address
nobody returns to (`call 1f; int3; 1:`) and drop them two at a time. The table's
entries there describe whichever of the site's alternatives objtool took at each
offset: 6.1's describe the single-call alternative where the 16-round loop runs, so a
vCPU stopped in the loop was unwound 8 or 16 bytes off, a saved register taken for the
caller's pc. The loop is read from the code as it runs and each of its instructions
given the row after it, as far off as the calls it has made so far push.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from qmpprof.errors import MemoryFault
from qmpprof.memory import MemoryReader
from qmpprof.symbols.elf import Symbol, SymbolTable
from qmpprof.unwind import rules as r
from qmpprof.unwind.callsite import DIRECT_JUMP, rel32_branches_to
from qmpprof.unwind.orc import OrcTable

#: How far from `error_entry` its callers lie: the entry stubs share `.entry.text` with
#: it (8 KiB on Debian's 6.12), and a kernel that calls it from elsewhere keeps its rows.
_ENTRY_TEXT_REACH = 1 << 15
#: The `mov %rax, %rsp` that follows each call to `error_entry`.
_MOVE_TO_RETURNED_STACK = b"\x48\x89\xc4"
#: Where the stub's row after the `mov` puts the caller's stack: pt_regs at RSP.
_REGS_AT_RSP = r.CfaRule(r.RSP, 0)


def mend_error_entry_returns(
    orc: OrcTable, symbols: SymbolTable, code: MemoryReader, extent: tuple[int, int]
) -> None:
    """Correct the table where each entry stub's `call error_entry` returns (see the
    module's docstring): the return address, as a vCPU's own pc, gets the row of the
    instruction after the `mov`, a pt_regs frame at RSP. Only where the code is that call
    and that `mov`, and the row after it that frame: another kernel (5.10 switches stacks
    inside `error_entry`) is left as its table says. Then `error_entry`'s own rows (and
    `sync_regs`'s where it is jumped to) are mended to return to the stub. `code`: the
    kernel's code bytes in `extent`."""
    error_entry = symbols.find("error_entry")
    if error_entry is None:
        return
    start = max(error_entry.address - _ENTRY_TEXT_REACH, extent[0])
    end = min(error_entry.address + _ENTRY_TEXT_REACH, extent[1])
    try:
        text = code.read(start, max(end - start, 0))
    except MemoryFault:
        return
    for returns_to in rel32_branches_to(text, start, error_entry.address):
        after = returns_to - start
        if text[after : after + len(_MOVE_TO_RETURNED_STACK)] == _MOVE_TO_RETURNED_STACK:
            row = orc.row_for(returns_to + len(_MOVE_TO_RETURNED_STACK))
            if row is not None and row.signal_frame and row.cfa == _REGS_AT_RSP:
                orc.mend(returns_to, row)  # the caller's lookup (one byte back) is the call's
    _mend_error_entry(orc, symbols, code, error_entry)


#: PUSH_AND_CLEAR_REGS save_ret=1's first instructions (after `cld` or `endbr64`, if any):
#: `push %rsi; mov 0x8(%rsp), %rsi; mov %rdi, 0x8(%rsp)`: the return address into RSI.
_RETURN_ADDRESS_INTO_RSI = bytes.fromhex("56488b742408") + bytes.fromhex("48897c2408")
_PUSH_RSI = 0x56
#: How far in it may start (`cld`, 1 byte; `endbr64`, 4).
_PROLOGUE_REACH = 8
#: 5.10's switch to the task's stack: `pop %r12; mov %rsp, %rdi` ... `mov %rax, %rsp;
#: push %r12` (the return address in R12 between them).
_POP_R12 = bytes.fromhex("415c4889e7")
_PUSH_R12 = _MOVE_TO_RETURNED_STACK + bytes.fromhex("4154")
#: The most bytes of `error_entry` (0x120 on Debian's kernels) and `sync_regs` read.
_ERROR_ENTRY_REACH = 0x200
#: PT_REGS' first slot (r15): a row that reads it describes a whole pt_regs frame.
_R15 = 15
#: DWARF's numbers of the registers that hold the return address (rules.py's numbering).
_RSI = r.DWARF_REGISTER_NAMES.index("rsi")
_R12 = r.DWARF_REGISTER_NAMES.index("r12")


def _mend_error_entry(
    orc: OrcTable, symbols: SymbolTable, code: MemoryReader, error_entry: Symbol
) -> None:
    """Each of `error_entry`'s rows that goes from it past the stub that called it gets
    one that returns to the stub (the module's docstring), and where `error_entry`
    jumps to `sync_regs`, `sync_regs`'s rows return as from an interrupted frame."""
    text = _function_code(symbols, code, error_entry)
    if text is None:
        return
    prologue = text.find(
        _RETURN_ADDRESS_INTO_RSI, 0, _PROLOGUE_REACH + len(_RETURN_ADDRESS_INTO_RSI)
    )
    popped = text.find(_POP_R12)
    pushed = text.find(_PUSH_R12, max(popped, 0))
    in_r12 = range(popped + 2, pushed + len(_PUSH_R12)) if 0 <= popped < pushed else range(0)
    for offset in range(len(text)):
        row = orc.row_for(error_entry.address + offset)
        if row is None:
            continue
        held = _R12 if offset in in_r12 else _RSI if text[offset] == _PUSH_RSI else None
        mended = _returning_to_stub(row, held, prologue >= 0)
        if mended is not None:
            orc.mend(error_entry.address + offset, mended)
    _mend_sync_regs(orc, symbols, code, error_entry, text)


def _returning_to_stub(row: r.UnwindRow, held: int | None, in_rsi: bool) -> r.UnwindRow | None:
    """`error_entry`'s `row` mended to return to the stub, or None where it does already
    (or is not one of the kinds mended). `held`: the register that holds the return
    address where pt_regs lie at RSP; `in_rsi`: the function moves it to RSI as it
    pushes (its interrupt-frame rows are those instructions')."""
    rules = dict(row.rules)
    if not row.signal_frame or row.cfa.register != r.RSP or row.cfa.expression is not None:
        return None
    if _R15 in rules:  # pt_regs pushed: at RSP + 8 over the return address, or at RSP
        if row.cfa.offset == 8:
            return r.UnwindRow(r.CfaRule(r.RSP, 8), ((r.RIP, r.SavedAt(-8)),), signal_frame=True)
        if row.cfa.offset == 0 and held is not None:
            return r.UnwindRow(_REGS_AT_RSP, ((r.RIP, r.InRegister(held)),), signal_frame=True)
        return None
    # Pushing: the interrupt frame at CFA; the stub's stack was 8 bytes below it (its
    # error code, or -1), and its row there reads the interrupt frame 8 bytes up.
    if in_rsi and rules.get(r.RIP) == r.SavedAt(0) and row.cfa.offset >= 24:
        return r.UnwindRow(r.CfaRule(r.RSP, row.cfa.offset - 8), ((r.RIP, r.InRegister(_RSI)),))
    return None


def _mend_sync_regs(
    orc: OrcTable, symbols: SymbolTable, code: MemoryReader, error_entry: Symbol, text: bytes
) -> None:
    """Where `error_entry` jumps to `sync_regs` (6.12: `jmp sync_regs`, no `call`), the
    return address in `sync_regs`'s frame is the stub's, pt_regs at the stack above it:
    its rows return as from an interrupted frame, so that the stub's row is looked up
    at the return address (pt_regs at RSP), not at the call (the interrupt frame 8 bytes
    up, as while `error_entry` pushes)."""
    sync_regs = symbols.find("sync_regs")
    if sync_regs is None:
        return
    jumps = rel32_branches_to(text, error_entry.address, sync_regs.address, opcode=DIRECT_JUMP)
    if next(jumps, None) is None:
        return
    body = _function_code(symbols, code, sync_regs)
    for offset in range(len(body or b"")):
        row = orc.row_for(sync_regs.address + offset)
        if row is not None and not row.signal_frame and dict(row.rules).get(r.RIP) == r.SavedAt(-8):
            orc.mend(sync_regs.address + offset, replace(row, signal_frame=True))


def _function_code(symbols: SymbolTable, code: MemoryReader, function: Symbol) -> bytes | None:
    """`function`'s code up to the next symbol (kallsyms gives no sizes) or
    _ERROR_ENTRY_REACH bytes; None where it cannot be read."""
    size = function.size or _ERROR_ENTRY_REACH
    size = min(size, _ERROR_ENTRY_REACH)
    for offset in range(1, size):
        found = symbols.lookup(function.address + offset)
        if found is None or found[0].address != function.address:
            size = offset
            break
    try:
        return code.read(function.address, size)
    except MemoryFault:
        return None


#: The functions whose code the kernel may patch a return stack buffer fill into
#: (FILL_RETURN_BUFFER, arch/x86/include/asm/nospec-branch.h).
RETURN_BUFFER_FILLERS = ("__switch_to_asm", "entry_ibpb")
#: How much of each such function's code holds its fill (it starts 0x2b bytes in on 6.12).
FILLER_REACH = 256
#: One slot of a fill: a call to 6 bytes on, past the int3 that stops speculation.
_FILL_SLOT = b"\xe8\x01\x00\x00\x00\xcc"
#: `add $imm8, %rsp`, which drops the slots' return addresses.
_ADD_TO_RSP = b"\x48\x83\xc4"
_LFENCE = b"\x0f\xae\xe8"
_JNZ_SHORT = 0x75
#: The most instructions from a fill's first slot to its `lfence`.
FILL_INSTRUCTIONS = 12


def filler_spans(symbols: SymbolTable) -> Iterator[tuple[int, int]]:
    """(address, size) of the code of each function a fill may be patched into."""
    for name in RETURN_BUFFER_FILLERS:
        function = symbols.find(name)
        if function is not None:
            yield function.address, min(function.size or FILLER_REACH, FILLER_REACH)


def mend_return_buffer_fills(orc: OrcTable, symbols: SymbolTable, code: MemoryReader) -> None:
    """Correct the table where a return stack buffer fill runs (see the module's
    docstring). `code`: the kernel's code as it runs (alternatives applied), at the
    table's addresses; a function whose code holds no fill, or one that does not leave
    the stack as it found it, keeps its rows."""
    for address, size in filler_spans(symbols):
        try:
            text = code.read(address, size)
        except MemoryFault:
            continue
        slot = text.find(_FILL_SLOT)
        fill = _fill_depths(text, slot) if slot >= 0 else None
        if fill is None:
            continue
        depths, end = fill
        after = orc.row_for(address + end)
        if after is None or after.cfa.register != r.RSP or after.cfa.expression is not None:
            continue
        for offset, depth in depths:
            cfa = r.CfaRule(r.RSP, after.cfa.offset + depth)
            orc.mend(address + offset, replace(after, cfa=cfa))


def _fill_depths(text: bytes, first: int) -> tuple[list[tuple[int, int]], int] | None:
    """Each instruction of the fill whose first slot is at `first` in `text`, by offset,
    with the bytes its slots have pushed when it runs; and the offset after its `lfence`.
    None where the code is not such a loop back to `first`, ending as it began."""
    depths: list[tuple[int, int]] = []
    at, depth = first, 0
    for _ in range(FILL_INSTRUCTIONS):
        depths.append((at, depth))
        step = _fill_instruction(text, at, first)
        if step is None:
            return None
        length, pushed = step
        at, depth = at + length, depth + pushed
        if depth < 0:
            return None
        if text[at - len(_LFENCE) : at] == _LFENCE:
            return (depths, at) if depth == 0 else None
    return None


def _fill_instruction(text: bytes, at: int, first: int) -> tuple[int, int] | None:
    """(length, bytes pushed) of the fill's instruction at `at`: a slot, the `add` that
    drops slots, the counter's `dec`, the `jnz` back to `first`, the `lfence`."""
    if text[at : at + len(_FILL_SLOT)] == _FILL_SLOT:
        return len(_FILL_SLOT), 8  # the call goes on past its int3
    if text[at : at + 3] == _ADD_TO_RSP and at + 3 < len(text):
        return 4, -int.from_bytes(text[at + 3 : at + 4], "little", signed=True)
    if text[at : at + 1] in (b"\x48", b"\x49") and text[at + 1 : at + 2] == b"\xff":
        modrm = text[at + 2] if at + 2 < len(text) else 0
        return (3, 0) if modrm >> 3 == 0xC8 >> 3 else None  # dec %reg
    if text[at : at + 1] == bytes([_JNZ_SHORT]) and at + 1 < len(text):
        back = int.from_bytes(text[at + 1 : at + 2], "little", signed=True)
        return (2, 0) if at + 2 + back == first else None
    if text[at : at + len(_LFENCE)] == _LFENCE:
        return len(_LFENCE), 0
    return None
