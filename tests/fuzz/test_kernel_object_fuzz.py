"""Hostile kernel module files (--module-dir): a damaged .ko loads, or raises one line
of BadElf; never another exception, a huge allocation or an endless loop. The file is
real: the crc8.ko the Linux example guest loads (6.12's, with .orc_header), changed
anywhere or in the parts the loader trusts most (headers, the symbol table, the ORC
tables and their relocations)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadElf, MemoryFault
from qmpprof.symbols.kernel_object import load_kernel_object
from tests.fuzz.budget import counted
from tests.fuzz.elf_edit import sections
from tests.fuzz.file_budget import file_cases
from tests.fuzz.test_elf_fuzz import SLOW, Target, anywhere
from tests.linux_vm import INITRAMFS, initramfs_file, kernel_abis

ORC_SECTIONS = (".orc_unwind", ".orc_unwind_ip", ".rela.orc_unwind_ip")


@pytest.fixture(scope="module")
def ko(tmp_path_factory: pytest.TempPathFactory) -> Target:
    """The elf fuzz's target (headers, symbols, .text) and the ORC sections."""
    if not INITRAMFS.is_file():
        pytest.fail(f"{INITRAMFS} is missing: `make linux-guest` builds it")
    out = tmp_path_factory.mktemp("ko-fuzz")
    pristine = out / "pristine.ko"
    pristine.write_bytes(initramfs_file(f"lib/modules/{kernel_abis()[-1]}/crc8.ko"))
    target = Target(pristine, out / "crc8.ko")
    spans = sections(target.data)
    target.regions += [(s.offset, s.size) for s in spans if s.name in ORC_SECTIONS and s.size]
    return target


def load_and_use(path: Path) -> None:
    try:
        module = load_kernel_object(path, "crc8")
    except BadElf as error:
        assert "\n" not in str(error)
        return
    assert module.extent[1] <= path.stat().st_size + (1 << 21)
    for address in range(0, module.extent[1] + 64, 7):
        module.symbols.lookup(address)
        if module.orc is not None:
            module.orc.row_for(address)
        with contextlib.suppress(MemoryFault):
            module.code.read(address, 16)


@settings(max_examples=file_cases(25), suppress_health_check=SLOW)
@given(edits=anywhere)
@counted
def test_ko_mutated_anywhere(ko: Target, edits: list[tuple[int, int]]) -> None:
    load_and_use(ko.write([(where % len(ko.data), value) for where, value in edits]))


@settings(max_examples=file_cases(25), suppress_health_check=SLOW)
@given(data=st.data())
@counted
def test_ko_single_byte_in_headers_tables_and_orc(ko: Target, data: st.DataObject) -> None:
    region = data.draw(st.sampled_from(ko.regions))
    where = region[0] + data.draw(st.integers(0, max(region[1] - 1, 0)))
    load_and_use(ko.write([(where, data.draw(st.integers(0, 255)))]))
