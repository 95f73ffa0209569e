"""A recording's samples read back from its speedscope file, each as its frames (name
and module), by the task label qmpprof gave it."""

from __future__ import annotations

from dataclasses import dataclass


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
