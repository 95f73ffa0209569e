"""The raw capture file (`.qmpcap`): every sample as recorded, to analyse again later.

JSON lines, gzip-compressed: a header `{"format": "qmpcap", "version": 1, "recording":
{...}}`, then one line per vCPU sample with its time, registers, address space,
identified user binary, process, unwound addresses, the names recording gave them, and
stop reason, and (with --capture-memory) the memory windows read for it
(record/qmpcap_schema.py). `qmpprof report` re-symbolizes the addresses with the
binaries it is given (the recorded names name what those leave unnamed: symbols read
from the guest's memory), or, with the windows, unwinds again.

The file is a series of whole gzip members (which `zcat` reads as one stream): the
header alone in the first, then about a second of samples in each, each appended with
one write once complete and synced to disk in the background, and last a closing record
`{"end": {"samples": N}}`. So a recording killed (SIGKILL, power loss) leaves a file
whose every sample up to its last complete member is readable, and whose missing closing
record says it was cut short; report (record/qmpcap_read.py) reads up to the last intact
record and says what it dropped.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

from qmpprof.errors import BadCapture, OutputError
from qmpprof.model import CapturedSample, Frame, Recording
from qmpprof.record.qmpcap_read import Capture, read_capture
from qmpprof.record.qmpcap_schema import encode_end, encode_header, encode_sample

__all__ = ["BadCapture", "Capture", "CaptureWriter", "read_capture"]

#: Samples that a crash may lose: those of the member not yet written.
FLUSH_INTERVAL_S = 1.0
#: Fastest: with memory windows, a sample costs half of what level 6 costs and a third
#: of gzip's default 9, for files about 30 % larger.
COMPRESSION_LEVEL = 1
#: A gzip member header: magic, deflate, no flags, no mtime, no extra flags, OS unknown.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


class _GzipMember:
    """One gzip member being compressed in memory, record by record."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(COMPRESSION_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._parts = [GZIP_HEADER]
        self._crc = 0
        self._size = 0
        self.records = 0

    def add(self, line: bytes) -> None:
        self._crc = zlib.crc32(line, self._crc)
        self._size += len(line)
        self.records += 1
        compressed = self._deflate.compress(line)
        if compressed:
            self._parts.append(compressed)

    def finish(self) -> bytes:
        """The whole member: header, compressed records and trailer (CRC-32, size)."""
        trailer = struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)
        return b"".join([*self._parts, self._deflate.flush(), trailer])


def _single_member(line: bytes) -> bytes:
    member = _GzipMember()
    member.add(line)
    return member.finish()


class _BackgroundSync:
    """fdatasync in a thread, one at a time, so that a slow disk never delays a tick."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._thread: threading.Thread | None = None
        self.error: OSError | None = None

    def request(self) -> None:
        """Sync what was written so far, unless a sync is still running (the next will)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._sync, name="qmpcap-sync", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _sync(self) -> None:
        try:
            os.fdatasync(self._fd)
        except OSError as err:
            self.error = err


class CaptureWriter:
    """Writes a capture file sample by sample; use as a context manager.

    Never raises once open: a failed write (a full disk) ends the file at its last whole
    member, and `failed` says why; later samples are counted in `samples_lost`.
    """

    def __init__(
        self,
        path: Path,
        recording: Recording,
        keep_memory: bool,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        """Raises OutputError when the file cannot be created or its header written."""
        self.path = path
        self._keep_memory = keep_memory
        self._flush_interval_s = flush_interval_s
        #: Why writing stopped (an OS error's text, "No space left on device"), or None.
        self.failed: str | None = None
        #: Samples in the file, in whole members.
        self.samples_kept = 0
        #: Samples given to add() that the file does not hold because writing failed.
        self.samples_lost = 0
        self._written = 0
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        except OSError as err:
            raise OutputError(f"cannot write {path}: {err.strerror or err}") from err
        self._sync = _BackgroundSync(self._fd)
        self._member = _GzipMember()
        # The first sample is flushed at once: a recording killed early keeps it.
        self._member_started = -self._flush_interval_s
        if not self._append(_single_member(encode_header(recording))):
            self.close()
            raise OutputError(f"cannot write {path}: {self.failed}")
        self._sync.request()

    def add(self, sample: CapturedSample, named: Sequence[Frame] = ()) -> None:
        """Add one sample, with the names of its `named` frames (symbolized); the member
        holding it is written within a flush interval."""
        if self.failed is not None:
            self.samples_lost += 1
            return
        self._member.add(encode_sample(sample, self._keep_memory, named))
        if time.monotonic() - self._member_started >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Write the samples added so far as one whole member, and have it synced."""
        member, self._member = self._member, _GzipMember()
        self._member_started = time.monotonic()
        if not member.records:
            return
        if self.failed is None and self._append(member.finish()):
            self.samples_kept += member.records
            self._sync.request()
        else:
            self.samples_lost += member.records
        self._note_sync_error()

    def close(self) -> None:
        """Write what is left and sync it; never raises (see `failed`)."""
        if self._fd < 0:
            return
        self.flush()
        if self.failed is None:
            self._append(_single_member(encode_end(self.samples_kept)))
        self._sync.wait()  # then one last sync of everything written
        self._sync.request()
        self._sync.wait()
        self._note_sync_error()
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note_sync_error(self) -> None:
        error = self._sync.error
        if error is not None and self.failed is None:
            self.failed = error.strerror or str(error)

    def _append(self, data: bytes) -> bool:
        """Append `data` whole, or cut the file back to its last whole member and fail."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as err:
            self.failed = err.strerror or str(err)
            with contextlib.suppress(OSError):  # else the reader drops the partial member
                os.ftruncate(self._fd, self._written)
            return False
        self._written += len(data)
        return True
