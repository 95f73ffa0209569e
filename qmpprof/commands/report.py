"""`qmpprof report CAPTURE`: any output format from a `.qmpcap` capture file, offline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from qmpprof.commands.collect import Collector, check_writable
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.errors import UsageError
from qmpprof.output.summary import render_profile
from qmpprof.output.writers import Format
from qmpprof.profile import Profile, Scope
from qmpprof.record.capfile import read_capture


@dataclass(frozen=True)
class ReportOptions:
    capture: Path
    target: TargetOptions
    outputs: tuple[tuple[Path, Format], ...] = ((Path("profile.folded"), Format.FOLDED),)
    include_idle: bool = False
    scope: Scope = Scope.ALL
    reunwind: bool = False


def run_report(options: ReportOptions, out: Console) -> None:
    """Re-symbolize (or, with --reunwind, unwind again) a capture and write an output.

    The kernel recorded in the capture is used when --kernel is not given and it
    still exists. Raises QmpprofError (BadCapture, BadElf, UsageError).
    """
    if any(fmt is Format.QMPCAP for _, fmt in options.outputs):
        raise UsageError("report writes profiles; the capture file is its input")
    check_writable([path for path, _ in options.outputs])
    recording, captured = read_capture(options.capture)
    target = options.target
    if target.kernel is None and recording.kernel and Path(recording.kernel).exists():
        target = TargetOptions(**{**target.__dict__, "kernel": Path(recording.kernel)})
    analyzer = build_analyzer(target)
    collector = Collector(analyzer, Profile(options.include_idle, options.scope))
    for entry in captured:
        if options.reunwind and entry.raw.windows:
            collector.add(analyzer.analyze(entry.raw))
        else:
            collector.add(analyzer.symbolize(entry.raw, entry.stack, entry.process))
    for path, fmt in options.outputs:
        collector.write(fmt, recording, path, out)
    render_profile(collector.profile, out)
