"""`go tool pprof` reads the pprof file: functions, flat and cumulative counts, labels."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

from qmpprof.model import FileMapping, Frame, FrameAddress, FrameKind, Mode
from qmpprof.output.pprof import write_pprof
from qmpprof.profile import Scope
from tests.consumers.conftest import Outputs
from tests.consumers.samples import (
    COUNTED,
    HOSTILE,
    KERNEL_BASE,
    ODD_FRAME,
    RECORDING,
    USER_BASE,
    realistic_samples,
)


def pprof(go: str, *args: str) -> str:
    """`go tool pprof ARGS`'s standard output (it must succeed and not complain)."""
    result = subprocess.run(
        [go, "tool", "pprof", *args], capture_output=True, text=True, timeout=120, check=True
    )
    assert "error" not in result.stderr.lower() and "warning" not in result.stderr.lower()
    return result.stdout


def top(go: str, path: Path, *args: str) -> dict[str, tuple[str, str]]:
    """Function name → (flat, cum) from `go tool pprof -top`."""
    rows: dict[str, tuple[str, str]] = {}
    lines = pprof(go, "-top", *args, str(path)).splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["flat", "flat%"])
    for line in lines[header + 1 :]:
        flat, _, _, cum, _, name = line.split(maxsplit=5)
        rows[name] = (flat, cum)
    return rows


def test_top_counts_samples_per_function(go: str, outputs: Outputs) -> None:
    rows = top(go, outputs.pprof, "-sample_index=samples")
    assert rows["physics_leaf"] == ("40", "40")
    assert rows["checksum_leaf"] == ("25", "25")
    assert rows["crunch_loop"] == ("15", "15")
    assert rows['operator"";evil'] == ("10", "10")  # pprof drops <…> as C++ template arguments
    assert rows["hostile_fn"] == ("4", "4")
    assert rows[f"{KERNEL_BASE + 7:#x}"] == ("5", "5")
    assert rows[f"{USER_BASE + 7:#x}"] == ("3", "3")
    assert rows["_start"] == ("0", "56") and rows["kernel_entry"] == ("0", "45")
    assert sum(int(flat) for flat, _ in rows.values()) == COUNTED


def test_top_shows_cpu_time_by_default(go: str, outputs: Outputs) -> None:
    text = pprof(go, "-top", str(outputs.pprof))
    assert "Type: cpu" in text and "Duration: 1.10s" in text
    assert f"Total samples = {COUNTED * 10}ms" in text
    assert top(go, outputs.pprof)["physics_leaf"] == ("400ms", "400ms")


def test_tags_are_vcpu_process_and_mode(go: str, outputs: Outputs) -> None:
    text = pprof(go, "-tags", "-sample_index=samples", str(outputs.pprof))
    for tag in ("vcpu:", "process:", "mode:"):
        assert tag in text
    assert "[kernel]" in text and f"{HOSTILE} (66)" in text and "crunch (1)" in text
    vcpus = text[text.index("vcpu:") :]
    assert "45.0 (43.27%): 0" in vcpus  # vCPU 0: a numeric label 0 that pprof must not drop


def test_raw_keeps_exact_names_and_mappings(go: str, outputs: Outputs) -> None:
    text = pprof(go, "-raw", str(outputs.pprof))
    assert f"({ODD_FRAME})" in text  # the full name, as system_name
    for module in ("kernel.elf", "crunch.elf", "render.elf", "evil.elf", "m.elf"):
        assert f" {module}  [FN]" in text  # a mapping that has its functions


def test_kernel_only_profile_has_no_user_functions(go: str, tmp_path: Path) -> None:
    path = tmp_path / "kernel.pb.gz"
    write_pprof(realistic_samples(), RECORDING, path, Scope.KERNEL)
    rows = top(go, path, "-sample_index=samples")
    assert "crunch_loop" not in rows and "_start" not in rows
    assert rows["sys_checksum"] == ("0", "25")


LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
LIBC_BUILD_ID = bytes.fromhex("d1f0a9cbd9ab0c0a3b3a4f4cba9b1e2a8e1f7a55")


def test_a_process_maps_files_carry_their_path_range_offset_and_build_id(
    go: str, tmp_path: Path
) -> None:
    """A Linux process's libc frames: one named, one only `file+offset`; pprof's mapping
    says where the file was, from which offset, and which build it was."""
    libc = FileMapping(0x7F00_0002_8000, 0x7F00_001B_D000, 0x28000, LIBC, LIBC_BUILD_ID)
    qsort = Frame(
        FrameAddress(libc.start + 0x1234, FrameKind.INSTRUCTION), "qsort", 4, "libc.so.6", libc
    )
    unnamed = Frame(
        FrameAddress(libc.start + 0x5678, FrameKind.RETURN), None, 0x2D678, "libc.so.6", libc
    )
    main = Frame(FrameAddress(0x5555_5555_5123, FrameKind.RETURN), "main", 3, "dynwork")
    sample = realistic_samples()[0]
    samples = [replace(sample, mode=Mode.USER, frames=(qsort, unnamed, main))] * 3
    path = tmp_path / "libc.pb.gz"
    write_pprof(samples, RECORDING, path)
    assert top(go, path, "-sample_index=samples")["qsort"] == ("3", "3")
    assert top(go, path, "-sample_index=samples")["libc.so.6+0x2d678"] == ("0", "3")
    raw = pprof(go, "-raw", str(path))
    mapping = next(line for line in raw.splitlines() if LIBC in line)
    assert mapping.split()[:2] == ["1:", f"{libc.start:#x}/{libc.end:#x}/{libc.offset:#x}"]
    assert LIBC_BUILD_ID.hex() in mapping
