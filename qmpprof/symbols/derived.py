"""What qmpprof derives from an ELF file, kept between runs: a Debian vmlinux's symbols,
CFI entries and struct layouts take about a second to read from its 600 MB, and a
tenth of that to load back.

Entries live in $QMPPROF_DERIVED_CACHE (default $XDG_CACHE_HOME/qmpprof/derived, else
~/.cache/qmpprof/derived; QMPPROF_DERIVED_CACHE=off keeps nothing; QMPPROF_CACHE is the
examples' download cache), one directory per file keyed by its GNU build-id, size and
modification time (a stripped file and its debug file share a build-id; a file changed
in place keeps both), one entry per kind of data and format version. Only files with a
build-id are cached.

An entry is a header (magic, SHA-256 of the payload) and a marshal payload. One that
does not check, or decodes to something else than its kind expects, is read again from
the ELF and rewritten; a cache that cannot be written (read-only, full disk) is not
used. Writes are atomic (a temporary file renamed), so two qmpprof processes can share
the cache. The directory can be deleted at any time.

The cache stays bounded: a file's directory is touched each time it answers, and when a
new one is made, the least recently used go until at most MAX_FILES directories and
MAX_CACHE_BYTES remain (the newest is always kept).
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from elftools.elf.elffile import ELFFile

from qmpprof.symbols.elf_file import read_build_id

T = TypeVar("T")

#: Changes whenever the shape of any kind's payload does.
FORMAT = 1
MAGIC = b"qmpprof derived\n"
#: A larger entry is not read (the symbols of Debian's vmlinux take about 8 MB).
MAX_ENTRY_BYTES = 1 << 28
#: The cache's bounds: directories (files derived from) and bytes in all.
MAX_FILES = 64
MAX_CACHE_BYTES = 2 << 30
#: The name of a file's directory (FileKey.directory): _prune removes nothing else, since
#: QMPPROF_DERIVED_CACHE may name a directory that holds other things too.
_KEY_DIRECTORY = re.compile(r"[0-9a-f]+-[0-9]+-[0-9]+")
#: What a payload that does not decode as its kind expects raises.
DECODE_ERRORS = (ValueError, TypeError, EOFError, KeyError, IndexError, AttributeError)


@dataclass(frozen=True)
class FileKey:
    """Which file an entry was derived from."""

    build_id: bytes
    size: int
    modified_ns: int

    @property
    def directory(self) -> str:
        return f"{self.build_id.hex()}-{self.size}-{self.modified_ns}"


def file_key(elf: ELFFile) -> FileKey | None:
    """The key of an ELF file opened by `open_elf`; None without a build-id."""
    build_id = read_build_id(elf)
    if build_id is None:
        return None
    status = os.fstat(elf.stream.fileno())
    return FileKey(build_id, status.st_size, status.st_mtime_ns)


def kind_for(prefix: str, *parts: Iterable[str] | None) -> str:
    """The kind of an entry that answers one request: `prefix` and a digest of the names
    asked for (each part sorted; None, meaning all, differs from an empty part)."""
    text = "\x01".join("\x02" if part is None else "\0".join(sorted(part)) for part in parts)
    return f"{prefix}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def cache_root() -> Path | None:
    """Where entries live; None when QMPPROF_DERIVED_CACHE=off."""
    configured = os.environ.get("QMPPROF_DERIVED_CACHE", "")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qmpprof" / "derived"


def derived(
    key: FileKey | None,
    kind: str,
    compute: Callable[[], T],
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
) -> T:
    """`compute()`, or what an earlier run stored for this file and kind. `encode` makes
    the value plain data marshal writes (tuples, lists, dicts, str, bytes, int, bool,
    None); `decode` makes it the value again, raising one of DECODE_ERRORS for data of
    another shape."""
    entry = _entry(key, kind)
    if entry is not None:
        payload = _read(entry)
        if payload is not None:
            try:
                value = decode(marshal.loads(payload))
            except DECODE_ERRORS:
                pass
            else:
                with contextlib.suppress(OSError):
                    os.utime(entry.parent)  # recently used: kept by _prune
                return value
    value = compute()
    if entry is not None:
        _write(entry, marshal.dumps(encode(value)))
    return value


def _entry(key: FileKey | None, kind: str) -> Path | None:
    root = cache_root()
    if key is None or root is None:
        return None
    return root / key.directory / f"{kind}.v{FORMAT}"


def _read(entry: Path) -> memoryview | None:
    try:
        with entry.open("rb") as file:
            # As much as the file holds: a read of MAX_ENTRY_BYTES allocates that much
            # first (4 ms of a warm `qmpprof dump`, for its 5 MB of kallsyms).
            size = os.fstat(file.fileno()).st_size
            data = file.read(min(size, MAX_ENTRY_BYTES) + 1)
    except OSError:
        return None
    header = len(MAGIC) + hashlib.sha256().digest_size
    if len(data) > MAX_ENTRY_BYTES or not data.startswith(MAGIC) or len(data) < header:
        return None
    digest, payload = data[len(MAGIC) : header], memoryview(data)[header:]  # not copied
    return payload if hashlib.sha256(payload).digest() == digest else None


def _write(entry: Path, payload: bytes) -> None:
    if len(payload) > MAX_ENTRY_BYTES:
        return
    temporary: Path | None = None
    try:
        new = not entry.parent.is_dir()
        entry.parent.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=entry.parent, prefix=f".{entry.name}.")
        temporary = Path(name)
        with os.fdopen(descriptor, "wb") as file:
            file.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, entry)
        if new:
            _prune(entry.parent.parent, entry.parent)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink()


def _prune(root: Path, newest: Path) -> None:
    """Remove the least recently used file directories under `root` (not `newest`)
    until MAX_FILES and MAX_CACHE_BYTES hold; what the cache did not make is neither
    counted nor removed. Raises OSError."""
    kept: list[tuple[float, int, Path]] = []
    for directory in root.iterdir():
        if not _KEY_DIRECTORY.fullmatch(directory.name):
            continue
        if directory.is_dir() and not directory.is_symlink():
            size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
            kept.append((directory.stat().st_mtime, size, directory))
    kept.sort(reverse=True)  # newest first
    total = sum(size for _, size, _ in kept)
    while kept and (len(kept) > MAX_FILES or total > MAX_CACHE_BYTES):
        _, size, oldest = kept.pop()
        if oldest == newest:
            continue
        shutil.rmtree(oldest, ignore_errors=True)
        total -= size
