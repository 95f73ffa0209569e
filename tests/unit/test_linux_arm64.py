"""Debian's arm64 kernel as qmpprof reads it from a guest with no files, on real bytes:

- a VMCOREINFO page 6.1.0-50-cloud-arm64 wrote in a booted guest (saved as it was:
  tests/unit/data/linux/vmcoreinfo-6.1.0-50-cloud-arm64.txt), against that kernel's
  debug vmlinux as binutils reads it (its build-id note, nm's _stext);
- the BTF found by its header in the kernel Image Debian ships (its vmlinuz: the bytes a
  guest has in memory, at link addresses from nm's `_text`) is the debug vmlinux's .BTF
  section, byte for byte, found without the `__start_BTF` symbol kallsyms lacks;
- what that BTF says of per-CPU variables and struct sizes is what nm and pahole say:
  `__entry_task`'s offset in `.data..percpu` is its address less `__per_cpu_start`,
  `pt_regs`'s size pahole's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from qmpprof.errors import BadGuestKernel, MemoryFault
from qmpprof.guest.btf import SIZE, Btf
from qmpprof.guest.linux import vmcoreinfo
from qmpprof.guest.linux.arm64 import PER_CPU_SECTION, PER_CPU_VARIABLES
from qmpprof.guest.linux.btf_search import find_btf
from tests.linux_vm import nm_symbols

DATA = Path(__file__).parent / "data" / "linux"
ABI = "6.1.0-50-cloud-arm64"
SAVED = (DATA / f"vmcoreinfo-{ABI}.txt").read_bytes()
CACHE = Path.home() / ".cache" / "qmpprof" / "linux-arm64"


def kernel_file(name: str) -> Path:
    path = CACHE / ABI / name
    if not path.exists():
        pytest.skip(f"no {path}: make linux-guest-aarch64 fetches it")
    return path


def one(symbols: dict[str, set[int]], name: str) -> int:
    (address,) = symbols[name]
    return address


def test_the_saved_vmcoreinfo_places_the_image_as_the_vmlinux_says() -> None:
    info = vmcoreinfo.parse(SAVED)
    assert info.isa == "aarch64" and info.release == ABI
    vmlinux = kernel_file("vmlinux")
    notes = subprocess.run(["readelf", "-n", str(vmlinux)], capture_output=True, text=True)
    assert info.build_id is not None and f"Build ID: {info.build_id.hex()}" in notes.stdout
    symbols = nm_symbols(vmlinux)
    stext = info.symbol("_stext") or 0
    assert info.link_address(stext) == one(symbols, "_stext")
    uts = info.symbol("init_uts_ns") or 0
    assert info.link_address(uts) == one(symbols, "init_uts_ns")
    # arch/arm64/include/asm/memory.h: an image address is kimage_voffset above its
    # physical one; the guest's RAM starts at PHYS_OFFSET.
    voffset, ram = info.number("kimage_voffset") or 0, info.number("PHYS_OFFSET") or 0
    assert info.physical(uts) == uts - voffset and info.physical(uts) > ram


def test_an_arm64_vmcoreinfo_without_its_image_or_with_another_slide_is_refused() -> None:
    for missing in (b"NUMBER(kimage_voffset)=", b"SYMBOL(_stext)=", b"KERNELOFFSET="):
        lines = [line for line in SAVED.split(b"\n") if not line.startswith(missing)]
        with pytest.raises(BadGuestKernel) as raised:
            vmcoreinfo.parse(b"\n".join(lines))
        assert "\n" not in str(raised.value)
    with pytest.raises(BadGuestKernel):  # a slide is 2 MiB-aligned
        vmcoreinfo.parse(re.sub(rb"KERNELOFFSET=\w+", b"KERNELOFFSET=2cf78e601000", SAVED))
    info = vmcoreinfo.parse(SAVED)
    with pytest.raises(BadGuestKernel):
        info.physical(info.image.start - 1)


def image_reader(image: bytes, text: int) -> vmcoreinfo.PhysicalRead:
    """Reads the Image by link address: its first byte is the vmlinux's `_text`."""

    def read(address: int, size: int) -> bytes:
        offset = address - text
        if offset < 0 or offset + size > len(image):
            raise MemoryFault(address, size)
        return image[offset : offset + size]

    return read


def btf_section(vmlinux: Path, out: Path) -> bytes:
    subprocess.run(
        [
            "aarch64-linux-gnu-objcopy",
            "-O",
            "binary",
            "--only-section=.BTF",
            str(vmlinux),
            str(out),
        ],
        check=True,
    )
    return out.read_bytes()


def test_the_btf_found_in_the_image_is_the_vmlinux_s(tmp_path: Path) -> None:
    vmlinux, image = kernel_file("vmlinux"), kernel_file("vmlinuz").read_bytes()
    symbols = nm_symbols(vmlinux)
    read = image_reader(image, one(symbols, "_text"))
    found = find_btf(read, one(symbols, "_etext"), one(symbols, "_sinittext"))
    assert found is not None
    assert found == btf_section(vmlinux, tmp_path / "btf")
    assert one(symbols, "__start_BTF") == one(symbols, "_text") + image.find(found)


def test_per_cpu_offsets_and_sizes_from_btf_are_nm_s_and_pahole_s(tmp_path: Path) -> None:
    vmlinux = kernel_file("vmlinux")
    btf = Btf(btf_section(vmlinux, tmp_path / "btf"))
    symbols = nm_symbols(vmlinux)
    offsets = btf.section_variables(PER_CPU_SECTION, set(PER_CPU_VARIABLES))
    start = one(symbols, "__per_cpu_start")
    assert offsets == {name: one(symbols, name) - start for name in PER_CPU_VARIABLES}
    described = subprocess.run(
        ["pahole", "-C", "pt_regs", str(vmlinux)], capture_output=True, text=True, check=True
    ).stdout
    size = int(re.findall(r"/\* size: (\d+),", described)[-1])
    assert btf.structs({"pt_regs"}, frozenset({SIZE}))["pt_regs"][SIZE] == (size, None)


def test_a_btf_header_without_its_sections_is_passed_over() -> None:
    header = b"\x9f\xeb\x01\x00\x18\x00\x00\x00" + bytes(16)  # no types, no strings
    text = bytes(64) + header + bytes(4096)
    assert find_btf(image_reader(text, 0x1000), 0x1000, 0x1000 + len(text)) is None
