"""One-shot stack dumps: text for people, JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence

from qmpprof.model import Frame, Sample


def dump_json(samples: Sequence[Sample]) -> str:
    """Exactly one JSON object: {"vcpus": [...]}, frames leaf first."""
    return json.dumps({"vcpus": [_vcpu_json(s) for s in samples]}, indent=2)


def _vcpu_json(sample: Sample) -> dict[str, object]:
    process = sample.process
    return {
        "vcpu": sample.vcpu,
        "mode": sample.mode.value,
        "pc": f"{sample.frames[0].address.address:#x}",
        "cr3": f"{sample.address_space:#x}",
        "process": None if process is None else {"pid": process.pid, "name": process.name},
        "frames": [_frame_json(f) for f in sample.frames],
        "stop": sample.stop.value,
    }


def _frame_json(frame: Frame) -> dict[str, object]:
    return {
        "address": f"{frame.address.address:#x}",
        "function": frame.function,
        "offset": frame.offset,
        "module": frame.module,
    }


def dump_text(samples: Sequence[Sample], show_addresses: bool) -> str:
    """Each vCPU's stack, leaf first, as `#N function+0xoff (module)`."""
    blocks = [_vcpu_text(s, show_addresses) for s in samples]
    return "\n\n".join(blocks) + "\n"


def _vcpu_text(sample: Sample, show_addresses: bool) -> str:
    pc = sample.frames[0].address.address
    lines = [f"vCPU {sample.vcpu} [{sample.mode.value}] {sample.label()} pc={pc:#x}"]
    width = len(str(len(sample.frames) - 1))
    for index, frame in enumerate(sample.frames):
        address = f"{frame.address.address:#018x} " if show_addresses else ""
        lines.append(f"  #{index:<{width}} {address}{describe_frame(frame)}")
    stop = sample.stop.value
    if sample.fault_address is not None:
        stop += f" at {sample.fault_address:#x}"
    lines.append(f"  ({stop})")
    return "\n".join(lines)


def describe_frame(frame: Frame) -> str:
    """`function+0xoff (module)`, or the bare address when no symbol covers it."""
    if frame.function is None:
        return f"{frame.address.address:#x}"
    return f"{frame.function}+{frame.offset:#x} ({frame.module})"
