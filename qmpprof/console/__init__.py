"""What qmpprof draws on a terminal, and the only package that imports rich.

Commands get their consoles from `terminal()` and print one-line messages with `say`;
the renderers beside this module draw the rest: `summary` (after a recording or a
report), `progress` (while recording) and `top` (the live view). The file formats in
`output/` never draw: they write files.

rich is imported when a console is first made, not with this package: `qmpprof dump`
prints through `plain_stdout()` and never needs it (importing rich takes a tenth of
its start-up).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console as Console


def __getattr__(name: str) -> object:
    """`Console`, rich's, imported on first use (PEP 562)."""
    if name == "Console":
        from rich.console import Console

        return Console
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def terminal() -> tuple[Console, Console]:
    """The consoles for stdout and stderr. Nothing is highlighted: numbers and paths
    in guest text stay as they are."""
    from rich.console import Console

    return Console(highlight=False), stderr_console()


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def say(console: Console, line: str, style: str | None = None) -> None:
    """One message, printed literally (never read as markup or emoji codes: it may hold
    guest text or a path) and wrapped only by the terminal."""
    from rich.text import Text

    console.print(Text(line), style=style or "", soft_wrap=True)


class Printer(Protocol):
    """What prints a command's raw output: rich's Console.out, or `plain_stdout()`'s."""

    def out(
        self, *objects: object, sep: str = " ", end: str = "\n", highlight: bool | None = None
    ) -> None: ...


def plain_stdout() -> Printer:
    """A Printer for stdout that writes text as rich's Console.out(highlight=False) would
    (unstyled, unwrapped), without importing rich: text with characters rich changes
    (tabs, control characters) still goes through a rich Console."""
    return _PlainStdout()


class _PlainStdout:
    def __init__(self) -> None:
        self._console: Console | None = None

    def out(
        self, *objects: object, sep: str = " ", end: str = "\n", highlight: bool | None = None
    ) -> None:
        text = sep.join(str(o) for o in objects)
        if highlight is False and _plain(text) and _plain(end):
            _write(text + end)
            return
        if self._console is None:
            self._console = terminal()[0]
        self._console.out(text, end=end, highlight=highlight)


def _write(text: str) -> None:
    """Write as rich's Console does: to sys.stdout as it is at the time (rich's own
    redirection undone), flushed; a closed pipe ends the process as rich ends it."""
    stream = getattr(sys.stdout, "rich_proxied_file", sys.stdout)
    if stream is None:
        return
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError as error:
            error.reason = (
                f"{error.reason}\n*** You may need to add PYTHONIOENCODING=utf-8 to your "
                "environment ***"
            )
            raise
        stream.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None


def _plain(text: str) -> bool:
    """Whether rich's Text would keep `text` as it is: line breaks and printable
    characters only (rich expands tabs and drops control codes such as \\r)."""
    return "\t" not in text and text.replace("\n", "").isprintable()
