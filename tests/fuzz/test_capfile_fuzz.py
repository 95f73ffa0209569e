"""Hostile capture files: a real capture cut, bit-flipped, and its decoded records and
header changed field by field. The reader raises nothing but BadCapture, and what it
gives out is what was written, up to the damage: never a sample of a member whose
CRC-32 failed or is missing (cut short), never a wrong one.

The capture is written by CaptureWriter from real pieces (tests/unit/test_capfile.py:
saved QEMU register dumps, a gcc-built ELF's symbols and bytes); the expected samples
are the ones written, never ones the reader produced.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadCapture
from qmpprof.model import Recording
from qmpprof.record.qmpcap import CapturedSample
from tests.fuzz.budget import cases, counted
from tests.unit.conftest import build_elf
from tests.unit.test_capfile import read_all, real_samples, write_capture

SAMPLES = 12
PER_MEMBER = 3


class Target:
    """The pristine capture, its samples, where its members end, and its decoded lines."""

    def __init__(self, elf: Path, directory: Path) -> None:
        self.samples = real_samples(elf, SAMPLES)
        pristine = directory / "pristine.qmpcap"
        self.member_ends = write_capture(pristine, self.samples, PER_MEMBER)
        self.data = pristine.read_bytes()
        self.lines = [json.loads(line) for line in gzip.decompress(self.data).splitlines()]
        self.scratch = directory / "mutated.qmpcap"

    def read(self, data: bytes) -> tuple[Recording, list[CapturedSample], str | None]:
        self.scratch.write_bytes(data)
        return read_all(self.scratch)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Target:
    directory = tmp_path_factory.mktemp("capfile-fuzz")
    return Target(build_elf("symbols.c", directory, "-O1", "-g"), directory)


@given(data=st.data())
@settings(max_examples=cases(150))
@counted
def test_cut_and_flipped_bytes_give_a_prefix_of_the_samples(
    target: Target, data: st.DataObject
) -> None:
    length = data.draw(st.integers(0, len(target.data)), label="length")
    mutated = bytearray(target.data[:length])
    flips = data.draw(st.lists(st.tuples(st.integers(0), st.integers(1, 255)), max_size=3))
    flips = [(position % length, bits) for position, bits in flips] if length else []
    positions = [position for position, _ in flips]
    for position, bits in flips:
        mutated[position] ^= bits
    try:
        _, read, damage = target.read(bytes(mutated))
    except BadCapture as error:
        assert "\n" not in str(error)
        return
    # A CRC-32 per member lets no flip through, and a member cut short (no CRC-32
    # left) is not used: never a wrong sample, and every whole member before the
    # first damage is read.
    assert read == target.samples[: len(read)]
    whole = [end for end in target.member_ends[1:] if end <= length]
    undamaged = [end for end in whole if all(p >= end for p in positions)]
    assert len(read) >= len(undamaged) * PER_MEMBER
    if damage is not None:
        assert "\n" not in damage


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["instruction", "return", "cfi", "fault", "rip"])
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


def mutate(record: Any, data: st.DataObject) -> None:
    """Change one field somewhere inside `record`: replace it, delete it, or add one."""
    while True:
        keys: list[Any] = list(record) if isinstance(record, dict) else list(range(len(record)))
        if not keys:
            return
        key = data.draw(st.sampled_from(keys))
        child = record[key]
        if isinstance(child, dict | list) and child and data.draw(st.booleans()):
            record = child
            continue
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete":
            del record[key]
        elif action == "add" and isinstance(record, dict):
            record[data.draw(st.text(max_size=6))] = data.draw(JSON_VALUES)
        else:
            record[key] = data.draw(JSON_VALUES)
        return


def gzipped(lines: list[Any]) -> bytes:
    return gzip.compress(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


@given(data=st.data())
@settings(max_examples=cases(200))
@counted
def test_a_changed_record_costs_at_most_itself_and_what_follows(
    target: Target, data: st.DataObject
) -> None:
    lines = copy.deepcopy(target.lines)
    index = data.draw(st.integers(1, SAMPLES), label="record")
    mutate(lines[index], data)
    _, read, damage = target.read(gzipped(lines))
    before = index - 1
    assert read[:before] == target.samples[:before]
    if len(read) == before:
        assert damage is not None and f"bad record {index + 1}" in damage
    else:  # the change left a valid sample: every other one is read as written
        assert len(read) == SAMPLES and damage is None
        assert read[index:] == target.samples[index:]


@given(data=st.data())
@settings(max_examples=cases(150))
@counted
def test_a_changed_header_is_refused_or_read_with_every_sample(
    target: Target, data: st.DataObject
) -> None:
    lines = copy.deepcopy(target.lines)
    mutate(lines[0], data)
    try:
        recording, read, damage = target.read(gzipped(lines))
    except BadCapture as error:
        assert "not a readable qmpcap file" in str(error) and "\n" not in str(error)
        return
    assert isinstance(recording.period_s, float) and recording.period_s > 0
    assert recording.kernel is None or isinstance(recording.kernel, str)
    if lines[0].get("version") == 2:
        assert read == target.samples and damage is None
