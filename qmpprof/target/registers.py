"""Parse QEMU's HMP `info registers [-a]` text into `RegisterSet`s.

QEMU prints 64-bit names (RIP=, RAX=) when long mode is active and 32-bit names
(EIP=, EAX=) otherwise, including for an AP still in real mode. Both map onto the
64-bit names in `RegisterSet.general`. An AArch64 vCPU's block (PC=, X00=...) is
parsed by its instruction set's module (qmpprof/isa/aarch64.py).
"""

from __future__ import annotations

import copy
import re

from qmpprof.errors import RegisterParseError
from qmpprof.isa import aarch64
from qmpprof.model import RegisterSet

# Every repetition in these patterns has an upper bound (and is possessive where
# giving back characters cannot help): one match attempt then reads at most a fixed
# number of characters, so a scan of n characters costs O(n) whatever the text is.
# An unbounded `[A-Z0-9]*` retried at every position of a 32 KB run of capitals took
# 10 s. tests/unit/test_registers.py checks the bounds.
_HEX = "[0-9a-f]{1,16}+"
_CPU_HEADER = re.compile(r"CPU#(\d{1,6}+)[ \t\r]{0,16}+(?:\n|$)")
_ASSIGNMENT = re.compile(r"\b([A-Z][A-Z0-9]{0,15}+) {0,4}+= {0,4}+([0-9a-fA-F]{1,16}+)\b")
_SEGMENT = re.compile(rf"^CS[ \t]{{0,4}}+=({_HEX}) ({_HEX}) ({_HEX}) ({_HEX})", re.MULTILINE)


def _layout(names: tuple[str, ...], flags: str) -> re.Pattern[str]:
    """QEMU's dump of the general registers in its fixed order (target/i386/cpu-dump.c),
    through the flags line: one match instead of a scan for every NAME=value."""
    registers = "".join(rf"{name} {{0,2}}+=(?P<{name}>{_HEX})\s{{1,8}}+" for name in names)
    status = r" \[[^\]\n]{0,16}+\] CPL=(?P<CPL>\d{1,2}+)[^\n]{0,64} HLT=(?P<HLT>\d)"
    return re.compile(rf"{registers}{flags}=(?P<{flags}>{_HEX}){status}")


_LONG_GENERAL = ("RAX", "RBX", "RCX", "RDX", "RSI", "RDI", "RBP", "RSP")
_LONG_NAMES = (*_LONG_GENERAL, *(f"R{n}" for n in range(8, 16)), "RIP")
_LEGACY_NAMES = ("EAX", "EBX", "ECX", "EDX", "ESI", "EDI", "EBP", "ESP", "EIP")
_LONG_MODE = _layout(_LONG_NAMES, "RFL")
_LEGACY_MODE = _layout(_LEGACY_NAMES, "EFL")
_CONTROL = re.compile(rf"CR0=(?P<CR0>{_HEX}) CR2={_HEX} CR3=(?P<CR3>{_HEX}) CR4=(?P<CR4>{_HEX})")
_EFER = re.compile(rf"EFER=(?P<EFER>{_HEX})")
#: The rest of a line, up to 128 characters, and its end.
_REST = r"(?:[^\n]{0,64}+){0,2}+\n"


def _block(general: re.Pattern[str]) -> re.Pattern[str]:
    """QEMU 7's whole dump of one vCPU in its fixed order (target/i386/cpu-dump.c), from
    the general registers through EFER: every value a RegisterSet takes in one match."""

    def segment(group: str) -> str:
        return rf"=[0-9a-f]{{4}} (?P<{group}>{_HEX}) {_REST}"

    return re.compile(
        rf"{general.pattern}{_REST}ES ={_REST}"
        rf"CS =(?P<CS>{_HEX}) (?P<CS_BASE>{_HEX}) {_HEX} (?P<CS_FLAGS>{_HEX}){_REST}"
        rf"SS ={_REST}DS ={_REST}FS {segment('FS_BASE')}GS {segment('GS_BASE')}"
        rf"LDT={_REST}TR {segment('TR_BASE')}GDT= {{0,8}}+(?P<GDT_BASE>{_HEX}) {_REST}"
        rf"IDT={_REST}{_CONTROL.pattern}{_REST}DR0={_REST}DR6={_REST}{_EFER.pattern}"
    )


_LONG_BLOCK = _block(_LONG_MODE)
_LEGACY_BLOCK = _block(_LEGACY_MODE)
#: "GS =<selector> <base> <limit> <flags>" (TR's alike) and "GDT=     <base> <limit>".
_GS_BASE = re.compile(rf"GS =[0-9a-f]{{4}} ({_HEX}) ")
_FS_BASE = re.compile(rf"FS =[0-9a-f]{{4}} ({_HEX}) ")
_GDT_BASE = re.compile(rf"GDT= {{0,8}}+({_HEX}) ")
_TR_BASE = re.compile(rf"TR =[0-9a-f]{{4}} ({_HEX}) ")

_GENERAL = {
    "RAX": "rax",
    "RBX": "rbx",
    "RCX": "rcx",
    "RDX": "rdx",
    "RSI": "rsi",
    "RDI": "rdi",
    "RBP": "rbp",
    "RSP": "rsp",
    "RIP": "rip",
    "RFL": "rflags",
    "EAX": "rax",
    "EBX": "rbx",
    "ECX": "rcx",
    "EDX": "rdx",
    "ESI": "rsi",
    "EDI": "rdi",
    "EBP": "rbp",
    "ESP": "rsp",
    "EIP": "rip",
    "EFL": "rflags",
    **{f"R{n}": f"r{n}" for n in range(8, 16)},
}
_REQUIRED = ("rip", "rsp", "rbp")
_DESC_LONG = 1 << 21
_DESC_BIG = 1 << 22


#: vCPUs whose last block a ParsedRegisters keeps, before it starts over.
MAX_KEPT_BLOCKS = 4096


def parse_all(text: str) -> list[RegisterSet]:
    """Parse `info registers -a` output (one `CPU#n` block per vCPU).

    Raises RegisterParseError when no vCPU block, or a block without RIP/RSP/RBP, is found.
    """
    return [parse_one(block, vcpu) for vcpu, block in split_blocks(text)]


def split_blocks(text: str) -> list[tuple[int, str]]:
    """(vCPU, the text of its `CPU#n` block) for each block. Raises RegisterParseError
    when there is none."""
    headers = list(_CPU_HEADER.finditer(text))
    if not headers:
        raise RegisterParseError("no 'CPU#n' block in 'info registers -a' output")
    ends = [h.start() for h in headers[1:]] + [len(text)]
    return [(int(h.group(1)), text[h.end() : end]) for h, end in zip(headers, ends, strict=True)]


class ParsedRegisters:
    """`parse_all` for a sampler's successive dumps: a halted vCPU's block that is the
    same text as at the last dump (an idle vCPU, most of a lightly loaded VM's) is not
    parsed again. Each dump still gets RegisterSet objects of its own: what is read for
    one (the OS adapter's per-sample answers) is not taken for another tick's."""

    def __init__(self) -> None:
        self._halted: dict[int, tuple[str, RegisterSet]] = {}

    def parse(self, text: str) -> list[RegisterSet]:
        """Raises RegisterParseError as parse_all does."""
        return [self._parsed(vcpu, block) for vcpu, block in split_blocks(text)]

    def _parsed(self, vcpu: int, block: str) -> RegisterSet:
        known = self._halted.get(vcpu)
        if known is not None and known[0] == block:
            return copy.copy(known[1])  # an object of its own, as a parse makes
        registers = parse_one(block, vcpu)
        if not registers.halted:
            self._halted.pop(vcpu, None)
            return registers
        if len(self._halted) >= MAX_KEPT_BLOCKS:
            self._halted.clear()
        self._halted[vcpu] = (block, registers)
        return registers


def parse_one(text: str, vcpu: int) -> RegisterSet:
    """Parse the registers of one vCPU (the text of one `CPU#n` block).

    Parsing runs for every vCPU at every tick: QEMU 7's layout is read in one match;
    any other text is read line by line (`_from_lines`)."""
    long_mode = _LONG_BLOCK.match(text)
    block = long_mode or _LEGACY_BLOCK.match(text)
    if block is None:
        if aarch64.is_aarch64_block(text):
            return aarch64.parse_block(text, vcpu)
        return _from_lines(text, vcpu)
    values = block.groupdict()
    names = _LONG_NAMES if long_mode else _LEGACY_NAMES
    general = {_GENERAL[name]: int(values[name], 16) for name in names}
    general["rflags"] = int(values["RFL" if long_mode else "EFL"], 16)
    cs_flags, cr0 = int(values["CS_FLAGS"], 16), int(values["CR0"], 16)
    return RegisterSet(
        vcpu=vcpu,
        general=general,
        cs=int(values["CS"], 16),
        cpl=int(values["CPL"], 16),
        halted=values["HLT"] == "1",
        bits=_code_width(cs_flags, cr0),
        cr0=cr0,
        cr3=int(values["CR3"], 16),
        cr4=int(values["CR4"], 16),
        efer=int(values["EFER"], 16),
        gs_base=int(values["GS_BASE"], 16),
        fs_base=int(values["FS_BASE"], 16),
        gdt_base=int(values["GDT_BASE"], 16),
        tr_base=int(values["TR_BASE"], 16),
        cs_base=int(values["CS_BASE"], 16),
    )


def _from_lines(text: str, vcpu: int) -> RegisterSet:
    """The registers of a `CPU#n` block found line by line, in whatever order."""
    values = _assignments(text)
    general = {name: int(values[key], 16) for key, name in _GENERAL.items() if key in values}
    missing = [name for name in _REQUIRED if name not in general]
    if missing:
        raise RegisterParseError(f"vCPU {vcpu}: no {', '.join(missing)} in register dump")
    cs_selector, cs_base, cs_flags = _code_segment(text, vcpu)
    return RegisterSet(
        vcpu=vcpu,
        general=general,
        cs=cs_selector,
        cpl=_hex(values, "CPL") if "CPL" in values else cs_selector & 3,
        halted=values.get("HLT") == "1",
        bits=_code_width(cs_flags, _hex(values, "CR0")),
        cr0=_hex(values, "CR0"),
        cr3=_hex(values, "CR3"),
        cr4=_hex(values, "CR4"),
        efer=_hex(values, "EFER"),
        gs_base=_base(_GS_BASE, text, "\nGS ="),
        fs_base=_base(_FS_BASE, text, "\nFS ="),
        gdt_base=_base(_GDT_BASE, text, "\nGDT="),
        tr_base=_base(_TR_BASE, text, "\nTR ="),
        cs_base=cs_base,
    )


def _assignments(text: str) -> dict[str, str]:
    """`NAME=hex` for the registers a RegisterSet needs (and maybe more): QEMU's usual
    layout matched at known places, any other text by collecting every assignment."""
    return _laid_out(text) or _scanned(text)


def _laid_out(text: str) -> dict[str, str] | None:
    """The values, if the text has QEMU 7's layout (general registers first, then the
    segments, CR0..CR4 and EFER lines); None otherwise."""
    general = _LONG_MODE.match(text) or _LEGACY_MODE.match(text)
    if general is None:
        return None
    control = _line(_CONTROL, text, "\nCR0=")
    efer = _line(_EFER, text, "\nEFER=")
    if control is None or efer is None:
        return None
    return general.groupdict() | control.groupdict() | efer.groupdict()


def _line(pattern: re.Pattern[str], text: str, start: str) -> re.Match[str] | None:
    at = text.find(start)
    return pattern.match(text, at + 1) if at >= 0 else None


def _base(pattern: re.Pattern[str], text: str, start: str) -> int:
    """The base address a segment or table line gives; 0 when the dump has no such line."""
    found = _line(pattern, text, start)
    return int(found.group(1), 16) if found else 0


def _scanned(text: str) -> dict[str, str]:
    """Every `NAME=hex` before the FPU state (the first one of a name wins).

    The FPU and vector registers are half of the text and none of them is needed.
    """
    fpu = text.find("\nFCW=")
    head = text if fpu < 0 else text[:fpu]
    return dict(reversed(_ASSIGNMENT.findall(head)))


def _hex(values: dict[str, str], key: str) -> int:
    return int(values.get(key, "0"), 16)


def _code_segment(text: str, vcpu: int) -> tuple[int, int, int]:
    """The code segment's selector, base and descriptor flags."""
    at = text.find("\nCS =")
    match = _SEGMENT.match(text, at + 1) if at >= 0 else _SEGMENT.search(text)
    if match is None:
        raise RegisterParseError(f"vCPU {vcpu}: no CS line in register dump")
    return int(match.group(1), 16), int(match.group(2), 16), int(match.group(4), 16)


def _code_width(cs_flags: int, cr0: int) -> int:
    if not cr0 & 1:
        return 16
    if cs_flags & _DESC_LONG:
        return 64
    return 32 if cs_flags & _DESC_BIG else 16
