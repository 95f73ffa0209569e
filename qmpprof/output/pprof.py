"""pprof's profile.proto, gzip-compressed (`.pb.gz`): for `go tool pprof`, Pyroscope and friends.

The protobuf encoding is written by hand (varints and length-delimited fields are all the
format needs), so qmpprof depends on no protobuf library. The message and field numbers
are those of github.com/google/pprof/blob/main/proto/profile.proto.
"""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from qmpprof.model import FileMapping, Frame, Recording, Sample
from qmpprof.profile import Grouping, Scope, counted

_VARINT, _LENGTH = 0, 2
_UINT64 = (1 << 64) - 1
#: pprof drops a numeric label whose value and unit are both 0 (vCPU 0): give it a unit.
VCPU_UNIT = "vcpu"
THREAD_UNIT = "thread"


def write_pprof(
    samples: Sequence[Sample],
    recording: Recording,
    path: Path,
    scope: Scope = Scope.ALL,
    include_idle: bool = False,
    grouping: Grouping = Grouping.THREAD,
) -> None:
    """Write the counted samples to `path` as a gzip-compressed profile.proto (replacing it).

    `grouping` changes nothing here: every sample is labelled with its process, thread and
    vCPU, and the viewer groups by them (`pprof -tagroot process,thread`)."""
    path.write_bytes(gzip.compress(pprof_bytes(samples, recording, scope, include_idle)))


def pprof_bytes(
    samples: Sequence[Sample],
    recording: Recording,
    scope: Scope,
    include_idle: bool,
    labels: Sequence[tuple[str, str]] = (),
) -> bytes:
    """The uncompressed profile.proto message for the counted samples; `labels` (key,
    value) go on every sample after its own (`serve`'s `vm`)."""
    builder = ProtoProfile(round(recording.period_s * 1e9), labels)
    for sample in samples:
        frames = counted(sample, scope, include_idle)
        if frames:
            builder.add(sample, frames)
    return builder.encode(recording)


# --- protobuf wire format ----------------------------------------------------------------


def varint(value: int) -> bytes:
    """`value` as a protobuf varint (negative int64s as their 64-bit two's complement)."""
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def uint_field(number: int, value: int) -> bytes:
    """A varint field; omitted when 0, as proto3 does."""
    return varint(number << 3 | _VARINT) + varint(value) if value else b""


def bytes_field(number: int, data: bytes) -> bytes:
    """A length-delimited field: a string, an embedded message or a packed array."""
    return varint(number << 3 | _LENGTH) + varint(len(data)) + data


def packed_field(number: int, values: Iterable[int]) -> bytes:
    """A packed repeated varint field; omitted when empty."""
    data = b"".join(varint(v) for v in values)
    return bytes_field(number, data) if data else b""


# --- the profile's tables ------------------------------------------------------------------


@dataclass
class _Mapping:
    """One module's mapping: its id and the lowest and highest address seen in it; or,
    for a file a process map placed (`file`), that map entry's range, offset and
    build-id, so that pprof's tools can find the file again."""

    id: int
    low: int
    high: int
    file: FileMapping | None = None


@dataclass(frozen=True)
class _SampleKey:
    """What makes two samples one pprof Sample: the same stack and the same labels."""

    locations: tuple[int, ...]
    vcpu: int
    process: str
    mode: str
    #: The thread id the OS adapter gave (None: no thread, or an OS that has none).
    thread: int | None = None
    #: A thread's own name (a QEMU thread of `record --host`).
    thread_name: str | None = None


class ProtoProfile:
    """The tables of one profile.proto being assembled: strings, mappings, functions,
    locations and samples (identical stacks with identical labels are merged)."""

    def __init__(self, period_ns: int, labels: Sequence[tuple[str, str]] = ()) -> None:
        self.period_ns = period_ns
        #: String labels every sample carries after its own.
        self.labels = tuple(labels)
        self.strings: dict[str, int] = {"": 0}
        #: By module name, or by process map entry (FileMapping).
        self.mappings: dict[str | FileMapping, _Mapping] = {}
        self.functions: dict[tuple[str, str | None], int] = {}
        #: (address, label, module) -> (location id, function id, mapping id)
        self.locations: dict[tuple[int, str, str | None], tuple[int, int, int]] = {}
        self.samples: Counter[_SampleKey] = Counter()

    def string(self, text: str) -> int:
        """The index of `text` in the string table, adding it if new."""
        return self.strings.setdefault(text, len(self.strings))

    def add(self, sample: Sample, frames: Sequence[Frame]) -> None:
        """Count one sample whose counted frames (leaf first) are `frames`."""
        locations = tuple(self.location(frame) for frame in frames)
        process = sample.process
        tid = None if process is None or process.tid is None or process.tid < 0 else process.tid
        name = process.thread_name if process is not None else None
        key = _SampleKey(locations, sample.vcpu, sample.label(), sample.mode.value, tid, name)
        self.samples[key] += 1

    def location(self, frame: Frame) -> int:
        """The id of `frame`'s Location (one per address, function and module)."""
        key = (frame.address.lookup_address, frame.label(), frame.module)
        if key not in self.locations:
            function = self.functions.setdefault(key[1:], len(self.functions) + 1)
            mapping = self._extend_mapping(frame)
            self.locations[key] = (len(self.locations) + 1, function, mapping)
        return self.locations[key][0]

    def _extend_mapping(self, frame: Frame) -> int:
        """The id of the mapping `frame` lies in (0: none), grown to hold it."""
        address = frame.address.lookup_address
        if frame.mapping is not None:
            file = frame.mapping
            found = _Mapping(len(self.mappings) + 1, file.start, file.end - 1, file)
            return self.mappings.setdefault(file, found).id
        if frame.module is None:
            return 0
        mapping = self.mappings.setdefault(
            frame.module, _Mapping(len(self.mappings) + 1, address, address)
        )
        mapping.low, mapping.high = min(mapping.low, address), max(mapping.high, address)
        return mapping.id

    def encode(self, recording: Recording) -> bytes:
        """The whole Profile message; the string table goes last, once every string is in."""
        body = b"".join(
            [
                self._sample_types(),
                *(self._sample(key, count) for key, count in self.samples.items()),
                *(self._mapping(name, m) for name, m in self.mappings.items()),
                *(self._location(key, ids) for key, ids in self.locations.items()),
                *(self._function(key, fid) for key, fid in self.functions.items()),
                self._header(recording),
            ]
        )
        return body + b"".join(bytes_field(6, s.encode("utf-8", "replace")) for s in self.strings)

    def _value_type(self, kind: str, unit: str) -> bytes:
        return uint_field(1, self.string(kind)) + uint_field(2, self.string(unit))

    def _sample_types(self) -> bytes:
        return bytes_field(1, self._value_type("samples", "count")) + bytes_field(
            1, self._value_type("cpu", "nanoseconds")
        )

    def _sample(self, key: _SampleKey, count: int) -> bytes:
        labels = [
            self._text_label("process", key.process),
            self._text_label("mode", key.mode),
        ]
        if key.vcpu >= 0:  # a host thread of `record --host` ran on no vCPU
            labels.insert(
                0,
                uint_field(1, self.string("vcpu"))
                + uint_field(3, key.vcpu)
                + uint_field(4, self.string(VCPU_UNIT)),
            )
        if key.thread_name is not None:
            labels.append(self._text_label("thread_name", key.thread_name))
        labels.extend(self._text_label(name, value) for name, value in self.labels)
        if key.thread is not None:
            labels.append(
                uint_field(1, self.string("thread"))
                + uint_field(3, key.thread)
                + uint_field(4, self.string(THREAD_UNIT))
            )
        message = packed_field(1, key.locations) + packed_field(2, [count, count * self.period_ns])
        return bytes_field(2, message + b"".join(bytes_field(3, label) for label in labels))

    def _text_label(self, key: str, value: str) -> bytes:
        return uint_field(1, self.string(key)) + uint_field(2, self.string(value))

    def _mapping(self, key: str | FileMapping, mapping: _Mapping) -> bytes:
        file = mapping.file
        name = file.path if file is not None else str(key)
        build_id = file.build_id.hex() if file is not None and file.build_id else ""
        message = (
            uint_field(1, mapping.id)
            + uint_field(2, mapping.low)
            + uint_field(3, mapping.high + 1)
            + uint_field(4, file.offset if file is not None else 0)
            + uint_field(5, self.string(name))
            + uint_field(6, self.string(build_id))
            + uint_field(7, 1)  # has_functions: the names are already in, do not symbolize
        )
        return bytes_field(3, message)

    def _location(self, key: tuple[int, str, str | None], ids: tuple[int, int, int]) -> bytes:
        address = key[0]
        line = bytes_field(4, uint_field(1, ids[1]))
        return bytes_field(
            4, uint_field(1, ids[0]) + uint_field(2, ids[2]) + uint_field(3, address) + line
        )

    def _function(self, key: tuple[str, str | None], function_id: int) -> bytes:
        name, module = self.string(key[0]), self.string(key[1] or "")
        message = uint_field(1, function_id) + uint_field(2, name) + uint_field(3, name)
        return bytes_field(5, message + uint_field(4, module))

    def _header(self, recording: Recording) -> bytes:
        comments = [recording.command_line] if recording.command_line else []
        return b"".join(
            [
                uint_field(9, round(recording.started * 1e9)),
                uint_field(10, round(recording.duration_s * 1e9)),
                bytes_field(11, self._value_type("cpu", "nanoseconds")),
                uint_field(12, self.period_ns),
                packed_field(13, [self.string(c) for c in comments]),
            ]
        )
