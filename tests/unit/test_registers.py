"""`info registers -a` text saved from a real QEMU 7.2, parsed in every CPU mode."""

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import RegisterParseError
from qmpprof.model import RegisterSet
from qmpprof.target import registers
from qmpprof.target.registers import parse_all
from tests.unit.properties import examples

DATA = Path(__file__).parent / "data"


def test_real_mode_cpus_at_reset_parse_eip() -> None:
    cpus = parse_all((DATA / "regs_reset_realmode_smp2.txt").read_text())
    assert [c.vcpu for c in cpus] == [0, 1]
    assert cpus[0].rip == 0xFFF0
    assert cpus[0].cs == 0xF000
    assert cpus[0].bits == 16
    assert not cpus[0].halted


def test_real_mode_code_runs_at_its_segment_base_plus_ip() -> None:
    cpus = parse_all((DATA / "regs_reset_realmode_smp2.txt").read_text())
    assert [(c.cs_base, c.segmented, c.pc) for c in cpus] == [(0xFFFF_0000, True, 0xFFFF_FFF0)] * 2


def test_a_32_bit_segment_with_a_base_is_segmented_and_a_flat_one_is_not() -> None:
    """SeaBIOS runs its relocated code through a code segment based at its new place."""
    first, second = parse_all((DATA / "regs_seabios_32bit_smp2.txt").read_text())
    assert (first.cs_base, first.segmented, first.pc) == (0x03F3_D000, True, 0x03F3_D000 + 0x2B36)
    assert (second.cs_base, second.segmented, second.pc) == (0, False, second.rip)


def test_protected_mode_bios_is_32_bit_with_the_ap_halted() -> None:
    cpus = parse_all((DATA / "regs_seabios_32bit_smp2.txt").read_text())
    assert len(cpus) == 2
    first, second = cpus
    assert first.bits == second.bits == 32
    assert not first.halted and second.halted
    assert first.cpl == 0
    assert first.rip == 0x2B36
    assert first.rsp == 0x000A1F08 and first.rbp == 0x022E4CB0
    assert first.general["rax"] == 0xFAC83000 and first.general["rcx"] == 0x0001F408
    assert first.cr0 == 0x11
    assert second.rip == 0xFD09A


def test_long_mode_guest_is_64_bit_kernel() -> None:
    cpus = parse_all((DATA / "regs_guest_longmode.txt").read_text())
    first = cpus[0]
    assert first.bits == 64
    assert first.cpl == 0
    assert first.rip >= 0xFFFFFFFF80000000
    assert first.general["r15"] is not None
    assert first.efer & 0x500 == 0x500  # LME and LMA
    assert first.cr3 != 0


def test_garbage_raises_parse_error() -> None:
    with pytest.raises(RegisterParseError):
        parse_all("unknown command: 'info'\n")


def test_block_without_rip_raises_parse_error() -> None:
    with pytest.raises(RegisterParseError, match="rip"):
        parse_all("CPU#0\nRAX=0000000000000000\nCS =0008 0 ffffffff 00a09b00\n")


#: The first three were saved with plain newlines; the last is a reply's text exactly
#: as QMP delivers it, with CR LF line ends.
SAVED_DUMPS = (
    "regs_reset_realmode_smp2",
    "regs_seabios_32bit_smp2",
    "regs_guest_longmode",
    "regs_guest_longmode_smp2_qmp",
)


def saved_dump(name: str) -> str:
    """A saved dump with its line ends as they are (read_text would turn CR LF into LF)."""
    return (DATA / f"{name}.txt").read_bytes().decode()


@pytest.mark.parametrize("name", SAVED_DUMPS)
def test_qemu_7s_layout_is_matched_where_it_is_expected(name: str) -> None:
    """Each vCPU block of QEMU 7.2's dumps is read in one match (the whole block), and
    line by line the same registers come out: the fallbacks are never needed for it."""
    text = saved_dump(name)
    blocks = re.split(r"CPU#\d+\r?\n", text)[1:]
    assert blocks
    whole = (registers._LONG_BLOCK, registers._LEGACY_BLOCK)
    assert all(any(p.match(block) for p in whole) for block in blocks)
    assert all(registers._laid_out(block) is not None for block in blocks)
    for vcpu, block in enumerate(blocks):
        assert registers.parse_one(block, vcpu) == registers._from_lines(block, vcpu)


@pytest.mark.parametrize("name", SAVED_DUMPS)
def test_an_unfamiliar_layout_parses_like_qemu_7s(name: str) -> None:
    """A register QEMU might print first some day moves every other one: the parser
    falls back from matching QEMU 7's layout to collecting each NAME=value."""
    text = saved_dump(name)
    unfamiliar = re.sub(r"^([RE]AX=)", r"NEW=0 \1", text, flags=re.MULTILINE)
    assert unfamiliar != text
    assert parse_all(unfamiliar) == parse_all(text)


@pytest.mark.parametrize("examples", examples(300))
def test_damaged_dumps_parse_or_raise_parse_error(examples: int) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(
        name=st.sampled_from(SAVED_DUMPS),
        start=st.integers(min_value=0, max_value=3000),
        length=st.integers(min_value=0, max_value=200),
        inserted=st.text(alphabet="RAXCSEF0123456789abcdef= \n[]#", max_size=30),
    )
    def check(name: str, start: int, length: int, inserted: str) -> None:
        text = saved_dump(name)
        damaged = text[:start] + inserted + text[start + length :]
        try:
            cpus = parse_all(damaged)
        except RegisterParseError:
            return
        assert all(cpu.bits in (16, 32, 64) for cpu in cpus)

    check()


def repetition_bounds(pattern: re.Pattern[str]) -> list[int]:
    """The upper bound of every repetition in `pattern` (MAXREPEAT for `*`, `+`, `{n,}`),
    read from the parse tree the re module compiles it from."""
    from re import _constants, _parser  # type: ignore[attr-defined]

    repeats = (_constants.MAX_REPEAT, _constants.MIN_REPEAT, _constants.POSSESSIVE_REPEAT)
    bounds = []
    pending: list[object] = [_parser.parse(pattern.pattern, pattern.flags)]
    while pending:
        node = pending.pop()
        if isinstance(node, _parser.SubPattern):
            for op, value in node:
                if op in repeats:
                    bounds.append(value[1])
                pending.append(value)
        elif isinstance(node, (list, tuple)):
            pending.extend(node)
    return bounds


def test_every_register_pattern_reads_a_bounded_number_of_characters_per_attempt() -> None:
    """Linear parsing, argued from structure rather than timed: with every repetition
    bounded, one match attempt reads a fixed number of characters at most, so a search
    over n characters does O(n) work. An unbounded `[A-Z0-9]*` in the fallback scan
    took 10 s on 32 KB of capitals (each position rescanned the rest of the run)."""
    from re import _constants  # type: ignore[attr-defined]

    patterns = {n: v for n, v in vars(registers).items() if isinstance(v, re.Pattern)}
    assert {"_ASSIGNMENT", "_LONG_MODE", "_LEGACY_MODE", "_SEGMENT"} <= patterns.keys()
    for name, pattern in patterns.items():
        bounds = repetition_bounds(pattern)
        assert bounds, name
        assert _constants.MAXREPEAT not in bounds, f"{name} has an unbounded repetition"
        assert max(bounds) <= 64, name


def test_the_bound_check_sees_an_unbounded_repetition() -> None:
    from re import _constants  # type: ignore[attr-defined]

    assert _constants.MAXREPEAT in repetition_bounds(re.compile(r"\b(?:[A-Z]{1,4}|x+)="))
    assert _constants.MAXREPEAT not in repetition_bounds(re.compile(r"\b(?:[A-Z]{1,4}|x?)="))


@pytest.mark.parametrize(
    "body",
    [
        "A" * 1_000_000,  # the fuzz find: a run of capitals with no '='
        "RAX=0 " * 200_000,
        "RAX=0 RBX=0 RCX=0 RDX=0 RSI=0 RDI=0 RBP=0 RSP=0 R8 =0 R9 =0 R10=0 R11=0 R12=0 "
        "R13=0 R14=0 R15=0 RIP=0 RFL=0 [---] CPL=" + "0" * 1_000_000,
        "CS " + " " * 1_000_000,
        "\nCS =" + "0" * 1_000_000,
        "A=" + "f" * 1_000_000,
    ],
    ids=["capitals", "assignments", "cpl-digits", "cs-spaces", "cs-digits", "long-value"],
)
def test_a_megabyte_of_unexpected_text_is_refused_in_one_pass(body: str) -> None:
    with pytest.raises(RegisterParseError):
        parse_all("CPU#0\n" + body)


def test_the_task_state_segments_base_is_read_from_a_linux_dump() -> None:
    """Linux 6.1 (tests/unit/data/linux/tasks.json) gives each CPU a TSS of its own in its
    cpu_entry_area: the base is the second field of each block's TR line."""
    text = json.loads((DATA / "linux" / "tasks.json").read_text())["registers"]
    tr_lines = [line.split() for line in text.splitlines() if line.startswith("TR =")]
    cpus = parse_all(text)
    assert [cpu.tr_base for cpu in cpus] == [int(fields[2], 16) for fields in tr_lines]
    assert len({cpu.tr_base for cpu in cpus}) == len(cpus) > 1
    assert all(cpu.tr_base >= 0xFFFF_FE00_0000_0000 for cpu in cpus)


def test_the_fs_base_is_parsed_for_i386_linuxs_per_cpu_area() -> None:
    """The i386 Linux guest's dump (tests/unit/data/linux/i386/tasks.json): in kernel mode
    FS (selector 0xd8) is the per-CPU segment, in user mode 0."""
    recorded = json.loads((Path(__file__).parent / "data/linux/i386/tasks.json").read_text())
    user, kernel = parse_all(recorded["registers"])
    assert (user.cpl, user.fs_base, user.bits) == (3, 0, 32)
    assert (kernel.cpl, kernel.fs_base, kernel.bits) == (0, 0x05C2_3000, 32)


def test_a_halted_vcpus_block_unchanged_since_the_last_dump_is_not_parsed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vCPU 1 of the saved BIOS dump is halted, vCPU 0 is not: dumped again unchanged,
    only vCPU 0 is parsed again; each dump gets RegisterSet objects of its own."""
    text = saved_dump("regs_seabios_32bit_smp2")
    parsed = registers.ParsedRegisters()
    first = parsed.parse(text)
    assert first == parse_all(text)
    assert [cpu.halted for cpu in first] == [False, True]
    calls: list[int] = []
    parse_one = registers.parse_one

    def counted(block: str, vcpu: int) -> RegisterSet:
        calls.append(vcpu)
        return parse_one(block, vcpu)

    monkeypatch.setattr(registers, "parse_one", counted)
    again = parsed.parse(text)
    assert calls == [0]
    assert again == first
    assert all(a is not b for a, b in zip(again, first, strict=True))
    moved = text.replace("EIP=000fd09a", "EIP=000fd09b")
    assert moved != text
    assert parsed.parse(moved)[1].rip == 0xFD09B
    assert calls == [0, 0, 1]  # vCPU 1 moved: parsed again
