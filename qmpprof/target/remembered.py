"""Small facts about one QEMU process, kept between qmpprof's runs: where VMCOREINFO was
in its RAM, an AArch64 guest's page-table roots. A file per fact and process in the
derived cache's directory, named after the process (pid and start time, so a new QEMU
with a reused pid is another); the facts are hints, checked before use by their reader."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from qmpprof.errors import DirectMemoryUnavailable
from qmpprof.symbols.derived import cache_root
from qmpprof.target.qmp import QmpSession

#: How many QEMU processes' facts of a kind are remembered (the least recently written
#: go first): one small file each, and QEMU processes come and go.
MAX_REMEMBERED = 64
#: The longest fact kept: a few numbers.
MAX_FACT = 256


class Remembered:
    """One kind of fact about one QEMU process: a line of hexadecimal numbers."""

    def __init__(self, path: Path | None) -> None:
        self._path = path

    @classmethod
    def of(cls, session: QmpSession, kind: str) -> Remembered:
        from qmpprof.target.direct import qemu_pid  # mmap, sockets: only when asked

        root = cache_root()
        try:
            pid = qemu_pid(session)
            started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except (DirectMemoryUnavailable, OSError, IndexError):
            return cls(None)
        if root is None:
            return cls(None)
        name = hashlib.sha256(f"{pid}-{started}".encode()).hexdigest()[:32]
        return cls(root / kind / name)

    def numbers(self) -> tuple[int, ...] | None:
        if self._path is None:
            return None
        try:
            return tuple(int(word, 16) for word in self._path.read_text()[:MAX_FACT].split())
        except (OSError, ValueError):
            return None

    def page(self) -> int | None:
        numbers = self.numbers()
        return numbers[0] if numbers and len(numbers) == 1 else None

    def keep(self, *numbers: int) -> None:
        if self._path is None or self.numbers() == numbers:
            return
        with contextlib.suppress(OSError):
            self._path.parent.mkdir(parents=True, exist_ok=True)
            partial = self._path.with_suffix(f".{os.getpid()}")
            partial.write_text(" ".join(f"{number:x}" for number in numbers) + "\n")
            partial.replace(self._path)
            _forget_oldest(self._path.parent)


def _forget_oldest(directory: Path) -> None:
    """Keep the MAX_REMEMBERED most recently written facts. Raises OSError."""
    remembered = sorted(
        (path.stat().st_mtime_ns, path) for path in directory.iterdir() if "." not in path.name
    )
    for _, path in remembered[:-MAX_REMEMBERED]:
        with contextlib.suppress(OSError):
            path.unlink()
