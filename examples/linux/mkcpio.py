#!/usr/bin/env python3
"""Write an initramfs (newc cpio) holding /init, /dev/console, /dev/zero and /proc, without root and
without the cpio tool: the archive says the owner and the device numbers itself.

    mkcpio.py INIT OUTPUT
"""

import sys
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


def archive(init: bytes) -> bytes:
    records = [
        entry(1, "dev", 0o040755),
        entry(2, "dev/console", 0o020600, rdev=(5, 1)),
        entry(3, "dev/zero", 0o020666, rdev=(1, 5)),
        entry(4, "init", 0o100755, init),
        entry(5, "proc", 0o040555),
        entry(6, TRAILER, 0),
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
