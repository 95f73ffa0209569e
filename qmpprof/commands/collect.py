"""Turning samples into outputs, shared by `record` (live) and `report` (replayed).

Each output stands alone: one that cannot be written (a full disk, a vanished directory)
costs neither the others nor the summary. Failures are collected, printed after the
outputs that were written, and raised last as one OutputError.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qmpprof.analysis import Analyzer
from qmpprof.console import Console
from qmpprof.errors import OutputError
from qmpprof.model import CapturedSample, Frame, Recording, Sample
from qmpprof.output.writers import Format, temporary_beside, write_profile
from qmpprof.profile import Profile
from qmpprof.record.qmpcap import CaptureWriter
from qmpprof.symbols.coverage import KernelCoverage

if TYPE_CHECKING:
    from qmpprof.record.process_maps import MapsStats


def check_writable(paths: Sequence[Path]) -> None:
    """Fail before recording, not after, when an output file cannot be created: a missing
    or unwritable directory, a path that is a directory, the same file named twice.

    The directory is tried for real (a temporary file created and removed): permissions,
    read-only mounts and full inode tables all answer the same way."""
    seen: set[str] = set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise OutputError(f"cannot write {path}: named twice as an output")
        seen.add(real)
        _check_one(path, Path(real))


def _check_one(path: Path, real: Path) -> None:
    if real.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory")
    if not real.parent.is_dir():
        raise OutputError(f"cannot write {path}: no directory {path.parent}")
    if real.exists() and not real.is_file():  # a FIFO or a device: written in place
        if not os.access(real, os.W_OK):
            raise OutputError(f"cannot write {path}: permission denied")
        return
    try:
        temporary_beside(real).unlink()
    except OSError as err:
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from err


@dataclass(frozen=True)
class Written:
    """What became of one output: what it holds, or why it could not be written."""

    path: Path
    fmt: Format
    what: str = ""
    error: str | None = None

    def line(self) -> str:
        if self.error is not None:
            return f"not written: {self.path} ({self.fmt.value}): {self.error}"
        return f"wrote {self.what} to {self.path} ({self.fmt.value})"


class CaptureOutput:
    """A capture file written sample by sample while recording. A write that fails (a
    full disk) ends this file, keeping what it holds, and nothing else."""

    def __init__(self, path: Path, writer: CaptureWriter) -> None:
        self.path = path
        self._writer = writer
        self.count = 0
        self.error: str | None = None

    @classmethod
    def open(cls, path: Path, recording: Recording, keep_memory: bool) -> CaptureOutput:
        """Raises OutputError when the file cannot be created."""
        try:
            return cls(path, CaptureWriter(path, recording, keep_memory))
        except OSError as err:
            raise OutputError(f"cannot write {path}: {err.strerror or err}") from err

    def add(self, sample: CapturedSample, named: Sequence[Frame] = ()) -> None:
        if self.error is not None:
            return
        try:
            self._writer.add(sample, named)
        except OSError as err:
            self._fail(err)
            return
        self._note_writer_failure()
        self.count += self.error is None

    def close(self) -> None:
        """Never raises: a failure to flush is this output's error."""
        try:
            self._writer.close()
        except OSError as err:
            self._fail(err)
        self._note_writer_failure()

    def result(self) -> Written:
        """After close(): the samples the file holds (whole, on disk) and any failure."""
        kept = getattr(self._writer, "samples_kept", self.count)
        return Written(self.path, Format.QMPCAP, f"{kept} samples", self.error)

    def _fail(self, err: OSError) -> None:
        if self.error is None:
            self.error = f"{err.strerror or err} (the file keeps the samples before it)"
        with contextlib.suppress(OSError):  # the same failure again, flushing the buffer
            self._writer.close()

    def _note_writer_failure(self) -> None:
        # A CaptureWriter may report a failed write instead of raising it.
        failed = getattr(self._writer, "failed", None)
        if failed and self.error is None:
            detail = failed if isinstance(failed, str | BaseException) else "write failed"
            self.error = f"{detail} (the file keeps the samples before it)"


class Collector:
    """Analyses raw samples and feeds the profile, the sample list and capture files."""

    def __init__(self, analyzer: Analyzer, profile: Profile) -> None:
        self.analyzer = analyzer
        self.profile = profile
        self.samples: list[Sample] = []
        self.coverage = KernelCoverage.of(analyzer)
        #: The process-maps reader's counts (`record` sets them once connected).
        self.maps_stats: MapsStats | None = None
        #: Capture files, given once open (`keep_in`): `record` opens them once connected.
        self._captures: list[CaptureOutput] = []

    @property
    def captures(self) -> list[CaptureOutput]:
        return list(self._captures)

    def keep_in(self, capture: CaptureOutput) -> None:
        """Write every sample from now on to `capture` too."""
        self._captures.append(capture)

    def add_captured(self, captured: CapturedSample) -> None:
        """Symbolize one captured sample into the profile and keep it, with its frames'
        names, in the capture files; one that cannot be symbolized is counted, not
        raised, and kept without names."""
        sample = None
        try:
            sample = self.analyzer.symbolize(captured)
        except Exception as err:  # a bad sample is data: it must not lose the profile
            self.profile.unanalysed += 1
            self.profile.last_error = f"{type(err).__name__}: {err}"
        named = sample.frames if sample is not None else ()
        for capture in self._captures:  # never raises: a failing file only stops itself
            capture.add(captured, named)
        if sample is not None:
            self.add(sample)

    def add(self, sample: Sample) -> None:
        self.profile.add(sample)
        self.samples.append(sample)
        self.coverage.add(sample)

    def symbol_problems(self) -> list[str]:
        """The summary's line on kernel-mode PCs left unnamed with no --kernel given
        (KernelCoverage.unnamed_line), if any."""
        line = self.coverage.unnamed_line()
        return [line] if line is not None else []

    def write_outputs(
        self, outputs: Iterable[tuple[Path, Format]], recording: Recording
    ) -> list[Written]:
        """Write each profile output on its own (capture files are written while
        recording and are skipped here); never raises for one that fails."""
        return [
            self._write_one(fmt, recording, path)
            for path, fmt in outputs
            if fmt is not Format.QMPCAP
        ]

    def write(self, fmt: Format, recording: Recording, path: Path, out: Console) -> None:
        """Write one output file and say so. Raises OutputError when it cannot be written."""
        written = self._write_one(fmt, recording, path)
        show_written([written], out)
        raise_for_failures([written])

    def _write_one(self, fmt: Format, recording: Recording, path: Path) -> Written:
        if fmt is Format.QMPCAP:
            return Written(path, fmt, f"{len(self.samples)} samples")
        try:
            write_profile(fmt, self.samples, self.profile, recording, path)
        except OSError as err:
            return Written(path, fmt, error=err.strerror or str(err))
        except Exception as err:  # a bug in one writer must not cost the other outputs
            return Written(path, fmt, error=f"{type(err).__name__}: {err}")
        return Written(path, fmt, f"{len(self.profile.stacks)} distinct stacks")


def show_written(written: Iterable[Written], out: Console) -> None:
    for result in written:
        out.print(result.line(), soft_wrap=True, markup=False, highlight=False)


def raise_for_failures(written: Sequence[Written]) -> None:
    """One OutputError naming every output that could not be written, if any."""
    failed = [result for result in written if result.error is not None]
    if failed:
        listed = "; ".join(f"{result.path}: {result.error}" for result in failed)
        raise OutputError(f"{len(failed)} of {len(written)} outputs not written: {listed}")
