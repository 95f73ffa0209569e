"""Write what test_orc_mends.py needs of a kernel's return stack buffer fills: the ORC
entries of each function a fill may be patched into (unwind/orc_mends.py), read from the
debug vmlinux, and that function's code as a running guest has it (HMP `x`).

    python -m tests.unit.data.orc.extract_fills VMLINUX QMP_SOCKET OUT.json

The guest runs VMLINUX's kernel booted with KASLR off (examples/linux/boot.sh
--nokaslr), so that its code lies at the vmlinux's addresses.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from tests.guest_vm import qmp_call
from tests.unit.data.orc.extract import KernelOrc

FUNCTIONS = ("__switch_to_asm", "entry_ibpb")
_WORD = re.compile(r"0x([0-9a-f]{16})")


def main(vmlinux: Path, qmp: str, out: Path) -> None:
    orc = KernelOrc.read(vmlinux)
    ips = orc.ips
    functions: dict[str, Any] = {}
    kept: set[int] = set()
    for name in FUNCTIONS:
        start, size = orc.functions[name]
        functions[name] = {"address": start, "size": size, "code": _code(qmp, start, size).hex()}
        inside = [i for i, ip in enumerate(ips) if start <= ip < start + size]
        kept |= {*inside, min(inside) - 1, max(inside) + 1}  # the rows around it too
    rows = [[ips[i], orc.entry(i)] for i in sorted(kept)]
    data = {"orc_header": orc.header, "functions": functions, "entries": rows}
    out.write_text(json.dumps(data, indent=0) + "\n")


def _code(qmp: str, address: int, size: int) -> bytes:
    """The guest's bytes at `address` (vCPU 0's view), a whole number of words."""
    words = -(-size // 8)
    reply = qmp_call(qmp, "human-monitor-command", {"command-line": f"x /{words}gx {address:#x}"})
    found = [int(word, 16).to_bytes(8, "little") for word in _WORD.findall(str(reply))]
    assert len(found) == words, reply
    return b"".join(found)[:size]


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
