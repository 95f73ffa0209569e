"""Analysed samples of the example guest saved as JSON lines, and read back as Samples.

tests/unit/data/samples/record.py records them from a real QEMU; the outputs' unit
tests (summary, dump, top, top_stats) draw from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qmpprof.model import (
    Frame,
    FrameAddress,
    FrameKind,
    Mode,
    Process,
    Recovery,
    Sample,
    StopReason,
)

SAMPLES = Path(__file__).parent / "data" / "samples"


def sample_to_json(sample: Sample) -> dict[str, Any]:
    process = sample.process
    return {
        "time": sample.time,
        "vcpu": sample.vcpu,
        "mode": sample.mode.value,
        "frames": [_frame_to_json(frame) for frame in sample.frames],
        "stop": sample.stop.value,
        "address_space": sample.address_space,
        "process": None if process is None else {"pid": process.pid, "name": process.name},
        "fault_address": sample.fault_address,
        "unsymbolized": sample.unsymbolized,
        "torn": sample.torn,
    }


def _frame_to_json(frame: Frame) -> dict[str, Any]:
    return {
        "address": frame.address.address,
        "kind": frame.address.kind.value,
        "how": frame.address.how.value,
        "function": frame.function,
        "offset": frame.offset,
        "module": frame.module,
    }


def sample_from_json(entry: dict[str, Any]) -> Sample:
    process = entry["process"]
    return Sample(
        time=entry["time"],
        vcpu=entry["vcpu"],
        mode=Mode(entry["mode"]),
        frames=tuple(_frame_from_json(frame) for frame in entry["frames"]),
        stop=StopReason(entry["stop"]),
        address_space=entry["address_space"],
        process=None if process is None else Process(process["pid"], process["name"]),
        fault_address=entry["fault_address"],
        unsymbolized=entry["unsymbolized"],
        torn=entry["torn"],
    )


def _frame_from_json(entry: dict[str, Any]) -> Frame:
    address = FrameAddress(entry["address"], FrameKind(entry["kind"]), Recovery(entry["how"]))
    return Frame(address, entry["function"], entry["offset"], entry["module"])


def load_samples(name: str) -> list[Sample]:
    """The samples saved as data/samples/NAME.jsonl, in their order."""
    lines = (SAMPLES / f"{name}.jsonl").read_text().splitlines()
    return [sample_from_json(json.loads(line)) for line in lines]


def save_samples(name: str, samples: list[Sample]) -> None:
    lines = [json.dumps(sample_to_json(sample), sort_keys=True) for sample in samples]
    (SAMPLES / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
