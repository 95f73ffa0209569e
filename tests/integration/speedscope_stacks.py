"""A recording's samples read back from its speedscope file, each as its frames (name
and module), by the task label qmpprof gave it; `recorded_stacks` records and reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.integration.conftest import run_cached


@dataclass(frozen=True)
class Frame:
    name: str
    file: str | None


Stack = tuple[Frame, ...]  # root first


def stacks_by_label(document: dict[str, object]) -> dict[str, list[Stack]]:
    """speedscope's profiles ("LABEL[, thread T]", or "vCPU N — LABEL…" grouped by vCPU)
    merged by LABEL."""
    shared = document["shared"]
    assert isinstance(shared, dict)
    frames = [Frame(entry["name"], entry.get("file")) for entry in shared["frames"]]
    stacks: dict[str, list[Stack]] = {}
    profiles = document["profiles"]
    assert isinstance(profiles, list)
    for profile in profiles:
        label = profile["name"].split(" — ", 1)[-1].split(", thread ", 1)[0]
        samples = [tuple(frames[i] for i in sample) for sample in profile["samples"]]
        stacks.setdefault(label, []).extend(samples)
    return stacks


def recorded_stacks(directory: Path, *args: str) -> tuple[dict[str, list[Stack]], str]:
    """`qmpprof ARGS -o DIRECTORY/out.speedscope.json` run (with the session's derived
    cache), which must succeed: its stacks by label, and what it printed on stderr."""
    output = directory / "out.speedscope.json"
    done = run_cached(*args, "-o", str(output))
    assert done.returncode == 0, done.stderr
    return stacks_by_label(json.loads(output.read_text())), done.stderr
