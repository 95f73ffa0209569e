"""The host's copy of each file a guest process maps, found and checked before it is used.

A guest names its files by path (`/lib/x86_64-linux-gnu/libc.so.6`). The host copy is
looked for as GDB's `set sysroot` and perf's `--symfs` do, under `--sysroot DIR`
(`DIR/lib/x86_64-linux-gnu/libc.so.6`), then by file name among `--user` files and in
`--user-dir` directories (`NAME` or `NAME.elf`). A copy is used only when its GNU
build-id is the one the guest's copy carries: a wrong libc names nothing rather than
naming frames wrongly, and the mismatch is kept for the summary. A guest file without a
build-id is matched by name only under `--user`/`--user-dir` (files the user named), never
from a sysroot. Symbols come from the separate debug file when the sysroot has it
(`DIR/usr/lib/debug/.build-id/xx/yyyy.debug`).

Guest paths are hostile text: a path that would leave the sysroot (`..`, symbolic links)
is not followed, and nothing but regular files is opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from qmpprof.errors import BadElf
from qmpprof.model import FileMapping
from qmpprof.modules import Module, load_module
from qmpprof.symbols.debuginfod import Debuginfod

#: Where Debian (and most distributions) keep separate debug files by build-id.
DEBUG_BY_BUILD_ID = PurePosixPath("usr/lib/debug/.build-id")
#: Longest guest path looked up (PATH_MAX).
MAX_GUEST_PATH = 4096
#: Files kept loaded: a guest with more distinct files than this loads again.
MAX_LOADED = 512
#: Reads from the guest's memory of one file with no host copy that found nothing or
#: part of it, before the best is kept for good: a read finds nothing in a process that
#: is exiting, and part of the file in one still being exec'd (some of its mappings not
#: made yet), where another process that maps the file may hold it whole.
GUEST_COPY_TRIES = 4


@dataclass(frozen=True)
class Mismatch:
    """A host file found for a guest file whose build-id differs: not used."""

    guest_path: str
    host_path: Path
    guest_build_id: bytes | None
    host_build_id: bytes | None

    def describe(self) -> str:
        guest = self.guest_build_id.hex() if self.guest_build_id else "none"
        host = self.host_build_id.hex() if self.host_build_id else "none"
        return f"{self.host_path}: build-id {host}, the guest's is {guest}"


class UserFiles:
    """Finds, loads once and checks the host files for guest file mappings."""

    def __init__(
        self,
        sysroot: Path | None = None,
        directories: Iterable[Path] = (),
        files: Iterable[Path] = (),
        servers: Debuginfod | None = None,
    ) -> None:
        """`servers`: debuginfod, asked by build-id for a file found nowhere else."""
        self.sysroot = sysroot.resolve() if sysroot is not None else None
        self.servers = servers
        self._directories = tuple(directories)
        self._named = {_stem(p.name): p for p in files}
        self._loaded: dict[tuple[str, bytes | None], Module | None] = {}
        #: By guest path: each file found whose build-id did not match.
        self.mismatches: dict[str, Mismatch] = {}
        #: Host files that could not be read as ELF, with why.
        self.unreadable: dict[Path, str] = {}
        #: Files with no host copy, by (guest path, build-id): the module read from the
        #: guest's memory (guest/loaded_elf.py), or None when that read found nothing.
        self.from_guest: dict[tuple[str, bytes | None], Module | None] = {}
        #: By the same key: the reads that found nothing or part of the file, and the
        #: files whose module there is such a part.
        self._guest_copy_tries: dict[tuple[str, bytes | None], int] = {}
        self._partial: set[tuple[str, bytes | None]] = set()

    @property
    def searching(self) -> bool:
        """Whether there is anywhere to look at all."""
        return bool(self.sysroot or self._directories or self._named or self.servers)

    def module_for(self, mapping: FileMapping) -> Module | None:
        """The checked host copy of the file `mapping` maps, or None."""
        key = (mapping.path, mapping.build_id)
        if key not in self._loaded:
            if len(self._loaded) >= MAX_LOADED:
                self._loaded.clear()
            self._loaded[key] = self._find(mapping.path, mapping.build_id)
        return self._loaded[key] or self.from_guest.get(key)

    def wants_guest_copy(self, mapping: FileMapping) -> bool:
        """Whether `mapping`'s file has no host copy and its loaded image was not read
        whole from the guest yet (per path and build-id; a read that found nothing or
        part of it is tried again, GUEST_COPY_TRIES such reads in all)."""
        key = (mapping.path, mapping.build_id)
        if self._guest_copy_tries.get(key, 0) >= GUEST_COPY_TRIES:
            return False
        found = self.module_for(mapping)
        return found is None or (key in self._partial and found is self.from_guest.get(key))

    def add_guest_copy(
        self, mapping: FileMapping, module: Module | None, whole: bool = True
    ) -> None:
        """What reading `mapping`'s file from the guest gave (None: nothing usable;
        not `whole`: some of what it needed could not be read): `module_for` returns it
        from now on, for want of a host copy, or the fuller of two parts."""
        if len(self.from_guest) >= MAX_LOADED:
            self.from_guest.clear()
            self._guest_copy_tries.clear()
            self._partial.clear()
        key = (mapping.path, mapping.build_id)
        if module is None or not whole:
            self._guest_copy_tries[key] = self._guest_copy_tries.get(key, 0) + 1
        before = self.from_guest.get(key)
        if module is not None and not whole and not _fuller(module, before):
            return  # the part read before has more
        if module is not None or before is None:
            self.from_guest[key] = module
            self._partial.discard(key)
            if module is not None and not whole:
                self._partial.add(key)

    def _find(self, guest_path: str, build_id: bytes | None) -> Module | None:
        for host_path, needs_build_id in self._candidates(guest_path):
            module = self._load(host_path, build_id)
            if module is None:
                continue
            if build_id is not None and module.build_id == build_id:
                return module
            if build_id is None and not needs_build_id:
                return module
            self.mismatches[guest_path] = Mismatch(guest_path, host_path, build_id, module.build_id)
        return self._from_servers(guest_path, build_id)

    def _from_servers(self, guest_path: str, build_id: bytes | None) -> Module | None:
        """The file with `build_id` from debuginfod, with its debug file's symbols (the
        client checks both are that build's)."""
        if self.servers is None or build_id is None:
            return None
        executable = self.servers.executable(build_id)
        if executable is None:
            return None
        try:
            name = PurePosixPath(guest_path).name or guest_path
            debug = self.servers.debuginfo(build_id)
            return load_module(executable, name, debug=debug, shown=name)
        except BadElf as err:
            self.unreadable[executable] = str(err)
            return None

    def _candidates(self, guest_path: str) -> list[tuple[Path, bool]]:
        """Host paths to try, each with whether only a build-id match may use it."""
        if len(guest_path) > MAX_GUEST_PATH or "\0" in guest_path:
            return []
        name = PurePosixPath(guest_path).name
        found = []
        under_root = self._under_sysroot(guest_path)
        if under_root is not None:
            found.append((under_root, True))
        if _stem(name) in self._named:
            found.append((self._named[_stem(name)], False))
        for directory in self._directories if name else ():
            found += [(directory / name, False), (directory / f"{name}.elf", False)]
        return [(path, strict) for path, strict in found if path.is_file()]

    def _under_sysroot(self, guest_path: str) -> Path | None:
        if self.sysroot is None:
            return None
        relative = guest_path.lstrip("/")
        return self._inside_sysroot(relative) if relative else None

    def _inside_sysroot(self, relative: str | PurePosixPath) -> Path | None:
        """`sysroot/relative` with its links followed, if it stays in the sysroot."""
        assert self.sysroot is not None
        resolved = Path(os.path.realpath(self.sysroot / relative))
        return resolved if resolved.is_relative_to(self.sysroot) else None

    def _load(self, host_path: Path, build_id: bytes | None) -> Module | None:
        try:
            return load_module(host_path, debug=self._debug_file(build_id))
        except BadElf as err:
            self.unreadable[host_path] = str(err)
            return None

    def _debug_file(self, build_id: bytes | None) -> Path | None:
        if self.sysroot is None or build_id is None or len(build_id) < 2:
            return None
        hex_id = build_id.hex()
        resolved = self._inside_sysroot(DEBUG_BY_BUILD_ID / hex_id[:2] / f"{hex_id[2:]}.debug")
        return resolved if resolved is not None and resolved.is_file() else None


def _fuller(module: Module, than: Module | None) -> bool:
    """Whether a part of a file read from the guest has more FDEs than `than`."""
    return than is None or len(module.cfi) > len(than.cfi)


def _stem(name: str) -> str:
    return name.removesuffix(".elf")
