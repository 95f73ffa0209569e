"""`qmpprof report CAPTURE`: any output format from a `.qmpcap` capture file, offline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.commands.collect import Collector, check_writable, raise_for_failures, show_written
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.console import Console, say, stderr_console
from qmpprof.console.summary import render_profile
from qmpprof.errors import UsageError
from qmpprof.model import (
    CapturedSample,
    Frame,
    FrameName,
    RawSample,
    Recovery,
    Sample,
    StopReason,
    UnwoundStack,
    is_kernel_address,
)
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
            entry = reunwound(analyzer, entry)
        collector.add(named_as_recorded(analyzer.symbolize(entry), named))
    except Exception as error:  # a capture is input: one odd sample must not lose the rest
        collector.profile.unanalysed += 1
        collector.profile.last_error = f"{type(error).__name__}: {error}"


def named_as_recorded(sample: Sample, recorded: CapturedSample) -> Sample:
    """`sample` with the frames that report's own symbols leave unnamed named as they
    were when `recorded` (a frame at the same address, of the same kind: however it was
    found, by CFI or frame pointers): names read from the guest's memory, which report
    has no copy of."""
    names = {
        (address.address, address.kind): name
        for address, name in zip(recorded.stack.frames, recorded.names, strict=False)
        if name is not None
    }
    if not names:
        return sample
    frames = tuple(
        _renamed(frame, names.get((frame.address.address, frame.address.kind)))
        for frame in sample.frames
    )
    if frames == sample.frames:
        return sample
    named_leaf = frames[0].function is not None
    return replace(sample, frames=frames, unsymbolized=None if named_leaf else sample.unsymbolized)


def _renamed(frame: Frame, name: FrameName | None) -> Frame:
    if frame.function is not None or name is None:
        return frame
    return replace(frame, function=name.function, offset=name.offset, module=name.module)


def reunwound(analyzer: Analyzer, recorded: CapturedSample) -> CapturedSample:
    """`recorded`'s memory examined again by report's `analyzer`, with what report could
    not know taken from `recorded`: its process when report's OS adapter names none (no
    kernel file: the recording's kernel was read from the guest's memory), and its
    frames beyond where report lacked what the recording unwound by (spliced_stack)."""
    again = analyzer.examine(recorded.raw).sample
    process = again.process if again.process is not None else recorded.process

    def lacks(address: int) -> bool:
        return _lacks_code(analyzer, recorded.raw, address)

    stack = spliced_stack(recorded.stack, again.stack, lacks)
    return replace(again, stack=stack, process=process)


def spliced_stack(
    recorded: UnwoundStack, again: UnwoundStack, lacks: Callable[[int], bool]
) -> UnwoundStack:
    """`again`, unwound by report, up to the first frame where it leaves `recorded`; from
    there `recorded`'s frames when the recording found that frame by what report lacks:
    the code the frame before lies in (`lacks(address)`: a kernel or a file read from
    the guest's memory, which report has no copy of), or the recording found it by CFI,
    ORC or the task's saved user registers (the kernel's OS adapter reads them) and
    report found none there, or only by frame pointers. The same memory unwound with
    the same code and tables gives the same frames, so where report found a frame of
    its own with code of its own (a vmlinux, a sysroot), or stopped at --max-depth, its
    stack stands."""
    ours, theirs = again.frames, recorded.frames
    split = next(
        (at for at, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a.address != b.address),
        min(len(ours), len(theirs)),
    )
    if split == 0 or split >= len(theirs):
        return again
    if split == len(ours) and again.stop is StopReason.MAX_DEPTH:
        return again
    by_tables = theirs[split].how is not Recovery.FRAME_POINTER and (
        split == len(ours) or ours[split].how is Recovery.FRAME_POINTER
    )
    if not by_tables and not lacks(theirs[split - 1].lookup_address):
        return again
    frames = (*ours[:split], *theirs[split:])
    return UnwoundStack(frames, recorded.stop, recorded.fault_address)


def _lacks_code(analyzer: Analyzer, raw: RawSample, address: int) -> bool:
    """Whether report has no copy of the code at `address`: a kernel address with no
    kernel, a user address in a file the process maps with no host copy found."""
    if is_kernel_address(address):
        return analyzer.kernel is None
    mapping = next((m for m in raw.file_maps or () if m.start <= address < m.end), None)
    return mapping is not None and analyzer.files.module_for(mapping) is None
