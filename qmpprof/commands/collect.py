"""Turning samples into outputs, shared by `record` (live) and `report` (replayed)."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from qmpprof.analysis import Analyzer
from qmpprof.errors import OutputError
from qmpprof.model import RawSample, Recording, Sample
from qmpprof.output.writers import Format, write_profile
from qmpprof.profile import Profile
from qmpprof.record.capfile import CapturedSample, CaptureWriter
from qmpprof.symbols.coverage import KernelCoverage


def check_writable(paths: list[Path]) -> None:
    """Fail before recording, not after, when an output file cannot be created."""
    for path in paths:
        directory = path.parent
        if not directory.is_dir():
            raise OutputError(f"cannot write {path}: no directory {directory}")
        if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise OutputError(f"cannot write {path}: permission denied")


class Collector:
    """Analyses raw samples and feeds the profile, the sample list and a capture file."""

    def __init__(
        self,
        analyzer: Analyzer,
        profile: Profile,
        captures: list[CaptureWriter] | None = None,
    ) -> None:
        self.analyzer = analyzer
        self.profile = profile
        self.samples: list[Sample] = []
        self.coverage = KernelCoverage()
        self._captures = captures or []

    def add_raw(self, raw: RawSample) -> None:
        """Analyse one raw sample; one that cannot be analysed is counted, not raised."""
        try:
            self._analyse(raw)
        except Exception as err:  # a bad sample is data: it must not lose the profile
            self.profile.unanalysed += 1
            self.profile.last_error = f"{type(err).__name__}: {err}"

    def _analyse(self, raw: RawSample) -> None:
        stack, process = self.analyzer.unwound(raw)
        for capture in self._captures:
            capture.add(CapturedSample(raw, stack, process))
        self.add(self.analyzer.symbolize(raw, stack, process))

    def add(self, sample: Sample) -> None:
        self.profile.add(sample)
        self.samples.append(sample)
        self.coverage.add(sample)

    def write(self, fmt: Format, recording: Recording, path: Path, out: Console) -> None:
        """Write the output file (a capture file is already written) and say so.

        Raises OutputError when the file cannot be written."""
        if fmt is not Format.QMPCAP:
            try:
                write_profile(fmt, self.samples, self.profile, recording, path)
            except OSError as err:
                raise OutputError(f"cannot write {path}: {err.strerror or err}") from err
        what = (
            f"{len(self.samples)} samples"
            if fmt is Format.QMPCAP
            else (f"{len(self.profile.stacks)} distinct stacks")
        )
        out.print(f"wrote {what} to {path} ({fmt.value})", soft_wrap=True, markup=False)
