"""PLT stubs named as objdump names them (`qsort@plt`), in programs gcc builds here with
the classic PLT and with IBT's second PLT (.plt.sec); the oracle is objdump -d."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from qmpprof.modules import load_module
from tests.unit.conftest import build_elf
from tests.unit.i386_builds import build_i386

_STUB = re.compile(r"^([0-9a-f]+) <(\S+@plt)>:$")


def objdump_stubs(path: Path) -> dict[int, str]:
    """Each PLT stub's address and objdump's name for it."""
    command = ["objdump", "-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got", str(path)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    found = (_STUB.match(line) for line in out.splitlines())
    return {int(m.group(1), 16): m.group(2) for m in found if m and "-0x" not in m.group(2)}


@pytest.mark.parametrize(
    "flags",
    [
        ("-O1", "-fPIE", "-pie", "-fno-builtin"),
        ("-O1", "-fPIE", "-pie", "-fno-builtin", "-fcf-protection=full", "-Wl,-z,ibtplt"),
        ("-O1", "-fno-pie", "-no-pie", "-fno-builtin", "-Wl,-z,now"),
    ],
)
def test_every_plt_stub_is_named_as_objdump_names_it(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    program = build_elf("plt_calls.c", tmp_path, *flags)
    expected = objdump_stubs(program)
    assert {"qsort@plt", "getenv@plt", "strlen@plt"} <= set(expected.values()), expected
    symbols = load_module(program).symbols
    for address, name in expected.items():
        hit = symbols.lookup(address)
        assert hit is not None and hit[0].name == name and hit[1] == 0, (hex(address), hit)


@pytest.mark.parametrize(
    "flags",
    [
        ("-O1", "-shared", "-fPIC"),
        ("-O1", "-shared", "-fPIC", "-fcf-protection=full", "-Wl,-z,ibtplt"),
    ],
)
def test_i386_plt_stubs_relative_to_the_got_are_named(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """Position-independent i386 code jumps through `disp32(%ebx)`, %ebx = .got.plt."""
    library = build_i386("i386/plt_calls.c", tmp_path, *flags)
    assert_named_as_objdump_names(library, "external@plt")


def test_i386_plt_stubs_of_an_executable_jump_through_absolute_slots(tmp_path: Path) -> None:
    """An i386 executable (not position-independent) jumps through `*abs32`."""
    (tmp_path / "lib").mkdir()
    library = build_i386("i386/external.c", tmp_path / "lib", "-O1", "-shared", "-fPIC")
    program = tmp_path / "plt_calls"
    source = Path(__file__).parent / "data" / "i386" / "plt_calls.c"
    command = ["gcc", "-m32", "-ffreestanding", "-nostdlib", "-fno-pie", "-no-pie", "-O1"]
    link = ["-Wl,-e,calls_out", "-o", str(program), str(source), str(library)]
    subprocess.run([*command, *link], check=True, capture_output=True)
    assert_named_as_objdump_names(program, "external@plt")


def assert_named_as_objdump_names(path: Path, *names: str) -> None:
    expected = objdump_stubs(path)
    assert set(names) <= set(expected.values()), expected
    symbols = load_module(path).symbols
    for address, name in expected.items():
        hit = symbols.lookup(address)
        assert hit is not None and hit[0].name == name and hit[1] == 0, (hex(address), hit)
