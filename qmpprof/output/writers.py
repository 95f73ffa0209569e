"""Which output format a file gets, and writing a finished profile in it.

The formats are one list, `FORMATS`: a format plugs in as its module, a `Format` member
and one `OutputFormat` line (its file-name endings and its `ProfileWriter`).

Every profile file is written atomically: into a temporary file beside it, flushed to
disk, then renamed over the name asked for. A reader (or a crash, or a full disk) sees
the old file or the whole new one, never half of one; a failure removes the temporary.
"""

from __future__ import annotations

import importlib
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from qmpprof.errors import UsageError
from qmpprof.model import Recording, Sample
from qmpprof.output.folded import write_folded
from qmpprof.profile import Grouping, Profile, Scope


class Format(Enum):
    FOLDED = "folded"
    SPEEDSCOPE = "speedscope"
    SVG = "svg"
    PPROF = "pprof"
    QMPCAP = "qmpcap"


class ProfileWriter(Protocol):
    """Writes a finished profile to `path`, replacing it; raises OSError."""

    def __call__(
        self, samples: Sequence[Sample], profile: Profile, recording: Recording, path: Path
    ) -> None: ...


class _SampleWriter(Protocol):
    """The signature of the formats written sample by sample (speedscope, svg, pprof)."""

    def __call__(
        self,
        samples: Sequence[Sample],
        recording: Recording,
        path: Path,
        scope: Scope,
        include_idle: bool,
        grouping: Grouping,
    ) -> None: ...


def _folded(samples: Sequence[Sample], profile: Profile, recording: Recording, path: Path) -> None:
    write_folded(profile, path)


def _from_samples(module: str, function: str) -> ProfileWriter:
    """The writer `function` of `qmpprof.output.<module>`, imported when first used: each
    costs tens of milliseconds to import, which a recording need not pay for formats it
    does not write."""

    def write(
        samples: Sequence[Sample], profile: Profile, recording: Recording, path: Path
    ) -> None:
        loaded = importlib.import_module(f"qmpprof.output.{module}")
        writer: _SampleWriter = getattr(loaded, function)
        writer(samples, recording, path, profile.scope, profile.include_idle, profile.grouping)

    return write


@dataclass(frozen=True)
class OutputFormat:
    format: Format
    #: File-name endings that pick this format (lower case).
    suffixes: tuple[str, ...]
    #: None: not written from a finished profile (a capture is written while recording).
    write: ProfileWriter | None


FORMATS = (
    OutputFormat(Format.FOLDED, (".folded", ".txt"), _folded),
    OutputFormat(
        Format.SPEEDSCOPE, (".speedscope.json",), _from_samples("speedscope", "write_speedscope")
    ),
    OutputFormat(Format.SVG, (".svg",), _from_samples("flamegraph", "write_flamegraph")),
    OutputFormat(Format.PPROF, (".pb.gz", ".pb", ".pprof"), _from_samples("pprof", "write_pprof")),
    OutputFormat(Format.QMPCAP, (".qmpcap",), None),
)
_BY_FORMAT = {output.format: output for output in FORMATS}


def infer_format(path: Path, explicit: str | None) -> Format:
    """`--format` if given, else from the file name; folded for names we do not know."""
    if explicit is not None:
        return Format(explicit)
    name = path.name.lower()
    return next(
        (o.format for o in FORMATS if any(name.endswith(suffix) for suffix in o.suffixes)),
        Format.FOLDED,
    )


def write_profile(
    fmt: Format,
    samples: Sequence[Sample],
    profile: Profile,
    recording: Recording,
    path: Path,
) -> None:
    """Write a finished profile (any format but the streamed qmpcap) atomically.

    Raises UsageError for qmpcap, OSError when the file cannot be written."""
    write = _BY_FORMAT[fmt].write
    if write is None:
        raise UsageError(f"{fmt.value} is written while recording, not from a profile")
    with replaced_atomically(path) as temporary:
        write(samples, profile, recording, temporary)


@contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, renamed over it when the block ends normally and
    removed when it raises. A symlink is followed (the file it names is replaced, the link
    kept); a target that is not a regular file (a FIFO, /dev/stdout) is written in place,
    as renaming over it would replace the device rather than write to it."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        yield target
        return
    temporary = temporary_beside(target)
    try:
        yield temporary
        _keep_mode(target, temporary)
        _flush_to_disk(temporary)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def temporary_beside(target: Path) -> Path:
    """Create an empty, new file in `target`'s directory (same file system, so the rename
    is atomic), with the mode a plain open would give it. Raises OSError."""
    stem = target.name[:180]  # room for the suffix within the 255-byte name limit
    for _ in range(100):
        candidate = target.with_name(f".{stem}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"no free temporary name beside {target}")


def _keep_mode(target: Path, temporary: Path) -> None:
    """A file replaced keeps its permissions, as it would when overwritten in place."""
    if target.exists():
        os.chmod(temporary, stat.S_IMODE(target.stat().st_mode))


def _flush_to_disk(path: Path) -> None:
    """Data on disk before the rename: after a power loss the name never points at an
    empty file."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
