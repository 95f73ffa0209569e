"""The capture file: written as whole gzip members that gzip itself reads, read back up to
the last intact record when it was cut short, damaged or crafted, never with a traceback.

The samples are built from real pieces: register dumps saved from QEMU, the symbols and
bytes of an ELF built by gcc. Expected values come from what was written (and from
`gzip -dc`), never from the reader.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions
from qmpprof.commands.report import ReportOptions, named_as_recorded, run_report
from qmpprof.console import Console
from qmpprof.errors import BadCapture, OutputError
from qmpprof.model import (
    CapturedSample,
    FileMapping,
    Frame,
    FrameAddress,
    FrameKind,
    FrameName,
    MemoryWindow,
    Process,
    RawSample,
    Recording,
    Recovery,
    RegisterSet,
    StopReason,
    UnwoundStack,
)
from qmpprof.output.writers import Format
from qmpprof.record.qmpcap import CaptureWriter, read_capture
from qmpprof.record.qmpcap_schema import MAX_RECORD_BYTES, encode_header, encode_sample
from qmpprof.symbols.elf import load_symbols
from qmpprof.symbols.elf_file import open_elf, read_build_id
from qmpprof.target.registers import parse_all

DATA = Path(__file__).parent / "data"
REGISTER_DUMPS = (
    "regs_guest_longmode.txt",
    "regs_guest_longmode_smp2_qmp.txt",
    "regs_seabios_32bit_smp2.txt",
)
RECORDING = Recording(
    started=1_700_000_000.5, duration_s=2.0, period_s=1 / 99, qmp_socket="q", kernel="k"
)


def real_samples(elf: Path, count: int) -> list[CapturedSample]:
    """`count` samples from saved register dumps, the ELF's functions and its bytes."""
    registers = [regs for name in REGISTER_DUMPS for regs in parse_all((DATA / name).read_text())]
    table = load_symbols(elf)
    symbols = [table.find(name) for name in ("leaf", "middle", "helper", "main")]
    image = elf.read_bytes()
    samples = []
    for index in range(count):
        regs = registers[index % len(registers)]
        callers = symbols[index % len(symbols) :][:3]
        frames = (
            FrameAddress(regs.rip, FrameKind.INSTRUCTION),
            *(FrameAddress(s.address + 4, FrameKind.RETURN, Recovery.CFI) for s in callers if s),
        )
        window = MemoryWindow(regs.rsp, image[index * 16 : index * 16 + 64 + index % 97])
        raw = RawSample(
            1_700_000_000.0 + index / 99,
            regs,
            (window,) if index % 3 else (),
            file_maps=file_maps(index, elf),
        )
        stop = list(StopReason)[index % len(StopReason)]
        fault = regs.rsp if stop is StopReason.FAULT else None
        process = None if index % 5 == 0 else Process(index % 7 or None, f"proc\x1b[{index}")
        names: tuple[FrameName | None, ...] = ()
        if index % 3 != 1:  # named as symbolized when recorded: the callers, by the ELF
            names = (None, *(FrameName(s.name, 4, f"{elf.name}\x1b[m") for s in callers if s))
        samples.append(CapturedSample(raw, UnwoundStack(frames, stop, fault), process, names))
    return samples


def named_frames(sample: CapturedSample) -> list[Frame]:
    """The frames as symbolizing named them when `sample` was recorded (its `names`)."""
    names = sample.names or (None,) * len(sample.stack.frames)
    return [
        Frame(address, None, 0, None)
        if name is None
        else Frame(address, name.function, name.offset, name.module)
        for address, name in zip(sample.stack.frames, names, strict=True)
    ]


def file_maps(index: int, elf: Path) -> tuple[FileMapping, ...] | None:
    """A process map for most samples: none read, an empty one, or the ELF at a random-
    looking base (with its real build-id, or none) beside a guest path of hostile text."""
    if index % 4 == 0:
        return None
    base = 0x5555_5555_0000 + index * 0x1000
    build_id = read_build_id_of(elf) if index % 2 else None
    program = FileMapping(base, base + 0x3000, 0x1000, str(elf), build_id)
    odd = FileMapping(base + 0x10000, base + 0x11000, 0, f"/lib/\x1b[31m{index}\n.so", None)
    return () if index % 4 == 2 else (program, odd)


def read_build_id_of(elf: Path) -> bytes | None:
    with open_elf(elf) as opened:
        return read_build_id(opened)


def write_capture(path: Path, samples: list[CapturedSample], per_member: int) -> list[int]:
    """Write `samples`, `per_member` to a gzip member; the file's size after each flush."""
    sizes = []
    with CaptureWriter(path, RECORDING, keep_memory=True, flush_interval_s=1e9) as writer:
        sizes.append(path.stat().st_size)
        for index, sample in enumerate(samples, start=1):
            writer.add(sample, named_frames(sample))
            if index % per_member == 0:
                writer.flush()
                sizes.append(path.stat().st_size)
    return sizes


def read_all(path: Path) -> tuple[Recording, list[CapturedSample], str | None]:
    with read_capture(path) as capture:
        samples = list(capture.samples())
    return capture.recording, samples, capture.damage


@pytest.fixture(scope="module")
def samples(symbols_elf: Path) -> list[CapturedSample]:
    return real_samples(symbols_elf, 40)


def test_gzip_reads_the_header_every_sample_and_the_closing_record(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    path = tmp_path / "c.qmpcap"
    write_capture(path, samples, per_member=7)
    decoded = subprocess.run(["gzip", "-dc", str(path)], capture_output=True, check=True).stdout
    lines = [json.loads(line) for line in decoded.splitlines()]
    assert lines[0]["recording"]["kernel"] == "k" and lines[0]["version"] == 2
    assert [line["t"] for line in lines[1:-1]] == [s.raw.time for s in samples]
    assert lines[-1] == {"end": {"samples": len(samples)}}
    assert read_all(path) == (RECORDING, samples, None)


def test_a_kernel_read_from_memory_keeps_its_release_for_the_report_s_titles(
    tmp_path: Path,
) -> None:
    recording = replace(RECORDING, kernel=None, kernel_release="6.1.0-50-amd64")
    path = tmp_path / "c.qmpcap"
    with CaptureWriter(path, recording, keep_memory=False):
        pass
    assert read_all(path)[0] == recording
    assert recording.kernel_title() == "6.1.0-50-amd64 (from guest memory)"
    assert RECORDING.kernel_title() == "k"
    assert replace(recording, kernel_release=None).kernel_title() == "no kernel symbols"


def test_a_file_copied_mid_recording_holds_every_flushed_sample(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    """What SIGKILL leaves: the members written so far, and no closing record."""
    path, copy = tmp_path / "c.qmpcap", tmp_path / "copy.qmpcap"
    with CaptureWriter(path, RECORDING, keep_memory=False, flush_interval_s=1e9) as writer:
        for sample in samples[:10]:
            writer.add(sample)
        writer.flush()
        for sample in samples[10:15]:
            writer.add(sample)  # still in memory
        copy.write_bytes(path.read_bytes())
    _, read, damage = read_all(copy)
    assert [s.raw.time for s in read] == [s.raw.time for s in samples[:10]]
    assert damage is not None and "no closing record" in damage and "read 10 samples" in damage


def test_a_cut_anywhere_keeps_every_sample_of_the_whole_members_before_it(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    path, cut = tmp_path / "c.qmpcap", tmp_path / "cut.qmpcap"
    sizes = write_capture(path, samples[:12], per_member=4)
    data = path.read_bytes()
    for length in range(0, len(data), 11):
        cut.write_bytes(data[:length])
        try:
            _, read, damage = read_all(cut)
        except BadCapture as error:  # the header's own line was cut
            assert length < sizes[0] and "not a readable qmpcap file" in str(error)
            continue
        whole_members = sum(size <= length for size in sizes[1:])
        assert len(read) >= 4 * whole_members
        assert read == samples[: len(read)]
        assert damage is not None


def test_a_damaged_member_costs_its_samples_and_those_after_it(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    path = tmp_path / "c.qmpcap"
    sizes = write_capture(path, samples[:12], per_member=4)
    data = bytearray(path.read_bytes())
    data[(sizes[1] + sizes[2]) // 2] ^= 0x01  # inside the second member of samples
    path.write_bytes(data)
    _, read, damage = read_all(path)
    assert read == samples[:4]
    assert damage is not None and f"block at byte {sizes[1]} of {len(data)}" in damage
    assert damage.count("\n") == 0


def test_bytes_after_the_last_member_are_dropped_with_a_warning(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    path = tmp_path / "c.qmpcap"
    write_capture(path, samples[:5], per_member=2)
    size = path.stat().st_size
    with path.open("ab") as stream:
        stream.write(bytes(4096))  # a block a power loss left unwritten
    _, read, damage = read_all(path)
    assert read == samples[:5]
    assert damage is not None and "dropped the last 4096 bytes" in damage and str(size) in damage


def gzipped(*lines: object) -> bytes:
    return gzip.compress(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


GOOD_HEADER = json.loads(encode_header(RECORDING))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "it is empty"),
        (b"\x7fELF\x02\x01\x01", "bad compressed data"),
        (gzip.compress(b"not json\n"), "not JSON"),
        (gzip.compress(b'{"format": "qmpcap"'), "ends inside its last record"),
        (gzipped([1, 2]), "not a qmpcap header"),
        (gzipped({**GOOD_HEADER, "version": 3}), "version"),
        (gzipped({**GOOD_HEADER, "version": "2"}), "version"),
        (gzipped({"format": "qmpcap", "version": 2}), "field 'recording' is missing"),
        (gzipped({**GOOD_HEADER, "recording": []}), "field 'recording' is not an object"),
        (
            gzipped({**GOOD_HEADER, "recording": {"started": 1.0, "duration_s": 1.0}}),
            "field 'recording.period_s' is missing",
        ),
        (
            gzipped({**GOOD_HEADER, "recording": {**GOOD_HEADER["recording"], "period_s": 0}}),
            "field 'recording.period_s' is outside",
        ),
        (
            gzipped({**GOOD_HEADER, "recording": {**GOOD_HEADER["recording"], "kernel": 7}}),
            "field 'recording.kernel' is not a string",
        ),
        (gzip.compress(b"[" * 100_000), "ends inside its last record"),
        (gzip.compress(b"[" * 100_000 + b"\n"), "too many nested values"),
    ],
)
def test_a_file_without_a_readable_header_is_one_error_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.qmpcap"
    path.write_bytes(content)
    with pytest.raises(BadCapture, match="not a readable qmpcap file") as raised:
        read_all(path)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_or_unreadable_file_is_one_error_line(tmp_path: Path) -> None:
    for path in (tmp_path / "missing.qmpcap", tmp_path):
        with pytest.raises(BadCapture, match="cannot open"):
            read_all(path)


def good_record(sample: CapturedSample) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(
        encode_sample(sample, keep_memory=True, named=named_frames(sample))
    )
    return record


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("regs"), "field 'regs' is missing"),
        (lambda r: r["regs"].update(cs="8"), "field 'regs.cs' is not an integer"),
        (lambda r: r["regs"].update(halted=1), "field 'regs.halted' is not true or false"),
        (lambda r: r["regs"].update(bits=48), "field 'regs.bits' is not one of 16, 32, 64"),
        (lambda r: r["regs"]["general"].pop("rip"), "field 'regs.general' lacks rip"),
        (lambda r: r["regs"]["general"].update(rax=1 << 64), "'regs.general' is outside"),
        (lambda r: r.update(t=float("nan")), "field 't' is outside"),
        (lambda r: r.update(t=True), "field 't' is not a number"),
        (lambda r: r.update(frames=[]), "field 'frames' is empty"),
        (lambda r: r.update(frames=[[1, "instruction"]]), "not a list of 3"),
        (lambda r: r.update(frames=[[1, "call", "cfi"]]), "not a known FrameKind"),
        (lambda r: r.update(stop=None), "field 'stop' is not a string"),
        (lambda r: r.update(process={"pid": 1}), "field 'process.name' is missing"),
        (lambda r: r.update(windows=[[0, "zz"]]), "field 'windows'"),
        (lambda r: r.update(windows=[[(1 << 64) - 1, "0000"]]), "past the end"),
        (lambda r: r.update(windows={}), "field 'windows' is not a list"),
        (lambda r: r.clear(), "field 't' is missing"),
        (lambda r: r.update(names=[None]), "field 'names' does not name each frame"),
        (lambda r: r.update(names={}), "field 'names' is not a list"),
        (lambda r: r["names"].__setitem__(1, ["f", -1, None]), "field 'names' is outside"),
        (lambda r: r["names"].__setitem__(1, ["f" * 5000, 0, None]), "'names' has a name too"),
        (lambda r: r["names"].__setitem__(1, [7, 0, None]), "field 'names' is not a string"),
    ],
)
def test_a_bad_record_ends_the_samples_with_a_warning_naming_its_field(
    tmp_path: Path, samples: list[CapturedSample], change: object, message: str
) -> None:
    records = [good_record(sample) for sample in samples[:4]]
    assert callable(change)
    change(records[2])
    path = tmp_path / "crafted.qmpcap"
    path.write_bytes(gzipped(GOOD_HEADER, *records))
    _, read, damage = read_all(path)
    assert read == samples[:2]
    assert damage is not None and "has a bad record 4" in damage and message in damage


def test_records_after_the_closing_record_are_refused(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    records = [good_record(sample) for sample in samples[:2]]
    path = tmp_path / "crafted.qmpcap"
    path.write_bytes(gzipped(GOOD_HEADER, records[0], {"end": {"samples": 1}}, records[1]))
    _, read, damage = read_all(path)
    assert read == samples[:1]
    assert damage is not None and "follows the closing record" in damage


def test_a_version_1_capture_reads_without_a_closing_record(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    """What qmpprof wrote before: one gzip stream, no closing record."""
    path = tmp_path / "v1.qmpcap"
    path.write_bytes(gzipped({**GOOD_HEADER, "version": 1}, *map(good_record, samples)))
    assert read_all(path) == (RECORDING, samples, None)


def test_a_record_longer_than_the_limit_is_refused_within_the_limit(tmp_path: Path) -> None:
    """A line of 64 MiB compresses to 64 KiB: read a step at a time, dropped at the limit."""
    path = tmp_path / "long.qmpcap"
    path.write_bytes(gzip.compress(encode_header(RECORDING) + b" " * (64 << 20)))
    _, read, damage = read_all(path)
    assert read == [] and damage is not None and f"longer than {MAX_RECORD_BYTES}" in damage


def test_windows_that_would_not_fit_a_record_are_left_out(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    big = MemoryWindow(0x1000, bytes(MAX_RECORD_BYTES // 2))
    sample = samples[1]
    huge = CapturedSample(RawSample(sample.raw.time, sample.raw.registers, (big,)), *_rest(sample))
    path = tmp_path / "c.qmpcap"
    write_capture(path, [huge, samples[2]], per_member=1)
    _, read, damage = read_all(path)
    assert damage is None and read[1] == samples[2]
    assert read[0].raw.windows == () and read[0].stack == sample.stack


def _rest(sample: CapturedSample) -> tuple[UnwoundStack, Process | None]:
    return sample.stack, sample.process


def test_the_record_spells_out_every_field_of_the_model(samples: list[CapturedSample]) -> None:
    """The encoder lists fields by hand (for speed): a field added to the model must be
    added there too."""
    record = good_record(samples[1])
    assert set(record["regs"]) == {f.name for f in fields(RegisterSet)}
    assert set(record["process"]) == {f.name for f in fields(Process)}


def test_a_file_that_cannot_be_created_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="cannot write"):
        CaptureWriter(tmp_path / "no" / "dir.qmpcap", RECORDING, keep_memory=False)
    with pytest.raises(OutputError, match="No space left on device"):
        CaptureWriter(Path("/dev/full"), RECORDING, keep_memory=False)


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from tests.unit.test_capfile import RECORDING, named_frames, real_samples
from qmpprof.record.qmpcap import CaptureWriter

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))
samples = real_samples(Path(sys.argv[2]), 60)
with CaptureWriter(Path(sys.argv[1]), RECORDING, True, flush_interval_s=1e9) as writer:
    for index, sample in enumerate(samples, start=1):
        writer.add(sample, named_frames(sample))
        if index % 5 == 0:
            writer.flush()
print(writer.failed, writer.samples_kept, writer.samples_lost)
"""


def test_a_write_that_fails_ends_the_file_at_its_last_whole_member(
    tmp_path: Path, symbols_elf: Path, samples: list[CapturedSample]
) -> None:
    """A real failing write (a file size limit: EFBIG, as a full disk gives ENOSPC) is
    reported by `failed`, never raised; the file keeps whole members only."""
    path = tmp_path / "c.qmpcap"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FULL_DISK), str(path), str(symbols_elf)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    failed, kept, lost = done.stdout.rsplit(" ", 2)
    assert failed == "File too large" and int(kept) + int(lost) == 60 and int(kept) > 0
    assert int(kept) % 5 == 0 and path.stat().st_size <= 6000
    decoded = subprocess.run(["gzip", "-dc", str(path)], capture_output=True, check=True).stdout
    assert decoded.count(b"\n") == 1 + int(kept)
    _, read, damage = read_all(path)
    assert read == real_samples(symbols_elf, 60)[: int(kept)]
    assert damage is not None and "no closing record" in damage


def test_report_names_what_its_binaries_leave_unnamed_as_recorded(
    tmp_path: Path, samples: list[CapturedSample]
) -> None:
    """A capture recorded with symbols report does not have (the guest's memory) keeps
    the names recording gave: report with no binaries writes them; a frame its own
    binaries name keeps their name."""
    path, folded = tmp_path / "c.qmpcap", tmp_path / "out.folded"
    write_capture(path, samples, per_member=7)
    target = TargetOptions("", None)
    run_report(
        ReportOptions(path, target, ((folded, Format.FOLDED),), include_idle=True), Console()
    )
    recorded = {n.function for s in samples for n in s.names if n is not None}
    stacks = folded.read_text()
    assert recorded and all(name in stacks for name in recorded)
    sample = samples[0]
    binaries = Analyzer(None).symbolize(sample)  # this sample's frames named by none
    first = replace(binaries.frames[1], function="from_a_binary", offset=2, module="m")
    named = replace(binaries, frames=(binaries.frames[0], first, *binaries.frames[2:]))
    result = named_as_recorded(named, sample)
    assert result.frames[1].function == "from_a_binary"
    assert [f.function for f in result.frames[2:]] == [n.function for n in sample.names[2:] if n]
