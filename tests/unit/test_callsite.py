"""The call-site check against objdump's disassembly of a real binary."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from qmpprof.symbols.image import load_code
from qmpprof.unwind.callsite import follows_call
from tests.unit.conftest import build_elf
from tests.unit.i386_builds import build_chain

_LINE = re.compile(r"^\s*([0-9a-f]+):\s+((?:[0-9a-f]{2} )+)\s*(\S+)")


def instructions(elf: Path) -> list[tuple[int, int, str]]:
    """(address, length, mnemonic) of every instruction objdump decodes."""
    raw = subprocess.run(
        ["objdump", "-d", "-w", str(elf)], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in raw.splitlines():
        match = _LINE.match(line)
        if match:
            length = len(match.group(2).split())
            found.append((int(match.group(1), 16), length, match.group(3)))
    return found


def check_calls(elf: Path, least: int) -> None:
    """Every address after a call follows one; few other instruction boundaries do."""
    code = load_code(elf)
    decoded = instructions(elf)
    after_calls = {address + length for address, length, name in decoded if name == "call"}
    assert len(after_calls) > least
    assert all(follows_call(code, address) for address in after_calls)
    others = [a for a, _, _ in decoded if a not in after_calls]
    false_positives = sum(follows_call(code, address) is True for address in others)
    assert false_positives < 0.05 * len(others)


def test_every_call_of_a_small_program_is_recognised(tmp_path: Path) -> None:
    """The quick version: a dynamic build's own code and crt's, 8 calls (some through the
    PLT) among a few hundred instructions."""
    check_calls(build_elf("cfi_chain.c", tmp_path, "-O2"), least=5)


@pytest.mark.slow
def test_every_call_is_recognised_and_few_other_boundaries_are(tmp_path: Path) -> None:
    """The whole of a static binary: libc's 100,000 instructions, a second of objdump."""
    check_calls(build_elf("cfi_chain.c", tmp_path, "-O2", "-static"), least=100)


def test_unknown_code_is_unknown(tmp_path: Path) -> None:
    code = load_code(build_elf("symbols.c", tmp_path, "-O2"))
    assert follows_call(code, 0xFFFF_FFFF_0000_0000) is None


def test_every_call_of_an_i386_program_is_recognised(tmp_path: Path) -> None:
    """32-bit code: the same call encodings (e8 rel32, ff /2 without REX; a 40-4f byte
    before one is `inc`/`dec` there, not a prefix, and changes nothing)."""
    check_calls(build_chain("O2-omit-fp", tmp_path), least=4)
