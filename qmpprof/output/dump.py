"""One-shot stack dumps: text for people, JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence

from qmpprof.model import Frame, Sample
from qmpprof.symbols.lines import SourceFrame, SourceLookup


def dump_json(samples: Sequence[Sample], sources: SourceLookup | None = None) -> str:
    """Exactly one JSON object: {"vcpus": [...]}, frames leaf first."""
    return json.dumps({"vcpus": [_vcpu_json(s, sources) for s in samples]}, indent=2)


def _vcpu_json(sample: Sample, sources: SourceLookup | None) -> dict[str, object]:
    process = sample.process
    return {
        "vcpu": sample.vcpu,
        "mode": sample.mode.value,
        "pc": f"{sample.frames[0].address.address:#x}",
        "cr3": f"{sample.address_space:#x}",
        "process": None if process is None else {"pid": process.pid, "name": process.name},
        "frames": [_frame_json(f, sources) for f in sample.frames],
        "stop": sample.stop.value,
    }


def _frame_json(frame: Frame, sources: SourceLookup | None) -> dict[str, object]:
    entry: dict[str, object] = {
        "address": f"{frame.address.address:#x}",
        "function": frame.function,
        "offset": frame.offset,
        "module": frame.module,
    }
    if sources is not None:
        *inlined, own = _source_frames(frame, sources)
        entry["file"] = own.line.file if own.line else None
        entry["line"] = own.line.line if own.line else None
        entry["inlined"] = [
            {
                "function": s.function,
                "file": s.line.file if s.line else None,
                "line": s.line.line if s.line else None,
            }
            for s in inlined
        ]
    return entry


def dump_text(samples: Sequence[Sample], sources: SourceLookup | None = None) -> str:
    """Each vCPU's stack, leaf first: `#N 0xADDR function+0xoff (module) [file:line]`."""
    return "\n\n".join(_vcpu_text(s, sources) for s in samples) + "\n"


def _vcpu_text(sample: Sample, sources: SourceLookup | None) -> str:
    pc = sample.frames[0].address.address
    lines = [f"vCPU {sample.vcpu} [{sample.mode.value}] {sample.label()} pc={pc:#x}"]
    number = 0
    for frame in sample.frames:
        for text in _frame_lines(frame, sources):
            lines.append(f"  #{number:<2} {frame.address.address:#018x} {text}")
            number += 1
    stop = sample.stop.value
    if sample.fault_address is not None:
        stop += f" at {sample.fault_address:#x}"
    lines.append(f"  ({stop})")
    return "\n".join(lines)


def _frame_lines(frame: Frame, sources: SourceLookup | None) -> list[str]:
    if sources is None:
        return [describe_frame(frame)]
    texts = []
    for source in _source_frames(frame, sources):
        where = f" {source.line}" if source.line else ""
        if source.inlined:
            texts.append(f"{source.function} ({frame.module}){where} [inlined]")
        else:
            texts.append(f"{describe_frame(frame)}{where}")
    return texts


def _source_frames(frame: Frame, sources: SourceLookup) -> list[SourceFrame]:
    return sources.expand(frame.module, frame.function, frame.address.lookup_address)


def describe_frame(frame: Frame) -> str:
    """`function+0xoff (module)`, or the bare address when no symbol covers it."""
    if frame.function is None:
        return f"{frame.address.address:#x}"
    return f"{frame.function}+{frame.offset:#x} ({frame.module})"
