"""`qmpprof report CAPTURE`: any output format from a `.qmpcap` capture file, offline."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from qmpprof.commands.collect import Collector, check_writable, raise_for_failures, show_written
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.console import Console, say, stderr_console
from qmpprof.console.summary import render_profile
from qmpprof.errors import UsageError
from qmpprof.model import CapturedSample, Frame, FrameName, Sample
from qmpprof.output.writers import Format
from qmpprof.profile import Grouping, Profile, Scope
from qmpprof.record.qmpcap import Capture, read_capture
from qmpprof.symbols.kernel_object import ModuleFiles


@dataclass(frozen=True)
class ReportOptions:
    capture: Path
    target: TargetOptions
    outputs: tuple[tuple[Path, Format], ...] = ((Path("profile.folded"), Format.FOLDED),)
    include_idle: bool = False
    scope: Scope = Scope.ALL
    grouping: Grouping = Grouping.THREAD
    reunwind: bool = False


def run_report(options: ReportOptions, out: Console, err: Console | None = None) -> None:
    """Re-symbolize (or, with --reunwind, unwind again) a capture and write the outputs.

    A damaged capture is read up to its last intact record, and one warning line on
    `err` (default: stderr) says what was dropped. The kernel recorded in the capture is
    used when --kernel is not given and it still exists. Raises QmpprofError
    (BadCapture, BadElf, UsageError, OutputError).
    """
    if any(fmt is Format.QMPCAP for _, fmt in options.outputs):
        raise UsageError("report writes profiles; the capture file is its input")
    check_writable([path for path, _ in options.outputs])
    with read_capture(options.capture) as capture:
        collector = _replay(options, capture)
    if capture.damage is not None:
        say(err or stderr_console(), f"warning: {capture.damage}")
    written = collector.write_outputs(options.outputs, capture.recording)
    show_written(written, out)
    render_profile(collector.profile, out)
    raise_for_failures(written)


def _replay(options: ReportOptions, capture: Capture) -> Collector:
    target = options.target
    kernel = capture.recording.kernel
    if target.kernel is None and kernel and Path(kernel).exists():
        target = TargetOptions(**{**target.__dict__, "kernel": Path(kernel)})
    analyzer = build_analyzer(target)
    if capture.recording.kernel_bias:
        analyzer.relocate_kernel(capture.recording.kernel_bias)
    loaded = capture.recording.kernel_modules
    files = ModuleFiles(target.module_dirs, lambda line: say(stderr_console(), line))
    analyzer.place_kernel_modules(loaded, files.for_modules(loaded))
    collector = Collector(analyzer, Profile(options.include_idle, options.scope, options.grouping))
    for entry in capture.samples():
        _add(collector, entry, options.reunwind)
    return collector


def _add(collector: Collector, entry: CapturedSample, reunwind: bool) -> None:
    """Add one replayed sample; one the analysis fails on is counted, as when recording."""
    analyzer = collector.analyzer
    try:
        named = entry
        if reunwind and entry.raw.windows:
            entry = analyzer.examine(entry.raw).sample
        collector.add(named_as_recorded(analyzer.symbolize(entry), named))
    except Exception as error:  # a capture is input: one odd sample must not lose the rest
        collector.profile.unanalysed += 1
        collector.profile.last_error = f"{type(error).__name__}: {error}"


def named_as_recorded(sample: Sample, recorded: CapturedSample) -> Sample:
    """`sample` with the frames that report's own symbols leave unnamed named as they
    were when `recorded` (a frame at the same address, kind and recovery): names read
    from the guest's memory, which report has no copy of."""
    names = {
        address: name
        for address, name in zip(recorded.stack.frames, recorded.names, strict=False)
        if name is not None
    }
    if not names:
        return sample
    frames = tuple(_renamed(frame, names.get(frame.address)) for frame in sample.frames)
    if frames == sample.frames:
        return sample
    named_leaf = frames[0].function is not None
    return replace(sample, frames=frames, unsymbolized=None if named_leaf else sample.unsymbolized)


def _renamed(frame: Frame, name: FrameName | None) -> Frame:
    if frame.function is not None or name is None:
        return frame
    return replace(frame, function=name.function, offset=name.offset, module=name.module)
