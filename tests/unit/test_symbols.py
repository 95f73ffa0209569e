"""Symbolization of a real ELF built from data/symbols.c, checked against binutils' nm."""

import gc
import subprocess
from pathlib import Path

import pytest

from qmpprof.errors import BadElf
from qmpprof.guest.example import ExampleGuestAdapter
from qmpprof.model import FrameAddress, FrameKind, MappedFile
from qmpprof.modules import load_module
from qmpprof.symbols.elf import SymbolTable, collector_paused, load_symbols
from qmpprof.symbols.symbolizer import Symbolizer
from tests.fuzz.elf_edit import (
    E_MACHINE,
    E_SHOFF,
    EM_RISCV,
    SHT_NOBITS,
    section,
    with_field,
    with_section_field,
)
from tests.unit.conftest import build_elf


def nm_functions(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (address, size) of text symbols, as nm prints them."""
    return nm_symbols(path, "tT", sized=True)  # type: ignore[return-value]


def nm_symbols(path: Path, kinds: str = "dDbBrR", sized: bool = False) -> dict[str, object]:
    """name -> address (or (address, size) when `sized`) of symbols of the nm `kinds`."""
    out = subprocess.run(
        ["nm", "-S", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, object] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in kinds:
            address, size = int(parts[0], 16), int(parts[1], 16)
            found[parts[3]] = (address, size) if sized else address
    return found


def test_every_function_nm_knows_is_found_at_start_middle_and_end(symbols_elf: Path) -> None:
    table = load_symbols(symbols_elf)
    functions = nm_functions(symbols_elf)
    for name in ("leaf", "middle", "helper", "main"):
        address, size = functions[name]
        for probe in (address, address + size // 2, address + size - 1):
            hit = table.lookup(probe)
            assert hit is not None and hit[0].name == name
            assert hit[1] == probe - address


class Unbiased:
    """One symbol table at its file addresses (a SymbolSource)."""

    def __init__(self, table: SymbolTable) -> None:
        self.table = table

    def symbols_at(self, address: int) -> tuple[SymbolTable, int] | None:
        return self.table, 0

    def file_at(self, address: int) -> MappedFile | None:
        return None

    def in_kernel(self, address: int) -> bool:
        return False


def test_return_address_names_the_calling_function(symbols_elf: Path) -> None:
    table = load_symbols(symbols_elf)
    address, size = nm_functions(symbols_elf)["middle"]
    symbolizer = Symbolizer(Unbiased(table))
    # A return address just past the end of `middle` still belongs to the call in `middle`.
    frame = symbolizer.symbolize(FrameAddress(address + size, FrameKind.RETURN))
    assert frame.function == "middle"
    assert frame.offset == size
    unknown = symbolizer.symbolize(FrameAddress(0x10, FrameKind.INSTRUCTION))
    assert unknown.function is None and unknown.label() == "0x10"


def test_a_text_file_is_a_bad_elf(tmp_path: Path) -> None:
    not_elf = tmp_path / "kernel.txt"
    not_elf.write_text("hello\n")
    with pytest.raises(BadElf, match="not a readable ELF"):
        load_symbols(not_elf)


def test_a_missing_file_is_a_bad_elf(tmp_path: Path) -> None:
    with pytest.raises(BadElf, match="No such file"):
        load_symbols(tmp_path / "missing.elf")


def test_no_symbol_claims_addresses_beyond_its_section(symbols_elf: Path) -> None:
    table = load_symbols(symbols_elf)
    assert table.lookup(0xFFFFFFFF80100000) is None


def test_a_32_bit_x86_elf_is_read(tmp_path: Path) -> None:
    elf = build_elf(
        "symbols.c", tmp_path, "-m32", "-nostdlib", "-static", "-O1",
        "-Wl,--defsym=puts=leaf", "-Wl,-e,main",
    )  # fmt: skip
    module = load_module(elf)
    functions = nm_functions(elf)
    assert {"leaf", "middle", "main"} <= functions.keys()
    for name in ("leaf", "middle", "main"):
        symbol = module.symbols.find(name)
        assert symbol is not None and (symbol.address, symbol.size) == functions[name]


def test_an_elf_of_another_machine_is_refused_in_one_line(
    symbols_elf: Path, tmp_path: Path
) -> None:
    riscv = tmp_path / "riscv.elf"
    riscv.write_bytes(with_field(symbols_elf.read_bytes(), E_MACHINE, "<H", EM_RISCV))
    assert (
        "RISC-V"
        in subprocess.run(["readelf", "-h", str(riscv)], capture_output=True, text=True).stdout
    )
    with pytest.raises(
        BadElf, match=r"built for RISCV \(EM_RISCV\): qmpprof profiles x86 and AArch64"
    ) as error:
        load_module(riscv)
    assert "\n" not in str(error.value)
    assert ExampleGuestAdapter.from_kernel(riscv) is None


#: (section, header field, value, what BadElf says): damage pyelftools would have
#: turned into a MemoryError, a ZeroDivisionError or an OverflowError.
DAMAGE = [
    (".text", "sh_size", 1 << 50, "section .* lies outside the file"),
    (".text", "sh_offset", 1 << 63, "section .* lies outside the file"),
    (".symtab", "sh_entsize", 0, "entries of 0 bytes|entry size of section '.symtab'"),
    (".shstrtab", "sh_offset", (1 << 64) - 8, "lies outside the file|not a readable ELF"),
    (".debug_info", "sh_type", SHT_NOBITS, None),  # its size fits the file: loads
    (".text", "sh_type", SHT_NOBITS, None),  # no .text bytes, no code: loads
]


@pytest.mark.parametrize("name, field, value, message", DAMAGE)
def test_damaged_section_headers_give_one_line_or_a_module(
    symbols_elf: Path, tmp_path: Path, name: str, field: str, value: int, message: str | None
) -> None:
    damaged = tmp_path / "damaged.elf"
    damaged.write_bytes(with_section_field(symbols_elf.read_bytes(), name, field, value))
    if message is None:
        load_module(damaged)
        return
    with pytest.raises(BadElf, match=message) as error:
        load_module(damaged)
    assert "\n" not in str(error.value)


def test_a_nobits_debug_section_larger_than_the_file_is_refused(
    symbols_elf: Path, tmp_path: Path
) -> None:
    """pyelftools would make 2**50 zero bytes of it when DWARF is read."""
    data = with_section_field(symbols_elf.read_bytes(), ".debug_info", "sh_type", SHT_NOBITS)
    damaged = tmp_path / "damaged.elf"
    damaged.write_bytes(with_section_field(data, ".debug_info", "sh_size", 1 << 50))
    with pytest.raises(BadElf, match="claims 1125899906842624 bytes without storing them"):
        load_module(damaged)


def test_a_section_table_past_the_end_of_the_file_is_refused(
    symbols_elf: Path, tmp_path: Path
) -> None:
    damaged = tmp_path / "damaged.elf"
    data = symbols_elf.read_bytes()
    damaged.write_bytes(with_field(data, E_SHOFF, "<Q", len(data) - 64))
    with pytest.raises(BadElf, match="section header table does not fit"):
        load_module(damaged)


def test_sections_claiming_more_than_the_file_are_refused(
    symbols_elf: Path, tmp_path: Path
) -> None:
    """Every section may lie inside the file and still claim it many times over
    (65,535 headers each naming all of it): the bytes read are bounded by the file."""
    data = symbols_elf.read_bytes()
    text = section(data, ".text")
    for other in (".rodata", ".data"):
        data = with_section_field(data, other, "sh_offset", text.offset)
        data = with_section_field(data, other, "sh_size", len(data) - text.offset)
    damaged = tmp_path / "damaged.elf"
    damaged.write_bytes(data)
    with pytest.raises(BadElf, match=r"its sections claim \d+ bytes, more than the file's"):
        load_module(damaged)


def test_a_symbol_table_of_odd_sized_entries_is_refused(symbols_elf: Path, tmp_path: Path) -> None:
    """One entry as large as the whole table divides its size, as pyelftools checks,
    and would read every symbol from the wrong place."""
    data = symbols_elf.read_bytes()
    size = section(data, ".symtab").size
    damaged = tmp_path / "damaged.elf"
    damaged.write_bytes(with_section_field(data, ".symtab", "sh_entsize", size))
    with pytest.raises(BadElf, match=f"section [0-9]+ \\(.symtab\\) has entries of {size} bytes"):
        load_module(damaged)


@pytest.mark.parametrize("flags", [("-O1", "-g"), ("-O2", "-no-pie"), ("-O0", "-static")])
def test_every_sized_function_nm_lists_is_in_the_table(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """The symbol table is unpacked in bulk: checked against nm for whole binaries
    (a static one has thousands of functions, aliases and labels)."""
    elf = build_elf("symbols.c", tmp_path, *flags)
    table = load_symbols(elf)
    expected = {(a, n) for a, n in nm_functions(elf).values() if n}
    found = {(hit[0].address, hit[0].size) for a, _ in expected if (hit := table.lookup(a))}
    assert len(expected) > 3 and found == expected


def test_the_collector_is_paused_while_loading_and_left_as_it_was() -> None:
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
    gc.enable()


def test_a_label_inside_a_function_is_named_as_gdb_names_it(tmp_path: Path) -> None:
    """GDB prefers the sized symbol that contains an address to a zero-size label after
    it (its minimal-symbol lookup), and so does perf: the kernel's
    entry_SYSCALL_64_after_hwframe is entry_SYSCALL_64's code. A label inside no sized
    symbol keeps its name."""
    elf = build_elf("labels.S", tmp_path, "-nostdlib", "-static", "-no-pie")
    table = load_symbols(elf)
    inner = int(_nm(elf)["inner_label"], 16)
    lone = int(_nm(elf)["lone_label"], 16)
    for address in (inner, inner + 1, lone):
        found = table.lookup(address)
        assert found is not None
        ours = f"{found[0].name} + {found[1]}" if found[1] else found[0].name
        assert ours == _gdb_info_symbol(elf, address)


def test_every_symbol_nm_lists_starts_code_a_label_inside_a_function_too(
    tmp_path: Path,
) -> None:
    """Where a function starts decides whether the return address is at RSP (the
    unwinder's starts_function): a label inside a sized function starts code a call
    may enter (the kernel's retpoline thunks inside __x86_indirect_thunk_array), so
    every address nm lists starts one, and the bytes after it none."""
    elf = build_elf("labels.S", tmp_path, "-nostdlib", "-static", "-no-pie")
    table = load_symbols(elf)
    listed = {int(address, 16) for address in _nm(elf).values()}
    code = {int(_nm(elf)[name], 16) for name in ("_start", "inner_label", "lone_label")}
    assert code <= listed
    for address in code:
        assert table.starts_at(address)
        assert not table.starts_at(address + 1)


def _nm(elf: Path) -> dict[str, str]:
    lines = subprocess.run(["nm", str(elf)], capture_output=True, text=True, check=True).stdout
    return {parts[2]: parts[0] for parts in (line.split() for line in lines.splitlines())}


def _gdb_info_symbol(elf: Path, address: int) -> str:
    """`info symbol` in GDB: "NAME + OFFSET in section .text", or "NAME in section"."""
    done = subprocess.run(
        ["gdb", "-nx", "-batch", "-ex", f"info symbol {address:#x}", str(elf)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split(" in section")[0].strip()


def test_arm_mapping_symbols_name_no_function(tmp_path: Path) -> None:
    """An AArch64 file's `$x` and `$d` (Arm's mapping symbols: code or data from here)
    are no functions: every address of each function nm lists is named by it."""
    elf = build_elf("cfi_chain.c", tmp_path, "-O2", "-g", "-static", cc="aarch64-linux-gnu-gcc")
    listed = subprocess.run(["nm", str(elf)], capture_output=True, text=True, check=True).stdout
    assert " $x" in listed and " $d" in listed  # what is left out is there
    table = load_symbols(elf)
    assert not [symbol.name for symbol in table if symbol.name.startswith("$")]
    for name, (address, size) in nm_functions(elf).items():
        for at in {address, address + size // 2, address + max(size, 1) - 1}:
            found = table.lookup(at)
            assert found is not None and found[0].address == address, (name, hex(at), found)
