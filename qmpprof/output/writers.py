"""Which output format a file gets, and writing a finished profile in it."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from pathlib import Path

from qmpprof.errors import UsageError
from qmpprof.model import Recording, Sample
from qmpprof.output.folded import write_folded
from qmpprof.profile import Profile


class Format(Enum):
    FOLDED = "folded"
    SPEEDSCOPE = "speedscope"
    SVG = "svg"
    PPROF = "pprof"
    QMPCAP = "qmpcap"


_SUFFIXES = (
    (".speedscope.json", Format.SPEEDSCOPE),
    (".qmpcap", Format.QMPCAP),
    (".pb.gz", Format.PPROF),
    (".pb", Format.PPROF),
    (".svg", Format.SVG),
    (".folded", Format.FOLDED),
    (".txt", Format.FOLDED),
)


def infer_format(path: Path, explicit: str | None) -> Format:
    """`--format` if given, else from the file name; folded for names we do not know."""
    if explicit is not None:
        return Format(explicit)
    name = path.name.lower()
    return next((fmt for suffix, fmt in _SUFFIXES if name.endswith(suffix)), Format.FOLDED)


def write_profile(
    fmt: Format,
    samples: Sequence[Sample],
    profile: Profile,
    recording: Recording,
    path: Path,
) -> None:
    """Write a finished profile (any format but the streamed qmpcap). Raises UsageError."""
    scope, idle = profile.scope, profile.include_idle
    if fmt is Format.FOLDED:
        write_folded(profile, path)
    elif fmt is Format.SPEEDSCOPE:
        from qmpprof.output.speedscope import write_speedscope

        write_speedscope(samples, recording, path, scope, idle)
    elif fmt is Format.SVG:
        from qmpprof.output.flamegraph import write_flamegraph

        write_flamegraph(samples, recording, path, scope, idle)
    elif fmt is Format.PPROF:
        from qmpprof.output.pprof import write_pprof

        write_pprof(samples, recording, path, scope, idle)
    else:
        raise UsageError(f"{fmt.value} is written while recording, not from a profile")
