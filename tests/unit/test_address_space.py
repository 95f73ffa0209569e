"""Modules mapped away from their link address: a position-independent program under GDB.

cfi_chain.c is built as a static PIE; GDB runs it (loaded at an address of the kernel's
choosing) and stops on every instruction of the chain. The load bias is where GDB sees
`main` minus where nm sees it in the file. Unwinding and symbolizing GDB's registers and
stack bytes through a mapping with that bias must give GDB's frames and nm's names.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from qmpprof.address_space import (
    AddressSpace,
    Mapping,
    kernel_mapping,
    kernel_mappings,
    user_mapping,
)
from qmpprof.analysis import Analyzer
from qmpprof.errors import MemoryFault
from qmpprof.model import (
    KERNEL_HALF,
    FrameAddress,
    FrameKind,
    KernelModule,
    MemoryWindow,
    RawSample,
    RegisterSet,
)
from qmpprof.modules import Module, load_module
from qmpprof.symbols.symbolizer import Symbolizer
from tests.linux_vm import kernel_abis
from tests.unit.conftest import CHAIN_FUNCTIONS, build_elf, capture_with_gdb
from tests.unit.i386_builds import build_i386
from tests.unit.test_symbols import nm_functions

Stops = list[dict[str, object]]


@pytest.fixture(scope="module")
def pie_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Stops, int]:
    """(the PIE, GDB's stops, its load bias)."""
    out = tmp_path_factory.mktemp("pie")
    elf = build_elf("cfi_chain.c", out, "-g", "-O2", "-fomit-frame-pointer", "-static-pie")
    stops = capture_with_gdb(elf, CHAIN_FUNCTIONS, out / "stops.jsonl", pie=True)
    bias = int(str(stops[0]["main"])) - nm_functions(elf)["main"][0]
    return elf, stops, bias


def raw_sample(stop: dict[str, object]) -> RawSample:
    general = stop["registers"]
    assert isinstance(general, dict)
    registers = RegisterSet(0, general, cs=0x33, cpl=3, halted=False, bits=64, cr3=0x1000)
    window = MemoryWindow(int(str(stop["stack_base"])), bytes.fromhex(str(stop["stack"])))
    return RawSample(0.0, registers, (window,), user_module="chain")


def test_a_pie_unwinds_and_symbolizes_as_gdb_sees_it(pie_capture: tuple[Path, Stops, int]) -> None:
    elf, stops, bias = pie_capture
    assert bias != 0 and bias % 4096 == 0, "the program ran at its link address"
    assert len(stops) > 40, "GDB stopped too rarely: the capture did not work"
    analyzer = Analyzer(users={"chain": load_module(elf, "chain")}, biases={"chain": bias})
    functions = nm_functions(elf)
    wrong = []
    for stop in stops:
        sample = analyzer.analyze(raw_sample(stop))
        gdb_frames = stop["frames"]
        assert isinstance(gdb_frames, list)
        ours = [frame.address.address for frame in sample.frames]
        leaf_name = sample.frames[0].function
        leaf_file_address = gdb_frames[0] - bias
        start, size = functions[str(leaf_name)] if leaf_name in functions else (0, 0)
        if ours != gdb_frames or not start <= leaf_file_address < start + size:
            wrong.append((gdb_frames, ours, leaf_name))
    assert not wrong, f"{len(wrong)} of {len(stops)} stops differ, first: {wrong[0]}"


def test_without_its_bias_the_pie_is_not_understood(pie_capture: tuple[Path, Stops, int]) -> None:
    elf, stops, _ = pie_capture
    analyzer = Analyzer(users={"chain": load_module(elf, "chain")})
    assert all(analyzer.analyze(raw_sample(stop)).frames[0].function is None for stop in stops)


@pytest.fixture(scope="module")
def chain_module(pie_capture: tuple[Path, Stops, int]) -> Module:
    return load_module(pie_capture[0], "chain")


def test_code_is_read_at_guest_addresses(chain_module: Module) -> None:
    bias = 0x5555_0000_0000
    space = AddressSpace(user_mapping(chain_module, bias))
    main = chain_module.symbols.find("main")
    assert main is not None
    assert space.code.read(main.address + bias, 16) == chain_module.code.read(main.address, 16)
    with pytest.raises(MemoryFault) as fault:
        space.code.read(main.address, 16)  # the file address is not where the code is
    assert fault.value.address == main.address


def test_a_mapping_covers_only_its_range(chain_module: Module) -> None:
    low = Mapping(chain_module, 0x1000, 0x2000)
    high = Mapping(chain_module, 0x3000, KERNEL_HALF, bias=0x3000)
    space = AddressSpace([high, low])
    assert space.mapping_at(0x1000) is low and space.mapping_at(0x1FFF) is low
    assert space.mapping_at(0x2000) is None and space.mapping_at(0xFFF) is None
    assert space.mapping_at(0x3000) is high and space.mapping_at(KERNEL_HALF) is None
    assert space.return_sites.check(0x2800) is None  # nothing mapped: unknown, not torn


def test_overlapping_mappings_are_refused(chain_module: Module) -> None:
    with pytest.raises(ValueError, match="overlaps"):
        AddressSpace([Mapping(chain_module, 0, 0x2000), Mapping(chain_module, 0x1000, 0x3000)])


def test_a_kernel_linked_low_covers_its_code_and_the_user_program_the_rest(
    chain_module: Module,
) -> None:
    """A unikernel or firmware linked in the lower half keeps its own code's range."""
    low_kernel = kernel_mapping(chain_module)
    start, end = chain_module.extent
    assert (low_kernel.start, low_kernel.end) == (start, end) and start < end
    users = user_mapping(chain_module, 0, low_kernel)
    assert [(m.start, m.end) for m in users] == [(0, start), (end, KERNEL_HALF)]
    high_kernel = kernel_mapping(chain_module, bias=KERNEL_HALF)
    assert (high_kernel.start, high_kernel.end) == (KERNEL_HALF, 1 << 64)


@pytest.mark.slow
def test_a_linux_kernels_file_does_not_judge_its_return_addresses() -> None:
    """Linux rewrites its code at boot (paravirt calls, alternatives): a return address
    after a call the guest runs can follow another instruction in the vmlinux (seen:
    idle and read_zero stacks called torn). A kernel with ORC gives no verdict; the same
    file without its ORC is judged by its bytes."""
    vmlinux = Path.home() / ".cache" / "qmpprof" / "linux" / kernel_abis()[0] / "vmlinux"
    if not vmlinux.exists():
        pytest.skip(f"{vmlinux} is not cached (make linux-guest)")
    kernel = load_module(vmlinux)
    entry = kernel.symbols.find("do_syscall_64")
    assert kernel.orc is not None and entry is not None
    not_after_a_call = entry.address + 1
    assert AddressSpace([kernel_mapping(kernel)]).return_sites.check(not_after_a_call) is None
    plain = AddressSpace([kernel_mapping(replace(kernel, orc=None))])
    assert plain.return_sites.check(not_after_a_call) is False


def test_a_32_bit_kernel_linked_high_owns_its_upper_gigabytes(tmp_path: Path) -> None:
    """An ELF32 kernel at 0xc0100000 (Linux's 3G/1G split, the example guest's i386
    build): every address from 0xc0000000 up is the kernel's, below is the user's, and
    the frames say so (x86-64's half starts far above 32-bit addresses)."""
    (tmp_path / "kernel").mkdir()
    (tmp_path / "user").mkdir()
    elf = build_i386("i386/chain.c", tmp_path / "kernel", "-O2", "-Wl,-Ttext-segment=0xc0100000")
    kernel = load_module(elf, "kernel")
    assert kernel.word == 4 and kernel.extent[0] >= 0xC010_0000
    user = load_module(build_i386("i386/chain.c", tmp_path / "user", "-O2"), "user")
    taken = kernel_mapping(kernel)
    space = AddressSpace([taken, *user_mapping(user, 0, taken)])
    assert (taken.start, taken.end, taken.kernel) == (0xC000_0000, 1 << 32, True)
    assert [space.in_kernel(a) for a in (0xC000_0000, kernel.extent[0], 0xFFFF_F000)] == [True] * 3
    assert not space.in_kernel(user.extent[0]) and not space.in_kernel(0xBFFF_FFFF)
    symbolizer = Symbolizer(space)
    kernel_frame = symbolizer.symbolize(FrameAddress(kernel.extent[0], FrameKind.INSTRUCTION))
    user_frame = symbolizer.symbolize(FrameAddress(user.extent[0], FrameKind.INSTRUCTION))
    assert kernel_frame.is_kernel and not user_frame.is_kernel


def test_a_64_bit_kernels_half_is_x86_64s(chain_module: Module) -> None:
    space = AddressSpace([kernel_mapping(chain_module, KERNEL_HALF), *user_mapping(chain_module)])
    assert space.in_kernel(KERNEL_HALF) and space.in_kernel((1 << 64) - 1)
    assert not space.in_kernel(KERNEL_HALF - 1) and not space.in_kernel(0xC000_0000)


def test_the_kernel_half_starts_where_it_did_before_modules_cut_it(chain_module: Module) -> None:
    """A loaded module cuts the kernel's mapping in pieces, the last reaching the top:
    the half still starts at x86-64's, and every piece's addresses are the kernel's."""
    module = KernelModule("loop", 0xFFFF_FFFF_C000_0000, 0x4000)
    mappings = kernel_mappings(chain_module, KERNEL_HALF, (module,))
    space = AddressSpace([*mappings, *user_mapping(chain_module)])
    assert len(mappings) == 3 and space.kernel_floor == KERNEL_HALF
    inside = (KERNEL_HALF, module.base, module.end, (1 << 64) - 1)
    assert all(space.in_kernel(address) for address in inside)
    assert not space.in_kernel(KERNEL_HALF - 1)
