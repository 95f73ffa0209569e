"""The raw capture file (`.qmpcap`): every sample as recorded, to analyse again later.

gzip-compressed JSON lines: a header `{"format": "qmpcap", "version": 1, "recording":
{...}}`, then one line per vCPU sample with its time, registers, address space,
identified user binary, process, unwound addresses and stop reason, and (with
--capture-memory) the memory windows read for it. `qmpprof report` re-symbolizes the
addresses with the binaries it is given, or, with the windows, unwinds again.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from qmpprof.errors import QmpprofError
from qmpprof.model import (
    FrameAddress,
    FrameKind,
    MemoryWindow,
    Process,
    RawSample,
    Recording,
    Recovery,
    RegisterSet,
    StopReason,
    UnwoundStack,
)

FORMAT = "qmpcap"
VERSION = 1


class BadCapture(QmpprofError):
    """A capture file that is missing, not a qmpcap, or damaged."""


@dataclass(frozen=True)
class CapturedSample:
    """One vCPU sample as a capture file keeps it."""

    raw: RawSample
    stack: UnwoundStack
    process: Process | None


class CaptureWriter:
    """Writes a capture file sample by sample; use as a context manager."""

    def __init__(self, path: Path, recording: Recording, keep_memory: bool) -> None:
        # Held open across the recording, closed by close()/__exit__.
        self._stream: IO[str] = gzip.open(path, "wt", encoding="utf-8")  # noqa: SIM115
        self._keep_memory = keep_memory
        header = {"format": FORMAT, "version": VERSION, "recording": asdict(recording)}
        self._write(header)

    def add(self, sample: CapturedSample) -> None:
        self._write(_encode(sample, self._keep_memory))

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, record: dict[str, Any]) -> None:
        self._stream.write(json.dumps(record, separators=(",", ":")) + "\n")


def read_capture(path: Path) -> tuple[Recording, Iterator[CapturedSample]]:
    """The recording and the samples of a capture file. Raises BadCapture."""
    try:
        # Closed by the sample iterator once it is consumed.
        stream = gzip.open(path, "rt", encoding="utf-8")  # noqa: SIM115
        header = json.loads(stream.readline())
    except (OSError, EOFError, ValueError) as err:
        raise BadCapture(f"{path}: not a readable qmpcap file ({err})") from err
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BadCapture(f"{path}: not a qmpcap file")
    if header.get("version") != VERSION:
        raise BadCapture(f"{path}: qmpcap version {header.get('version')} is not supported")
    return Recording(**header["recording"]), _samples(path, stream)


def _samples(path: Path, stream: IO[str]) -> Iterator[CapturedSample]:
    with stream:
        for number, line in enumerate(stream, start=2):
            try:
                yield _decode(json.loads(line))
            except (ValueError, KeyError, TypeError) as err:
                raise BadCapture(f"{path}: line {number} is damaged ({err})") from err


def _encode(sample: CapturedSample, keep_memory: bool) -> dict[str, Any]:
    raw, regs = sample.raw, sample.raw.registers
    record: dict[str, Any] = {
        "t": raw.time,
        "regs": {**asdict(regs), "general": dict(regs.general)},
        "user_module": raw.user_module,
        "error": raw.error,
        "frames": [[f.address, f.kind.value, f.how.value] for f in sample.stack.frames],
        "stop": sample.stack.stop.value,
        "fault": sample.stack.fault_address,
        "process": None if sample.process is None else asdict(sample.process),
    }
    if keep_memory:
        record["windows"] = [[w.base, w.data.hex()] for w in raw.windows]
    return record


def _decode(record: dict[str, Any]) -> CapturedSample:
    windows = tuple(
        MemoryWindow(base, bytes.fromhex(data)) for base, data in record.get("windows", [])
    )
    raw = RawSample(
        record["t"], RegisterSet(**record["regs"]), windows, record["user_module"], record["error"]
    )
    frames = tuple(
        FrameAddress(address, FrameKind(kind), Recovery(how))
        for address, kind, how in record["frames"]
    )
    stack = UnwoundStack(frames, StopReason(record["stop"]), record["fault"])
    process = Process(**record["process"]) if record["process"] is not None else None
    return CapturedSample(raw, stack, process)
