#!/usr/bin/env python3
"""Write an initramfs (newc cpio) holding /init, the workloads in /bin, /dev/console,
/dev/zero, /dev/null and /proc, without root and without the cpio tool: the archive says
the owner and the device numbers itself. It also holds /lib/modules/ABI/NAME.ko of each
of MODULES for each kernel whose linux-image .deb is cached (init loads crc8, loopread
loads loop), and with --root DIR every
directory, file and symbolic link of DIR at the same path (a guest sysroot from
mksysroot.py: the dynamically linked workload and its libraries), less DIR/usr/lib/debug.

    mkcpio.py [--root DIR] OUTPUT INIT [PROGRAM...]
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


#: The modules the guest loads, by their path under lib/modules/ABI/kernel/: each small,
#: depending on no other module, in every Debian kernel. init loads crc8; the loopread
#: workload loads loop.
MODULES = ("lib/crc8", "drivers/block/loop")


def cached_modules() -> dict[tuple[str, str], bytes]:
    """(ABI, name) -> the .ko of each of MODULES for each kernel ABI whose
    linux-image-ABI-unsigned .deb fetch.sh cached (inflated: 6.12's are .ko.xz), read
    with dpkg-deb."""
    cache = Path(os.environ.get("QMPPROF_CACHE", Path.home() / ".cache" / "qmpprof"))
    found = {}
    for deb in sorted((cache / "debian").glob("linux-image-*-unsigned_*.deb")):
        tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as files:
            for member in files:
                parts = member.name.split("/")  # ./lib/modules/ABI/kernel/lib/crc8.ko.xz
                if "kernel" not in parts:
                    continue
                path = "/".join(parts[parts.index("kernel") + 1 :]).removesuffix(".xz")
                if path.removesuffix(".ko") in MODULES and path.endswith(".ko"):
                    data = files.extractfile(member).read()
                    abi = parts[parts.index("modules") + 1]
                    name = Path(path).name
                    inflated = lzma.decompress(data) if member.name.endswith(".xz") else data
                    found[abi, name] = inflated
    return found


def module_records() -> list[tuple[str, int, bytes, tuple[int, int]]]:
    """/lib/modules/ABI/NAME.ko for each of MODULES and each cached kernel."""
    records = [("lib", 0o040755, b"", (0, 0)), ("lib/modules", 0o040755, b"", (0, 0))]
    for (abi, name), data in cached_modules().items():
        records.append((f"lib/modules/{abi}", 0o040755, b"", (0, 0)))  # once: see archive
        records.append((f"lib/modules/{abi}/{name}", 0o100644, data, (0, 0)))
    return records


#: What --root leaves out: the separate debug files are for the host's tools only.
HOST_ONLY = "usr/lib/debug"


def tree_records(root: Path) -> list[tuple[str, int, bytes, tuple[int, int]]]:
    """Every directory, regular file and symbolic link under `root` (a symbolic link's
    data is its target), parents first, without HOST_ONLY."""
    records = []
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if name == HOST_ONLY or name.startswith(HOST_ONLY + "/"):
            continue
        if path.is_symlink():
            records.append((name, 0o120777, os.readlink(path).encode(), (0, 0)))
        elif path.is_dir():
            records.append((name, 0o040755, b"", (0, 0)))
        elif path.is_file():
            mode = 0o100755 if os.access(path, os.X_OK) else 0o100644
            records.append((name, mode, path.read_bytes(), (0, 0)))
    return records


def archive(init: bytes, programs: dict[str, bytes], root: Path | None = None) -> bytes:
    """The archive: `programs` go to /bin under their names, `root`'s tree to /."""
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
        *(tree_records(root) if root else []),
    ]
    first = {}  # a directory both lists name (lib, bin) is written once
    for record in records:
        first.setdefault(record[0], record)
    records = list(first.values())
    numbered = [entry(n, *record) for n, record in enumerate(records, 1)]
    return b"".join(numbered) + entry(len(records) + 1, TRAILER, 0)


def main() -> None:
    arguments = sys.argv[1:]
    root = None
    if arguments[:1] == ["--root"] and len(arguments) > 1:
        root, arguments = Path(arguments[1]), arguments[2:]
    if len(arguments) < 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    output, init = Path(arguments[0]), Path(arguments[1])
    programs = {Path(name).name: Path(name).read_bytes() for name in arguments[2:]}
    temporary = output.with_suffix(".tmp")
    temporary.write_bytes(archive(init.read_bytes(), programs, root))
    temporary.replace(output)


if __name__ == "__main__":
    main()
