"""speedscope's own file format (`.speedscope.json`): one sampled profile per process and
thread (or per vCPU and process, `--group-by vcpu`).

The format is published as https://www.speedscope.app/file-format-schema.json; speedscope
shows each profile in time order ("Time Order"), merged ("Left Heavy") and by function
("Sandwich"), and lets the viewer switch between the profiles.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qmpprof.model import Frame, Recording, Sample
from qmpprof.profile import Grouping, Scope, counted

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
EXPORTER = "qmpprof"


def write_speedscope(
    samples: Sequence[Sample],
    recording: Recording,
    path: Path,
    scope: Scope = Scope.ALL,
    include_idle: bool = False,
    grouping: Grouping = Grouping.THREAD,
) -> None:
    """Write the counted samples to `path` as a speedscope file (replacing it)."""
    document = speedscope_document(samples, recording, scope, include_idle, grouping)
    path.write_text(json.dumps(document), encoding="utf-8")  # ASCII: guest strings may not be text


def speedscope_document(
    samples: Sequence[Sample],
    recording: Recording,
    scope: Scope,
    include_idle: bool,
    grouping: Grouping = Grouping.THREAD,
) -> dict[str, Any]:
    """The speedscope file as a JSON-ready dict, profiles ordered by process and thread
    (by vCPU then process, `Grouping.VCPU`)."""
    frames = _FrameTable()
    profiles: dict[tuple[int, str, int, str], _Profile] = {}
    for sample in sorted(samples, key=lambda s: s.time):
        counted_frames = counted(sample, scope, include_idle)
        if counted_frames:
            key = _profile_key(sample, grouping)
            profile = profiles.setdefault(key, _Profile(_profile_name(*key)))
            profile.stacks.append([frames.index(f) for f in reversed(counted_frames)])
    return {
        "$schema": SCHEMA,
        "name": recording_title(recording),
        "exporter": EXPORTER,
        "activeProfileIndex": 0,
        "shared": {"frames": frames.entries},
        "profiles": [profiles[key].as_json(recording.period_s) for key in sorted(profiles)],
    }


def _profile_key(sample: Sample, grouping: Grouping) -> tuple[int, str, int, str]:
    """Which profile `sample` goes to: (vCPU or -1, process, thread or -1, the thread's
    own name or ""); by program, the program alone."""
    if grouping is Grouping.COMM:
        return -1, sample.program(), -1, ""
    vcpu = sample.vcpu if grouping is Grouping.VCPU else -1
    thread = -1 if grouping is Grouping.PROCESS else _thread(sample)
    named = sample.process.thread_name if sample.process is not None and thread >= 0 else None
    return vcpu, sample.label(), thread, named or ""


def _thread(sample: Sample) -> int:
    """The sample's thread id when it is not its process's main thread, else -1."""
    process = sample.process
    if process is None or process.tid is None or process.tid == process.pid:
        return -1
    return process.tid


def _profile_name(vcpu: int, label: str, thread: int, thread_name: str) -> str:
    name = f"vCPU {vcpu} — {label}" if vcpu >= 0 else label
    if thread < 0:
        return name
    return f"{name}, {thread_name} ({thread})" if thread_name else f"{name}, thread {thread}"


def recording_title(recording: Recording) -> str:
    """A one-line name for the recording: kernel, duration and rate."""
    kernel = recording.kernel_title()
    rate = 1 / recording.period_s if recording.period_s else 0.0
    return f"qmpprof: {kernel}, {recording.duration_s:.1f} s at {rate:.0f} Hz"


class _FrameTable:
    """speedscope's shared frame list: one entry per distinct (name, module)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, str]] = []
        self._ids: dict[tuple[str, str | None], int] = {}

    def index(self, frame: Frame) -> int:
        """The index of `frame`'s entry, adding it if new."""
        key = (frame.label(), frame.module)
        if key not in self._ids:
            self._ids[key] = len(self.entries)
            entry = {"name": key[0]} if key[1] is None else {"name": key[0], "file": key[1]}
            self.entries.append(entry)
        return self._ids[key]


@dataclass
class _Profile:
    """One thread's (or one vCPU's) samples, in time order, as frame indexes root first."""

    name: str
    stacks: list[list[int]] = field(default_factory=list)

    def as_json(self, period_s: float) -> dict[str, Any]:
        """The sampled profile: every sample weighs one sampling period, in seconds."""
        return {
            "type": "sampled",
            "name": self.name,
            "unit": "seconds",
            "startValue": 0,
            "endValue": period_s * len(self.stacks),
            "samples": self.stacks,
            "weights": [period_s] * len(self.stacks),
        }
