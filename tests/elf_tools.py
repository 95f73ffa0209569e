"""What GNU binutils say of an ELF file: the tests' oracle for what qmpprof reads."""

from __future__ import annotations

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
