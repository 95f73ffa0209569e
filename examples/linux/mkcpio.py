#!/usr/bin/env python3
"""Write an initramfs (newc cpio) holding /init, /dev/console, /dev/zero and /proc, without root and
without the cpio tool: the archive says the owner and the device numbers itself. It also holds
/lib/modules/ABI/crc8.ko for each kernel whose linux-image .deb is cached (init loads it).

    mkcpio.py INIT OUTPUT
"""

import io
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

TRAILER = "TRAILER!!!"


def entry(number: int, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> bytes:
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


def module_entries(first: int) -> list[bytes]:
    """/lib/modules/ABI/MODULE.ko for each cached kernel, numbered from `first`."""
    records = [entry(first, "lib", 0o040755), entry(first + 1, "lib/modules", 0o040755)]
    number = first + 2
    for abi, data in cached_modules().items():
        records.append(entry(number, f"lib/modules/{abi}", 0o040755))
        records.append(entry(number + 1, f"lib/modules/{abi}/{MODULE}.ko", 0o100644, data))
        number += 2
    return records


def archive(init: bytes) -> bytes:
    records = [
        entry(1, "dev", 0o040755),
        entry(2, "dev/console", 0o020600, rdev=(5, 1)),
        entry(3, "dev/zero", 0o020666, rdev=(1, 5)),
        entry(4, "init", 0o100755, init),
        entry(5, "proc", 0o040555),
        *module_entries(6),
        entry(0, TRAILER, 0),
    ]
    return b"".join(records)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    init, output = Path(sys.argv[1]), Path(sys.argv[2])
    temporary = output.with_suffix(".tmp")
    temporary.write_bytes(archive(init.read_bytes()))
    temporary.replace(output)


if __name__ == "__main__":
    main()
