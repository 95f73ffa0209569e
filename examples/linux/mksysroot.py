#!/usr/bin/env python3
"""Lay out a guest sysroot: a directory shaped like the guest's root holding our own
programs at their guest paths, every file of Debian's libc6 they need (their PT_INTERP
and DT_NEEDED, followed through the libraries) taken from an extracted libc6 tree
(fetch.sh --libc), and each such file's separate debug file from libc6-dbg
(usr/lib/debug/.build-id/xx/yyyy.debug) where the tree has them: the demo's (fetch.sh
--demo --libc) is libc6 alone, and its sysroot has no usr/lib/debug. mkcpio.py --root puts
the same files (less usr/lib/debug) in the initramfs, so `qmpprof --sysroot DIR` and GDB's
`set sysroot DIR` see exactly the guest's bytes.

    mksysroot.py OUTPUT LIBC_TREE FILE=GUEST_PATH...

Symbolic links in the tree are kept, made relative (Debian's /lib64/ld-linux-x86-64.so.2
points at an absolute path, which on the host would be the host's own ld.so).

Each of our files must need no symbol version its libraries here lack (GLIBC_2.34 of a
program built against the host's glibc, for bullseye's 2.31): it would not start in the
guest, so the build stops here instead.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

#: Where ld.so looks for a DT_NEEDED library when nothing else says (no ld.so.cache in
#: the guest), in its order.
LIBRARY_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib")
#: Bounds the walk through the libraries' dependencies (libc6 has a few dozen files).
MAX_FILES = 64


def readelf(*args: str) -> str:
    return subprocess.run(
        ["readelf", "-W", *args], capture_output=True, text=True, check=True
    ).stdout


def dependencies(elf: Path) -> list[str]:
    """The interpreter (an absolute guest path) and the DT_NEEDED names of `elf`."""
    interpreter = re.findall(r"Requesting program interpreter: ([^\]]+)\]", readelf("-l", str(elf)))
    return interpreter + re.findall(
        r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", str(elf))
    )


def build_id(elf: Path) -> str | None:
    found = re.search(r"Build ID: ([0-9a-f]+)", readelf("-n", str(elf)))
    return found.group(1) if found else None


def resolve(tree: Path, guest_path: str, output: Path) -> Path:
    """The file `guest_path` names in `tree`, copying each symbolic link on the way into
    `output` (relative) so that the guest path works there too."""
    for _ in range(8):
        path = tree / guest_path.lstrip("/")
        if not path.is_symlink():
            return path
        directory = str(PurePosixPath(guest_path).parent)
        target = os.path.normpath(os.path.join(directory, os.readlink(path)))  # absolute
        link = output / guest_path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(target, directory))
        guest_path = target
    sys.exit(f"mksysroot.py: too many symbolic links at {guest_path} in {tree}")


def place(source: Path, output: Path, guest_path: str) -> None:
    target = output / guest_path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def copy_debug_file(tree: Path, elf: Path, output: Path) -> None:
    """`elf`'s separate debug file, if `tree` has libc6-dbg's (the demo's has none)."""
    identity = build_id(elf)
    if identity is None:
        return
    relative = f"usr/lib/debug/.build-id/{identity[:2]}/{identity[2:]}.debug"
    if (tree / relative).is_file():
        place(tree / relative, output, relative)


def find_library(name: str, tree: Path, output: Path) -> str:
    """The guest path ld.so would load DT_NEEDED `name` from: ours first, then libc6's."""
    for directory in LIBRARY_DIRS:
        for root in (output, tree):
            if (root / directory / name).exists() or (root / directory / name).is_symlink():
                return f"/{directory}/{name}"
    sys.exit(f"mksysroot.py: no {name} in {tree} or among our files")


def symbol_versions(elf: Path) -> tuple[set[str], dict[str, set[str]]]:
    """The symbol versions `elf` defines, and those it needs by library (readelf -V)."""
    defined: set[str] = set()
    needed: dict[str, set[str]] = {}
    section = library = ""
    for line in readelf("-V", str(elf)).splitlines():
        if line.startswith("Version "):  # Version {symbols,definition,needs} section ...
            section = line.split()[1]
        elif section == "definition" and (found := re.search(r"Index: .* Name: (\S+)", line)):
            defined.add(found.group(1))
        elif section == "needs" and (found := re.search(r"File: (\S+)", line)):
            library = found.group(1)
        elif section == "needs" and (found := re.search(r"Name: (\S+)", line)):
            needed.setdefault(library, set()).add(found.group(1))
    return defined, needed


def check_versions(output: Path, tree: Path, ours: dict[str, Path]) -> None:
    """Each of `ours` needs only symbol versions its libraries in `output` define."""
    for source in ours.values():
        for library, versions in symbol_versions(source)[1].items():
            path = output / find_library(library, tree, output).lstrip("/")
            missing = versions - symbol_versions(path)[0]
            if missing:
                sys.exit(
                    f"mksysroot.py: {source} needs {', '.join(sorted(missing))} of {library},"
                    f" which {tree} lacks (build it against that libc: gcc --sysroot)"
                )


def build(output: Path, tree: Path, ours: dict[str, Path]) -> None:
    for guest_path, source in ours.items():
        place(source, output, guest_path)
    pending = [dependency for source in ours.values() for dependency in dependencies(source)]
    done: set[str] = set(ours)
    while pending:
        name = pending.pop(0)
        guest_path = name if name.startswith("/") else find_library(name, tree, output)
        if guest_path in done:
            continue
        done.add(guest_path)
        if len(done) > MAX_FILES:
            sys.exit(f"mksysroot.py: more than {MAX_FILES} files needed")
        real = resolve(tree, guest_path, output)
        real_guest_path = "/" + str(real.relative_to(tree))
        if not real.is_file():
            sys.exit(f"mksysroot.py: {guest_path} is not in {tree}")
        done.add(real_guest_path)
        place(real, output, real_guest_path)
        copy_debug_file(tree, real, output)
        pending += dependencies(real)
    check_versions(output, tree, ours)


def main() -> None:
    if len(sys.argv) < 4 or not all("=" in pair for pair in sys.argv[3:]):
        sys.exit(__doc__.strip().split("\n\n")[1].strip())
    output, tree = Path(sys.argv[1]), Path(sys.argv[2])
    if not tree.is_dir():
        sys.exit(f"mksysroot.py: no libc tree at {tree} (remove its libc.env and run make again)")
    ours = {}
    for pair in sys.argv[3:]:
        file, guest_path = pair.split("=", 1)
        ours["/" + guest_path.lstrip("/")] = Path(file)
    partial = output.with_name(output.name + ".part")
    shutil.rmtree(partial, ignore_errors=True)
    build(partial, tree, ours)
    shutil.rmtree(output, ignore_errors=True)
    partial.rename(output)


if __name__ == "__main__":
    main()
