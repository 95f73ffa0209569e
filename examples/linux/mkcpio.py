#!/usr/bin/env python3
"""Write an initramfs (newc cpio) holding /init, the workloads in /bin, /dev/console,
/dev/zero, /dev/null and /proc, without root and without the cpio tool: the archive says
the owner and the device numbers itself. It also holds /lib/modules/ABI/crc8.ko for each
kernel whose linux-image .deb is cached (init loads it).

    mkcpio.py OUTPUT INIT [PROGRAM...]
"""

import io
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

TRAILER = "TRAILER!!!"


def entry(
    number: int, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)
) -> bytes:
    """One newc record: a 110-byte ASCII header, the name, the data, each padded to 4."""
    encoded = name.encode() + b"\0"
    fields = [number, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(encoded), 0]
    header = b"070701" + b"".join(b"%08X" % value for value in fields)
    record = header + encoded
    record += b"\0" * (-len(record) % 4) + data
    return record + b"\0" * (-len(record) % 4)


#: The module init loads: small, depends on no other module, in every Debian kernel.
MODULE = "crc8"


def cached_modules() -> dict[str, bytes]:
    """MODULE's .ko for each kernel ABI whose linux-image-ABI-unsigned .deb fetch.sh cached
    (inflated: 6.12's are .ko.xz), read with dpkg-deb."""
    cache = Path(os.environ.get("QMPPROF_CACHE", Path.home() / ".cache" / "qmpprof"))
    found = {}
    for deb in sorted((cache / "debian").glob("linux-image-*-unsigned_*.deb")):
        tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as files:
            for member in files:
                parts = member.name.split("/")  # ./lib/modules/ABI/kernel/lib/crc8.ko.xz
                if parts[-2:] in (["lib", f"{MODULE}.ko"], ["lib", f"{MODULE}.ko.xz"]):
                    data = files.extractfile(member).read()
                    abi = parts[parts.index("modules") + 1]
                    found[abi] = lzma.decompress(data) if member.name.endswith(".xz") else data
    return found


def module_records() -> list[tuple[str, int, bytes, tuple[int, int]]]:
    """/lib/modules/ABI/MODULE.ko for each cached kernel."""
    records = [("lib", 0o040755, b"", (0, 0)), ("lib/modules", 0o040755, b"", (0, 0))]
    for abi, data in cached_modules().items():
        records.append((f"lib/modules/{abi}", 0o040755, b"", (0, 0)))
        records.append((f"lib/modules/{abi}/{MODULE}.ko", 0o100644, data, (0, 0)))
    return records


def archive(init: bytes, programs: dict[str, bytes]) -> bytes:
    """The archive: `programs` go to /bin under their names."""
    records = [
        ("dev", 0o040755, b"", (0, 0)),
        ("dev/console", 0o020600, b"", (5, 1)),
        ("dev/null", 0o020666, b"", (1, 3)),
        ("dev/zero", 0o020666, b"", (1, 5)),
        ("init", 0o100755, init, (0, 0)),
        ("proc", 0o040555, b"", (0, 0)),
        ("bin", 0o040755, b"", (0, 0)),
        *((f"bin/{name}", 0o100755, data, (0, 0)) for name, data in sorted(programs.items())),
        *module_records(),
    ]
    numbered = [entry(n, *record) for n, record in enumerate(records, 1)]
    return b"".join(numbered) + entry(len(records) + 1, TRAILER, 0)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    output, init = Path(sys.argv[1]), Path(sys.argv[2])
    programs = {Path(name).name: Path(name).read_bytes() for name in sys.argv[3:]}
    temporary = output.with_suffix(".tmp")
    temporary.write_bytes(archive(init.read_bytes(), programs))
    temporary.replace(output)


if __name__ == "__main__":
    main()
