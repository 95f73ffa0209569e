"""What qmpprof draws on a terminal, and the only package that imports rich.

Commands get their consoles from `terminal()` and print one-line messages with `say`;
the renderers beside this module draw the rest: `summary` (after a recording or a
report), `progress` (while recording) and `top` (the live view). The file formats in
`output/` never draw: they write files.
"""

from __future__ import annotations

from rich.console import Console as Console
from rich.text import Text


def terminal() -> tuple[Console, Console]:
    """The consoles for stdout and stderr. Nothing is highlighted: numbers and paths
    in guest text stay as they are."""
    return Console(highlight=False), stderr_console()


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def say(console: Console, line: str, style: str | None = None) -> None:
    """One message, printed literally (never read as markup or emoji codes: it may hold
    guest text or a path) and wrapped only by the terminal."""
    console.print(Text(line), style=style or "", soft_wrap=True)
