"""The live `top` view: a header and a table of the hottest functions or processes.

The only module that draws with rich's live display (`live_screen`); guest strings always go in as
Text, never as markup, and through `visible`: a process named `\\x1b[2J` must not
clear the screen it is listed on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from qmpprof.model import Mode, RecordStats
from qmpprof.top_stats import Row, SortKey, TopStats
from qmpprof.visible import visible

#: Under 80 columns either way: a line that wraps pushes the table down a row.
KEYS_HELP = "o/t/n sort  k/u/i kernel/user/idle  p processes  r reset  space {}  q quit"
HELP_TEXT = """Keys
  o  sort by own samples (the function itself is running)
  t  sort by total samples (the function is anywhere on the stack)
  n  sort by name
  k  show/hide samples taken in the kernel
  u  show/hide samples taken in user space
  i  show/hide idle (halted) samples
  p  switch between functions, processes and programs (a program's processes together)
  r  reset the counts
  space  pause/resume the display (sampling goes on)
  q  quit (the VM keeps running)
  h  show/hide this help"""


class Listing(Enum):
    """What the table lists, its last column's heading as the value."""

    FUNCTIONS = "Function (module)"
    PROCESSES = "Process"
    #: A row per program: every process of one name together (`--group-by comm`).
    PROGRAMS = "Program"

    def next(self) -> Listing:
        """The listing `p` goes to: functions, processes, programs, functions again."""
        members = list(Listing)
        return members[(members.index(self) + 1) % len(members)]


@dataclass
class ViewState:
    """What the user chose with the keys."""

    sort: SortKey = SortKey.OWN
    listing: Listing = Listing.FUNCTIONS
    paused: bool = False
    help: bool = False
    rows: int = 15


@contextmanager
def live_screen(console: Console) -> Iterator[Callable[[RenderableType], None]]:
    """The terminal's whole screen, redrawn with each screen given to the function yielded;
    the terminal's own screen comes back on the way out."""
    with Live(console=console, screen=True, auto_refresh=False) as live:
        yield lambda screen: live.update(screen, refresh=True)


def render(stats: TopStats, record: RecordStats, state: ViewState, title: str) -> RenderableType:
    """The whole screen for one refresh."""
    if state.help:
        return Text(HELP_TEXT)
    # The header says the display is paused: it is read first, and cut (at the title)
    # rather than wrapped in a narrow terminal.
    header = ("[display paused]  " if state.paused else "") + _header(record, title)
    parts: list[RenderableType] = [
        Text(header, no_wrap=True, overflow="ellipsis"),
        Text(_modes(stats), no_wrap=True, overflow="ellipsis"),
        Text(_vcpus(stats, state.listing is Listing.PROGRAMS), no_wrap=True, overflow="ellipsis"),
        _table(stats, state),
        Text(KEYS_HELP.format("resume" if state.paused else "pause"), style="dim"),
    ]
    return Group(*parts)


def plain_snapshot(stats: TopStats, record: RecordStats, state: ViewState, title: str) -> str:
    """The same information as text lines, for a stdout that is not a terminal."""
    lines = [
        _header(record, title),
        _modes(stats),
        _vcpus(stats, state.listing is Listing.PROGRAMS),
    ]
    lines.append(f"{'%Own':>6} {'%Total':>7} {'Own':>6} {'Total':>6}  {state.listing.value}")
    for row in _rows(stats, state):
        lines.append(_row_cells(stats, row))
    return "\n".join(lines)


def _header(record: RecordStats, title: str) -> str:
    paused = 100 * record.paused_s / record.elapsed_s if record.elapsed_s else 0.0
    # The figures first: a long socket path is what gets cut in a narrow terminal.
    return (
        f"{record.rate_hz:.1f} ticks/s  late {record.late}  failed {record.failed}  "
        f"VM paused {paused:.1f}%  {_skipped(record)}{_retakes(record)}"
        f"— qmpprof top {visible(title)}"
    )


def _skipped(record: RecordStats) -> str:
    """Ticks skipped because someone else held the VM paused; nothing while none was."""
    return f"skipped {record.skipped_paused} (paused by others)  " if record.skipped_paused else ""


def _retakes(record: RecordStats) -> str:
    """--nonblocking's torn stacks (as the record summary gives them): vCPU samples
    taken again, and those published torn all the same; nothing while none tore."""
    if not record.retaken and not record.still_torn:
        return ""
    return f"retaken {record.retaken}  still torn {record.still_torn}  "


def _modes(stats: TopStats) -> str:
    total = sum(stats.modes.values()) or 1
    shown = " ".join(f"{m.value} {100 * stats.modes[m] / total:.1f}%" for m in Mode)
    hidden = [
        m
        for m, on in (
            ("kernel", stats.show_kernel),
            ("user", stats.show_user),
            ("idle", stats.show_idle),
        )
        if not on
    ]
    return shown + (f"  (hidden: {', '.join(hidden)})" if hidden else "")


def _vcpus(stats: TopStats, programs: bool) -> str:
    ticks = stats.ticks or 1
    cpus = " ".join(f"vCPU{n} busy {100 * c / ticks:.0f}%" for n, c in sorted(stats.vcpus.items()))
    counts = stats.programs if programs else stats.processes
    top = ", ".join(f"{visible(name)} {stats.percent(c):.0f}%" for name, c in counts.most_common(3))
    heading = "programs" if programs else "processes"
    return f"{cpus}  {heading}: {top or '-'}"


def _rows(stats: TopStats, state: ViewState) -> list[Row]:
    if state.listing is not Listing.FUNCTIONS:
        by_program = state.listing is Listing.PROGRAMS
        return stats.process_rows(state.sort, state.rows, by_program=by_program)
    return stats.function_rows(state.sort, state.rows)


def _table(stats: TopStats, state: ViewState) -> Table:
    table = Table(box=None, expand=True, show_edge=False, pad_edge=False)
    for name in ("%Own", "%Total", "Own", "Total"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column(state.listing.value, overflow="ellipsis", no_wrap=True, ratio=1)
    for row in _rows(stats, state):
        name = _row_name(row, state.listing is not Listing.FUNCTIONS)
        table.add_row(
            f"{stats.percent(row.own):.1f}",
            f"{stats.percent(row.total):.1f}",
            str(row.own),
            str(row.total),
            Text(name),
        )
    return table


def _row_name(row: Row, process: bool) -> str:
    """`function (module)`, or the process label: what the last column shows, made visible."""
    if process or not row.module:
        return visible(row.name)
    return f"{visible(row.name)} ({visible(row.module)})"


def _row_cells(stats: TopStats, row: Row) -> str:
    return (
        f"{stats.percent(row.own):6.1f} {stats.percent(row.total):7.1f} {row.own:6d} "
        f"{row.total:6d}  {_row_name(row, process=False)}"
    )
