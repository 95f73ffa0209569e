"""One-shot stack dumps: text for people, JSON for programs.

Both list inlined calls as frames of their own, as GDB's backtrace does: the inlined
function above its caller, at the same address. The text goes through `visible`
(guest names may hold control characters); the JSON is escaped by json.dumps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from qmpprof.model import Frame, Process, Sample
from qmpprof.symbols.lines import SourceFrame, SourceLookup
from qmpprof.visible import visible


def dump_json(
    samples: Sequence[Sample], sources: SourceLookup | None = None, lines: bool = False
) -> str:
    """Exactly one JSON object: {"vcpus": [...]}, frames leaf first, inlined calls included
    when `sources` is given; `lines` adds each frame's "file" and "line"."""
    vcpus = [_vcpu_json(s, sources, lines) for s in samples]
    return json.dumps({"vcpus": vcpus}, indent=2)


def _vcpu_json(sample: Sample, sources: SourceLookup | None, lines: bool) -> dict[str, object]:
    process = sample.process
    return {
        "vcpu": sample.vcpu,
        "mode": sample.mode.value,
        "pc": f"{sample.frames[0].address.address:#x}",
        "bits": sample.bits,
        "cr3": f"{sample.address_space:#x}",
        "process": None if process is None else _process_json(process),
        "frames": [
            entry
            for frame in sample.frames
            for entry in _frame_json(frame, _source_frames(frame, sources), lines)
        ],
        "stop": sample.stop.value,
    }


def _process_json(process: Process) -> dict[str, object]:
    """pid None: no process (a kernel thread, an idle or kernel-only CPU); tid None: the
    OS adapter tells no threads apart."""
    return {"pid": process.pid, "tid": process.tid, "name": process.name}


def _frame_json(frame: Frame, sources: list[SourceFrame], lines: bool) -> list[dict[str, object]]:
    entries = []
    for source in sources:
        entry: dict[str, object] = {
            "address": f"{frame.address.address:#x}",
            "function": source.function if source.inlined else frame.function,
            "offset": None if source.inlined else frame.offset,
            "module": frame.module,
            "inlined": source.inlined,
        }
        if lines:
            entry["file"] = source.line.file if source.line else None
            entry["line"] = source.line.line if source.line else None
        entries.append(entry)
    return entries


def dump_text(
    samples: Sequence[Sample], sources: SourceLookup | None = None, lines: bool = False
) -> str:
    """Each vCPU's stack, leaf first: `#N 0xADDR function+0xoff (module)`, an inlined call
    as `#N 0xADDR function (module) [inlined]`; `lines` adds ` file:line` after the module."""
    return "\n\n".join(_vcpu_text(s, sources, lines) for s in samples) + "\n"


def _vcpu_text(sample: Sample, sources: SourceLookup | None, lines: bool) -> str:
    pc = sample.frames[0].address.address
    label = visible(sample.label())
    width = "" if sample.bits == 64 else f" ({sample.bits}-bit)"
    text = [f"vCPU {sample.vcpu} [{sample.mode.value}] {label} pc={pc:#x}{width}"]
    digits = 18 if sample.bits == 64 else 10  # 0x and the addresses' hex digits
    number = 0
    for frame in sample.frames:
        for source in _source_frames(frame, sources):
            line = _frame_line(frame, source, lines)
            text.append(f"  #{number:<2} {frame.address.address:#0{digits}x} {line}")
            number += 1
    stop = sample.stop.value
    if sample.fault_address is not None:
        stop += f" at {sample.fault_address:#x}"
    text.append(f"  ({stop})")
    return "\n".join(text)


def _frame_line(frame: Frame, source: SourceFrame, lines: bool) -> str:
    where = f" {visible(str(source.line))}" if lines and source.line else ""
    if source.inlined:
        name, module = visible(source.function or "?"), visible(frame.module or "?")
        return f"{name} ({module}){where} [inlined]"
    return f"{describe_frame(frame)}{where}"


def _source_frames(frame: Frame, sources: SourceLookup | None) -> list[SourceFrame]:
    """The frame as source frames, innermost first: its inlined calls, then itself."""
    if sources is None:
        return [SourceFrame(frame.function, None, inlined=False)]
    return sources.expand(frame.module, frame.function, frame.address.lookup_address, frame.mapping)


def describe_frame(frame: Frame) -> str:
    """`function+0xoff (module)`; where no symbol covers it, the file and file address
    (`libc.so.6+0x2d678`) or the bare address."""
    if frame.function is None:
        return visible(frame.label())
    return f"{visible(frame.function)}+{frame.offset:#x} ({visible(frame.module or '?')})"
