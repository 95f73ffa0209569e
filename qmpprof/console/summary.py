"""The end-of-recording summary: counts, timing and the heaviest stacks.

Every guest string (process, function, module) goes through `visible`, and into rich as
Text, never as markup: it shows literally, control characters spelled out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qmpprof.model import Mode, RecordStats
from qmpprof.profile import Grouping, Profile
from qmpprof.visible import visible

SHOWN_FRAMES = 8
#: Processes the summary names, busiest first; the rest are counted.
SUMMARY_PROCESSES = 12


def render_summary(
    profile: Profile,
    stats: RecordStats,
    console: Console,
    notes: Sequence[str] = (),
    limit: int = 10,
    kernel: str | None = None,
    host: str | None = None,
) -> None:
    """Print what was recorded, where the kernel ran (`kernel`, a `kernel_line`), where
    the QEMU process's time went (`host`, `record --host`), `notes` (problems worth
    knowing, one line each) and the `limit` heaviest stacks with percentages."""
    console.print(Text(_counts_line(stats)), soft_wrap=True)
    retakes = retakes_line(stats)
    if retakes is not None:
        console.print(Text(retakes), soft_wrap=True)
    for line in (kernel, host):
        if line is not None:
            console.print(Text(visible(line)), soft_wrap=True)
    for note in notes:
        console.print(Text(visible(note)), style="yellow", soft_wrap=True)
    if stats.failed and stats.last_error:
        console.print(Text(f"last failure: {visible(stats.last_error)}"), soft_wrap=True)
    if stats.ended_by:
        console.print(
            Text(f"recording ended early: {visible(str(stats.ended_by))}"),
            style="yellow",
            soft_wrap=True,
        )
    render_profile(profile, console, limit)


def kernel_line(kernel: Path, bias: int) -> str:
    """The kernel ELF and where the guest runs it: `kernel: vmlinux, KASLR slide 0x…`."""
    where = f"KASLR slide {bias:#x}" if bias else "at its link address"
    return f"kernel: {visible(kernel.name)}, {where}"


def render_profile(profile: Profile, console: Console, limit: int = 10) -> None:
    """Print the mode and process split, unsymbolized counts and the heaviest stacks."""
    console.print(Text(_modes_line(profile)), soft_wrap=True)
    if profile.processes:
        console.print(Text(_processes_line(profile)), soft_wrap=True)
    if profile.unanalysed:
        console.print(
            Text(
                f"samples that could not be analysed: {profile.unanalysed} "
                f"(last: {visible(profile.last_error or '')})"
            ),
            style="yellow",
            soft_wrap=True,
        )
    if profile.torn:
        console.print(
            Text(
                f"torn stacks: {profile.torn} samples have a return address that "
                "does not follow a call"
            ),
            soft_wrap=True,
        )
    for reason, count in profile.unsymbolized.most_common():
        line = f"unsymbolized user samples: {count} ({visible(str(reason))})"
        console.print(Text(line), soft_wrap=True)
    if profile.stacked:
        console.print(top_stacks_table(profile, limit))


def _counts_line(stats: RecordStats) -> str:
    paused_pct = 100 * stats.paused_s / stats.elapsed_s if stats.elapsed_s else 0.0
    line = (
        f"{stats.ticks} ticks ({stats.samples} vCPU samples) in {stats.elapsed_s:.1f} s, "
        f"{stats.rate_hz:.1f} Hz; requested {stats.requested}, late {stats.late}, "
        f"missed {stats.missed}, failed {stats.failed}; "
        f"VM paused by qmpprof {stats.paused_s * 1000:.0f} ms ({paused_pct:.2f}%)"
    )
    if stats.skipped_paused:
        line += f"; {stats.skipped_paused} ticks skipped while the VM was paused by others"
    if stats.abandoned:
        line += f"; {stats.abandoned} ticks abandoned over their time budget (VM resumed)"
    return line


def retakes_line(stats: RecordStats) -> str | None:
    """What --nonblocking did about torn stacks: how many samples were taken again, at
    what cost, and how many stayed torn; None when no stack tore."""
    if not stats.retaken and not stats.still_torn:
        return None
    share = 100 * stats.retaken / stats.samples if stats.samples else 0.0
    reads = "register read" if stats.retakes == 1 else "register reads"
    return (
        f"torn stacks retaken: {stats.retaken} vCPU samples ({share:.1f}%) tore while read "
        f"and were taken again, in {stats.retakes} more {reads} (the VM running); "
        f"{stats.still_torn} still torn after the retakes"
    )


def _modes_line(profile: Profile) -> str:
    total = profile.total or 1
    parts = [f"{m.value} {profile.modes[m]} ({100 * profile.modes[m] / total:.1f}%)" for m in Mode]
    return "samples: " + ", ".join(parts)


def _processes_line(profile: Profile) -> str:
    """The busiest SUMMARY_PROCESSES processes, then how many more and their share (a
    guest that forks and execs has one label per pid: hundreds in a few seconds)."""
    total = sum(profile.processes.values()) or 1
    ranked = profile.processes.most_common()
    shown, rest = ranked[:SUMMARY_PROCESSES], ranked[SUMMARY_PROCESSES:]
    parts = [f"{visible(label)} {100 * n / total:.1f}%" for label, n in shown]
    if rest:
        share = 100 * sum(n for _, n in rest) / total
        parts.append(f"{len(rest)} more {share:.1f}%")
    heading = "programs" if profile.grouping is Grouping.COMM else "processes"
    return f"{heading}: " + ", ".join(parts)


def top_stacks_table(profile: Profile, limit: int) -> Table:
    """The heaviest stacks, leaf first, as a rich table (guest strings never read as markup)."""
    table = Table(title=f"Top {limit} stacks", title_justify="left", expand=False)
    table.add_column("%", justify="right")
    table.add_column("samples", justify="right")
    table.add_column("stack (leaf ← root)")
    for stack in profile.top(limit):
        percent = 100 * stack.count / profile.stacked
        table.add_row(f"{percent:.1f}", str(stack.count), Text(_leaf_first(stack.frames)))
    return table


def _leaf_first(frames: tuple[str, ...]) -> str:
    leaf_first = [visible(frame) for frame in reversed(frames)]
    shown = leaf_first[:SHOWN_FRAMES]
    if len(leaf_first) > SHOWN_FRAMES:
        shown.append(f"… {len(leaf_first) - SHOWN_FRAMES} more")
    return " ← ".join(shown)
