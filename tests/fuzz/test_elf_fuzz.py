"""Hostile ELF files: a damaged kernel or user binary loads, or raises one line of
BadElf; never another exception, a huge allocation or an endless loop.

The files are real: symbols.c and os_layout.c built by gcc, and the example guest's
kernel. The cases change bytes anywhere in a file, or single bytes of the parts
pyelftools trusts most: the ELF header, the section header table (sizes, offsets,
types, links), .shstrtab, .symtab, .strtab and the DWARF sections.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadElf, MemoryFault
from qmpprof.guest.example import ExampleGuestAdapter
from qmpprof.modules import Module, load_module
from tests.fuzz.budget import counted
from tests.fuzz.elf_edit import sections
from tests.fuzz.file_budget import file_cases
from tests.unit.conftest import build_elf

KERNEL = Path(__file__).parents[2] / "examples/guest/build/nofp/kernel.elf"
TARGETED = (
    ".shstrtab",
    ".symtab",
    ".strtab",
    ".text",
    ".debug_abbrev",
    ".debug_info",
    ".debug_str",
    ".eh_frame",
    ".debug_frame",
)
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


class Target:
    """A pristine ELF, the byte ranges the targeted cases change, and the scratch file
    each case writes its damaged copy to."""

    def __init__(self, elf: Path, scratch: Path) -> None:
        self.data = elf.read_bytes()
        self.scratch = scratch
        spans = sections(self.data)
        self.regions = [(0, 64)]  # the ELF header
        self.regions += [(s.header, 64) for s in spans]  # each section header
        self.regions += [(s.offset, s.size) for s in spans if s.name in TARGETED and s.size]

    def write(self, edits: list[tuple[int, int]]) -> Path:
        data = bytearray(self.data)
        for where, value in edits:
            data[where % len(data)] = value
        self.scratch.write_bytes(data)
        return self.scratch


@pytest.fixture(scope="module")
def gcc_elf(tmp_path_factory: pytest.TempPathFactory) -> Target:
    out = tmp_path_factory.mktemp("elf-fuzz")
    return Target(build_elf("os_layout.c", out, "-g", "-O1", "-no-pie"), out / "damaged.elf")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Target:
    if not KERNEL.is_file():
        pytest.fail(f"{KERNEL} is missing: `make guest` builds it")
    return Target(KERNEL, tmp_path_factory.mktemp("kernel-fuzz") / "damaged.elf")


def load_or_refuse(path: Path) -> Module | None:
    """What `--kernel path` does first: load the module, then look for the example
    guest's bookkeeping. BadElf must be one line; any other exception fails the test."""
    try:
        module = load_module(path)
    except BadElf as error:
        assert "\n" not in str(error)
        return None
    adapter = ExampleGuestAdapter.from_kernel(path)
    if adapter is not None:
        assert adapter.fields.name_size <= 64
    return module


def use(module: Module) -> None:
    """Look up what a profile would: symbols at and around .text, code bytes there."""
    if module.text is None:
        return
    for address in range(module.text.address, module.text.address + 4096, 97):
        module.symbols.lookup(address)
        with contextlib.suppress(MemoryFault):
            module.code.read(address, 16)


anywhere = st.lists(st.tuples(st.integers(0, 1 << 24), st.integers(0, 255)), min_size=1, max_size=4)


def targeted(target: Target) -> st.SearchStrategy[list[tuple[int, int]]]:
    """One byte, in a part of the file pyelftools trusts."""
    region = st.sampled_from(target.regions)
    return st.tuples(region, st.floats(0, 1, exclude_max=True), st.integers(0, 255)).map(
        lambda r: [(r[0][0] + int(r[1] * r[0][1]), r[2])]
    )


@settings(max_examples=file_cases(25), suppress_health_check=SLOW)
@given(edits=anywhere)
@counted
def test_elf_mutated_anywhere(gcc_elf: Target, edits: list[tuple[int, int]]) -> None:
    module = load_or_refuse(gcc_elf.write(edits))
    if module is not None:
        use(module)


@settings(max_examples=file_cases(25), suppress_health_check=SLOW)
@given(data=st.data())
@counted
def test_elf_single_byte_in_headers_and_tables(gcc_elf: Target, data: st.DataObject) -> None:
    module = load_or_refuse(gcc_elf.write(data.draw(targeted(gcc_elf))))
    if module is not None:
        use(module)


@settings(max_examples=file_cases(10), suppress_health_check=SLOW)
@given(data=st.data())
@counted
def test_kernel_single_byte_in_headers_and_tables(kernel: Target, data: st.DataObject) -> None:
    module = load_or_refuse(kernel.write(data.draw(targeted(kernel))))
    if module is not None:
        use(module)


@settings(max_examples=file_cases(10), suppress_health_check=SLOW)
@given(edits=anywhere)
@counted
def test_kernel_mutated_anywhere(kernel: Target, edits: list[tuple[int, int]]) -> None:
    module = load_or_refuse(kernel.write(edits))
    if module is not None:
        use(module)
