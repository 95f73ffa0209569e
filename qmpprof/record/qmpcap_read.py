"""Reading a `.qmpcap` capture file up to its last intact record, whatever follows it.

A capture may end early (the recording was killed, the disk filled), be damaged (a bad
block), or be crafted. The reader walks its gzip members one by one, checks every
record (record/qmpcap_schema.py), and gives out a member's records only once the member's
CRC-32 has checked: a damaged member costs its own records, never a wrong sample. A
member cut short by the end of the file has no CRC-32 left, so its records are dropped
too (a flipped byte can make a whole member look cut short); only a version-1 capture,
one single member, is read up to its last complete record. What was dropped, and why,
is one line in `Capture.damage`.

Every allocation is bounded: input is read in chunks, decompressed a step at a time,
a record line is at most MAX_RECORD_BYTES, and the records held until their member's
check at most MAX_HELD_BYTES (past that they are given out unchecked: a capture from an
older qmpprof is one single member).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import BinaryIO

from qmpprof.errors import BadCapture, BadRecord
from qmpprof.model import CapturedSample, Recording
from qmpprof.record.qmpcap_schema import (
    MAX_RECORD_BYTES,
    decode_end,
    decode_header,
    decode_sample,
    parse_line,
)

#: Compressed bytes read at a time.
CHUNK = 64 * 1024
#: Decompressed bytes produced by one zlib call.
STEP = 1024 * 1024
#: Records held, decoded, until the CRC-32 of their member checks.
MAX_HELD_BYTES = 32 * 1024 * 1024
#: zlib's window bits for a gzip member, header and trailer included.
GZIP_WBITS = 16 + zlib.MAX_WBITS

#: Marks the end of a gzip member whose CRC-32 and size checked.
MEMBER_END = None


class _Broken(Exception):
    """Reading stopped here: the file was cut short, damaged, or holds a bad record."""

    def __init__(self, reason: str, cut_short: bool = False, bad_record: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        #: The file ends early: what was decoded of it is what was written.
        self.cut_short = cut_short
        #: A record in an intact member is not a sample: the file was made so.
        self.bad_record = bad_record
        #: Decoded bytes of an incomplete last line.
        self.partial = 0


class _Members:
    """The decompressed data of concatenated gzip members, and where each begins."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        #: File offset of the member being read.
        self.member_start = 0
        #: File bytes consumed by zlib so far.
        self.consumed = 0

    def pieces(self) -> Iterator[bytes | None]:
        """Decoded data, MEMBER_END after each whole member. Raises _Broken."""
        data = b""
        while True:
            data = data or self._stream.read(CHUNK)
            if not data:
                return
            self.member_start = self.consumed
            data = yield from self._member(data)
            yield MEMBER_END

    def _member(self, data: bytes) -> Generator[bytes, None, bytes]:
        """Decoded data of the member starting with `data`; returns the bytes after it."""
        inflater = zlib.decompressobj(GZIP_WBITS)
        more_output = False
        while not inflater.eof:
            if not data and not more_output:
                data = self._stream.read(CHUNK)
                if not data:
                    raise _Broken("ends inside a compressed block", cut_short=True)
            try:
                out = inflater.decompress(data, STEP)
            except zlib.error as err:
                why = str(err).rpartition(": ")[2]
                raise _Broken(f"has bad compressed data ({why})") from err
            rest = inflater.unconsumed_tail or inflater.unused_data
            self.consumed += len(data) - len(rest)
            data, more_output = rest, len(out) == STEP
            if out:
                yield out
        return data


def _lines(pieces: Iterator[bytes | None]) -> Iterator[bytes | None]:
    """The lines of the decoded data, and MEMBER_END as `pieces` gives it. Raises _Broken."""
    buffer = bytearray()
    try:
        for piece in pieces:
            if piece is MEMBER_END:
                yield MEMBER_END
                continue
            searched, start = len(buffer), 0
            buffer += piece
            while (end := buffer.find(b"\n", searched)) >= 0:
                yield bytes(buffer[start : end + 1])
                start = searched = end + 1
            del buffer[:start]
            if len(buffer) > MAX_RECORD_BYTES:
                raise _Broken(f"has a record longer than {MAX_RECORD_BYTES} bytes")
        if buffer:
            raise _Broken("ends inside its last record", cut_short=True)
    except _Broken as broken:
        broken.partial = len(buffer)
        raise


class Capture:
    """An open capture file: its recording now, its samples once; then `damage`."""

    def __init__(self, path: Path, stream: BinaryIO) -> None:
        self.path = path
        self.size = os.fstat(stream.fileno()).st_size
        #: One line saying what was dropped and why, once `samples()` has ended; None
        #: when every byte of the file was read.
        self.damage: str | None = None
        #: Samples given out by `samples()` so far.
        self.count = 0
        self._stream = stream
        self._members = _Members(stream)
        self._lines = _lines(self._members.pieces())
        self._line_number = 1
        #: The sample count of the closing record, once read.
        self._end: int | None = None
        self.recording, self.version = self._header()

    def samples(self) -> Iterator[CapturedSample]:
        """Every sample up to the last intact one, in order."""
        held: list[CapturedSample] = []
        try:
            yield from self._records(held)
            self.damage = self._check_end()
        except _Broken as broken:
            # A version-1 capture is one gzip member: cut short, its records were never
            # checked and are what was written. From version 2 each member is written
            # whole at once, and a flipped byte can make a whole member look cut short,
            # so the records of a member without its CRC-32 are never used.
            trusted = broken.cut_short and self.version < 2
            untrusted = 0 if trusted else len(held)
            if trusted:
                yield from self._give_out(held)
            self.damage = self._describe(broken, untrusted)
        finally:
            self.close()

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _header(self) -> tuple[Recording, int]:
        try:
            line = next((line for line in self._lines if line is not MEMBER_END), None)
        except _Broken as broken:
            self.close()
            raise BadCapture(f"{self.path} is not a readable qmpcap file: it {broken}") from broken
        try:
            if line is None:
                raise BadRecord("it is empty")
            return decode_header(parse_line(line))
        except BadRecord as err:
            self.close()
            raise BadCapture(f"{self.path} is not a readable qmpcap file: {err}") from err

    def _records(self, held: list[CapturedSample]) -> Iterator[CapturedSample]:
        held_bytes = 0
        for line in self._lines:
            if line is MEMBER_END or held_bytes > MAX_HELD_BYTES:
                yield from self._give_out(held)
                held_bytes = 0
            if line is MEMBER_END:
                continue
            self._line_number += 1
            try:
                self._add_record(parse_line(line), held)
            except BadRecord as err:
                self._finish_member()
                yield from self._give_out(held)
                why = f"has a bad record {self._line_number} ({err})"
                raise _Broken(why, bad_record=True) from err
            held_bytes += len(line)

    def _add_record(self, record: object, held: list[CapturedSample]) -> None:
        if self._end is not None:
            raise BadRecord("it follows the closing record")
        self._end = decode_end(record)
        if self._end is None:
            held.append(decode_sample(record))

    def _check_end(self) -> str | None:
        """What the closing record, or its absence, says about the samples read."""
        if self._end is None and self.version >= 2:
            return (
                f"{self.path} has no closing record (the recording was killed?); read"
                f" {self.count} samples, those of its last second or so were never written"
            )
        if self._end is not None and self._end != self.count:
            return f"{self.path}: its closing record counts {self._end} samples, read {self.count}"
        return None

    def _finish_member(self) -> None:
        """Read to the end of the current member, so that its CRC-32 is checked."""
        for line in self._lines:
            if line is MEMBER_END:
                return

    def _give_out(self, held: list[CapturedSample]) -> Iterator[CapturedSample]:
        for sample in held:
            self.count += 1
            yield sample
        held.clear()

    def _describe(self, broken: _Broken, untrusted: int) -> str:
        read = f"read {self.count} samples"
        if broken.cut_short:
            dropped = (
                f"an incomplete last record ({broken.partial} bytes)"
                if broken.partial
                else "no complete record"
            )
            if untrusted:
                dropped += f" and the {untrusted} unchecked records of its incomplete block"
            killed = "(was the recording killed?)"
            return f"{self.path} {broken.reason} {killed}; {read}, dropped {dropped}"
        if broken.bad_record:
            after = self.size - self._members.consumed
            return (
                f"{self.path} {broken.reason}; {read}, dropped it and the rest of the file"
                f" ({after} bytes after its block)"
            )
        start = self._members.member_start
        failed = f" ({untrusted} records in them failed the check)" if untrusted else ""
        return (
            f"{self.path} {broken.reason} in the block at byte {start} of {self.size}; {read},"
            f" dropped the last {self.size - start} bytes{failed}"
        )


def read_capture(path: Path) -> Capture:
    """The capture file at `path`, its header read and checked. Raises BadCapture."""
    try:
        stream = path.open("rb")
    except OSError as err:
        raise BadCapture(f"{path}: cannot open: {err.strerror or err}") from err
    return Capture(path, stream)
