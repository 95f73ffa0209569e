"""Folded stacks (`root;caller;leaf count`), as read by flamegraph.pl, inferno and speedscope."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from qmpprof.profile import Profile

_UNSAFE = str.maketrans({";": ":", "\n": " ", "\r": " "})


def folded_lines(profile: Profile) -> Iterator[str]:
    """One line per distinct stack, heaviest first."""
    for stack in profile.top(len(profile.stacks)):
        yield f"{';'.join(clean_frame(f) for f in stack.frames)} {stack.count}"


def clean_frame(name: str) -> str:
    """A frame name that cannot break the format: no ';' and no line breaks."""
    return name.translate(_UNSAFE) or "?"


def write_folded(profile: Profile, path: Path) -> None:
    """Write the profile to `path` (replacing it)."""
    text = "".join(line + "\n" for line in folded_lines(profile))
    path.write_text(text, encoding="utf-8")
