"""Folded stacks (`root;caller;leaf count`), as read by flamegraph.pl, inferno and speedscope."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from qmpprof.profile import Profile
from qmpprof.visible import visible


def folded_lines(profile: Profile) -> Iterator[str]:
    """One line per distinct stack, heaviest first."""
    for stack in profile.top(len(profile.stacks)):
        yield f"{';'.join(clean_frame(f) for f in stack.frames)} {stack.count}"


def clean_frame(name: str) -> str:
    """A frame name that cannot break the format nor a terminal it is `cat` to: ';' (the
    frame separator) becomes ':', and every control character, line breaks and tabs
    included, is spelled out as `visible` does (`\\n`, `\\t`, `\\x1b`): plain text that
    flamegraph.pl, inferno and speedscope show as it is."""
    return visible(name.replace(";", ":")) or "?"


def write_folded(profile: Profile, path: Path) -> None:
    """Write the profile to `path` (replacing it)."""
    text = "".join(line + "\n" for line in folded_lines(profile))
    path.write_text(text, encoding="utf-8")
