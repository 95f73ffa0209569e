"""The OS adapter is chosen by probing symbols of real ELF files built from sources
in data/, without reading their DWARF."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.guest import dwarf_types
from qmpprof.guest.example import ExampleGuestAdapter
from qmpprof.guest.registry import choose_adapter, kernel_facts
from tests.fuzz.elf_edit import section
from tests.unit.conftest import build_elf
from tests.unit.test_symbols import nm_symbols


@pytest.fixture(scope="module")
def elves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("registry")
    return {
        "example": build_elf("os_layout.c", out, "-g", "-O0", "-no-pie"),
        "linux": build_elf("linux_probe.c", out, "-g", "-O0", "-no-pie"),
        "plain": build_elf("symbols.c", out, "-O1", "-g"),
    }


def without_dwarf(elf: Path, out: Path) -> Path:
    """`elf` with its .debug_info zeroed: any DWARF read would find nothing."""
    data = bytearray(elf.read_bytes())
    info = section(bytes(data), ".debug_info")
    data[info.offset : info.offset + info.size] = bytes(info.size)
    out.write_bytes(data)
    return out


def test_each_kernel_gets_the_adapter_its_symbols_call_for(elves: dict[str, Path]) -> None:
    assert choose_adapter(elves["example"]).name == "example-guest"
    assert choose_adapter(elves["linux"]).name == "linux"
    assert choose_adapter(elves["plain"]).name == "generic"


def test_linux_is_chosen_without_its_dwarf(elves: dict[str, Path], tmp_path: Path) -> None:
    assert choose_adapter(without_dwarf(elves["linux"], tmp_path / "no-dwarf.elf")).name == "linux"


def test_probe_addresses_are_the_symbol_tables(elves: dict[str, Path]) -> None:
    facts = kernel_facts(elves["linux"])
    assert facts is not None
    expected = {name: nm_symbols(elves["linux"])[name] for name in ("linux_banner", "init_task")}
    assert facts.symbols == expected
    assert ".debug_info" in facts.sections


def test_example_adapter_without_its_struct_is_not_chosen(
    elves: dict[str, Path], tmp_path: Path
) -> None:
    """cpu_current is there but struct process cannot be read: generic, no error."""
    stripped = without_dwarf(elves["example"], tmp_path / "example-no-dwarf.elf")
    assert choose_adapter(stripped).name == "generic"


def test_not_an_elf_gets_the_generic_adapter(tmp_path: Path) -> None:
    (tmp_path / "not.elf").write_bytes(b"not an ELF file")
    assert choose_adapter(tmp_path / "not.elf").name == "generic"


def test_the_struct_scan_is_bounded(
    elves: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With too small a budget the layout is absent (the adapter does not apply); with
    the default one it is found."""
    assert ExampleGuestAdapter.from_kernel(elves["example"]) is not None
    monkeypatch.setattr(dwarf_types, "MAX_SCANNED_DIES", 2)
    assert ExampleGuestAdapter.from_kernel(elves["example"]) is None
