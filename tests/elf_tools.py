"""What GNU binutils say of an ELF file: the tests' oracle for what qmpprof reads."""

from __future__ import annotations

import bisect
import re
import subprocess
from pathlib import Path


def readelf_build_id(path: Path) -> bytes | None:
    """The GNU build-id `readelf -n` shows for `path`, or None without one."""
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
    found = re.search(r"Build ID: ([0-9a-f]+)", out)
    return bytes.fromhex(found.group(1)) if found else None


def build_id_of(path: Path) -> bytes:
    """The build-id of a file that must have one."""
    found = readelf_build_id(path)
    assert found is not None, f"{path} has no build-id"
    return found


def nm_functions(elf: Path, *flags: str) -> list[tuple[int, int, str]]:
    """nm's sized functions of `elf` (`-D`: its dynamic symbols): (address, size, name),
    by address."""
    listed = subprocess.run(
        ["nm", *flags, "--defined-only", "-S", str(elf)], capture_output=True, text=True, check=True
    )
    found = []
    for fields in (line.split() for line in listed.stdout.splitlines()):
        if len(fields) == 4 and fields[2] in "TtWw" and int(fields[1], 16):
            found.append((int(fields[0], 16), int(fields[1], 16), fields[3].split("@")[0]))
    return sorted(found)


def nm_names_at(functions: list[tuple[int, int, str]], address: int) -> set[str]:
    """The names nm gives the sized functions holding `address` (aliases share one)."""
    at = bisect.bisect_right(functions, (address, 1 << 64, ""))
    return {name for start, size, name in functions[:at] if start <= address < start + size}
