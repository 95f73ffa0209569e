"""The records of a `.qmpcap` capture file, each one JSON line: encoded, and decoded with
every field checked, since a capture file is input like any other and may be damaged.

A record that does not check raises BadRecord, whose message names the field (never its
value: it may hold guest-controlled text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from enum import Enum
from typing import Any, TypeVar

from qmpprof.errors import BadRecord
from qmpprof.model import (
    CapturedSample,
    FileMapping,
    Frame,
    FrameAddress,
    FrameKind,
    FrameName,
    KernelModule,
    MemoryWindow,
    Process,
    RawSample,
    Recording,
    Recovery,
    RegisterSet,
    StopReason,
    UnwoundStack,
)

FORMAT = "qmpcap"
#: 2: a closing record ends a capture that was closed (version 1 had none).
VERSION = 2
READABLE_VERSIONS = (1, 2)

#: The longest record line the reader accepts, and the writer writes. A record is at
#: most a few kilobytes without memory; with --capture-memory its windows fit in this
#: (the writer leaves them out of a record that would not).
MAX_RECORD_BYTES = 4 * 1024 * 1024
#: Deepest stack a record holds (far above DEFAULT_MAX_DEPTH and the --max-depth limit).
MAX_FRAMES = 65536
#: Memory windows per record: the stack and a few more (record/capture.py reads up to 4).
MAX_WINDOWS = 16
#: Executable file mappings of one process (guest/linux/maps.py reads no more), the
#: length of a path (PATH_MAX) and of a build-id (modules.MAX_BUILD_ID).
MAX_FILE_MAPS = 1024
MAX_PATH = 4096
MAX_BUILD_ID = 64
#: The longest function name a record keeps (C++ names run long, not this long).
MAX_NAME = 4096
#: JSON arrays and objects in one record line: its frames and windows, and a few more.
#: Counted before parsing, so that a line of `[[[],[],...]]` never becomes millions of lists.
MAX_CONTAINERS = MAX_FRAMES + MAX_WINDOWS + MAX_FILE_MAPS + 16
#: Named general registers in a record (x86-64 has 18).
MAX_REGISTERS = 64
#: Real recordings start after 1970 and before 2286, last less than 30 years, and sample
#: at a period between a microsecond and an hour; outputs multiply these by 1e9.
MAX_TIME_S = 1e10
MAX_DURATION_S = 1e9
PERIOD_RANGE_S = (1e-6, 3600.0)

U64 = (1 << 64) - 1


def encode_header(recording: Recording) -> bytes:
    return _line({"format": FORMAT, "version": VERSION, "recording": asdict(recording)})


def encode_end(samples: int) -> bytes:
    """The closing record: the file was closed, not cut short, and holds `samples`."""
    return _line({"end": {"samples": samples}})


def encode_sample(sample: CapturedSample, keep_memory: bool, named: Sequence[Frame] = ()) -> bytes:
    """The sample's record line, with the names of its `named` frames (the stack's,
    symbolized); without its memory windows when they would not fit."""
    record = _sample_record(sample)
    names = [_name(frame) for frame in named[:MAX_FRAMES]]
    if any(names) and len(names) == len(record["frames"]):
        record["names"] = names
    if keep_memory and sample.raw.windows:
        record["windows"] = [[w.base, w.data.hex()] for w in sample.raw.windows[:MAX_WINDOWS]]
        line = _line(record)
        if len(line) <= MAX_RECORD_BYTES:
            return line
        del record["windows"]
    return _line(record)


def _sample_record(sample: CapturedSample) -> dict[str, Any]:
    # Spelled out: dataclasses.asdict's deep copy was most of the cost of a sample.
    raw, regs, stack = sample.raw, sample.raw.registers, sample.stack
    frames, stop = stack.frames, stack.stop
    if len(frames) > MAX_FRAMES:
        frames, stop = frames[:MAX_FRAMES], StopReason.MAX_DEPTH
    process = sample.process
    return {
        "t": raw.time,
        "regs": {
            "vcpu": regs.vcpu,
            "general": dict(regs.general),
            "cs": regs.cs,
            "cpl": regs.cpl,
            "halted": regs.halted,
            "bits": regs.bits,
            "cr0": regs.cr0,
            "cr3": regs.cr3,
            "cr4": regs.cr4,
            "efer": regs.efer,
            "gs_base": regs.gs_base,
            "gdt_base": regs.gdt_base,
            "tr_base": regs.tr_base,
            "fs_base": regs.fs_base,
            "cs_base": regs.cs_base,
            "isa": regs.isa,
            "tpidr": regs.tpidr,
        },
        "user_module": raw.user_module,
        "error": raw.error,
        "maps": None if raw.file_maps is None else [_file_mapping(m) for m in raw.file_maps],
        "frames": [[f.address, f.kind.value, f.how.value] for f in frames],
        "stop": stop.value,
        "fault": stack.fault_address,
        "process": None
        if process is None
        else {
            "pid": process.pid,
            "name": process.name,
            "tid": process.tid,
            "thread_name": process.thread_name,
        },
    }


def _name(frame: Frame) -> list[Any] | None:
    if frame.function is None:
        return None
    return [frame.function[:MAX_NAME], frame.offset, frame.module]


def _file_mapping(mapping: FileMapping) -> list[Any]:
    identity = mapping.build_id.hex() if mapping.build_id is not None else None
    return [mapping.start, mapping.end, mapping.offset, mapping.path, identity]


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def parse_line(line: bytes) -> Any:
    """The JSON value of one record line. Raises BadRecord."""
    if line.count(b"[") + line.count(b"{") > MAX_CONTAINERS:
        raise BadRecord("too many nested values")
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise BadRecord("not JSON") from err


#: A capture's kernel modules: as many, and names as long, as guest/linux/modules.py reads.
MAX_KERNEL_MODULES = 4096
MAX_MODULE_NAME = 56
#: A kernel's recorded bias stays inside the x86-64 address space either way.
MAX_BIAS = 1 << 64


def decode_header(header: Any) -> tuple[Recording, int]:
    """The recording a capture's header line describes, and the file's version.

    Raises BadRecord."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BadRecord("not a qmpcap header")
    version = header.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise BadRecord("a qmpcap version this qmpprof does not read")
    fields = _Fields(header, "")
    return _recording(fields.get("recording", _dict)), version


def _recording(recording: dict[str, Any]) -> Recording:
    fields = _Fields(recording, "recording.")
    return Recording(
        started=fields.get("started", _number_within(0.0, MAX_TIME_S)),
        duration_s=fields.get("duration_s", _number_within(0.0, MAX_DURATION_S)),
        period_s=fields.get("period_s", _number_within(*PERIOD_RANGE_S)),
        qmp_socket=fields.get("qmp_socket", _str, ""),
        kernel=fields.get("kernel", _optional(_str), None),
        command_line=fields.get("command_line", _str, ""),
        kernel_bias=fields.get("kernel_bias", _int_within(-MAX_BIAS, MAX_BIAS), 0),
        kernel_modules=fields.get("kernel_modules", _kernel_modules, ()),
        kernel_release=fields.get("kernel_release", _optional(_str), None),
    )


def _kernel_modules(value: Any) -> tuple[KernelModule, ...]:
    return tuple(_kernel_module(entry) for entry in _list(value, MAX_KERNEL_MODULES))


def _kernel_module(value: Any) -> KernelModule:
    fields = _Fields(_dict(value), "recording.kernel_modules.")
    name = fields.get("name", _str)
    if len(name) > MAX_MODULE_NAME:
        raise BadRecord("field 'recording.kernel_modules.name' is too long")
    base, size = fields.get("base", _u64), fields.get("size", _u64)
    if base + size > U64 + 1:
        raise BadRecord("field 'recording.kernel_modules.size' runs past the address space")
    return KernelModule(name, base, size)


def decode_end(record: Any) -> int | None:
    """The sample count of a closing record; None for any other record. Raises BadRecord."""
    if not isinstance(record, dict) or "end" not in record:
        return None
    fields = _Fields(_Fields(record, "").get("end", _dict), "end.")
    return fields.get("samples", _int_within(0, 1 << 62))


def decode_sample(record: Any) -> CapturedSample:
    """The sample a record line holds. Raises BadRecord."""
    if not isinstance(record, dict):
        raise BadRecord("the record is not an object")
    fields = _Fields(record, "")
    raw = RawSample(
        time=fields.get("t", _number_within(0.0, MAX_TIME_S)),
        registers=_registers(fields.get("regs", _dict)),
        windows=fields.get("windows", _windows, ()),
        user_module=fields.get("user_module", _optional(_str), None),
        error=fields.get("error", _optional(_str), None),
        file_maps=fields.get("maps", _optional(_file_maps), None),
    )
    stack = UnwoundStack(
        frames=fields.get("frames", _frames),
        stop=fields.get("stop", _enum(StopReason)),
        fault_address=fields.get("fault", _optional(_u64), None),
    )
    names: tuple[FrameName | None, ...] = fields.get("names", _names, ())
    if names and len(names) != len(stack.frames):
        raise BadRecord("field 'names' does not name each frame")
    return CapturedSample(raw, stack, fields.get("process", _optional(_process)), names)


def _names(value: Any) -> tuple[FrameName | None, ...]:
    return tuple(_optional(_frame_name)(name) for name in _list(value, MAX_FRAMES))


def _frame_name(value: Any) -> FrameName:
    function, offset, module = _tuple(value, 3)
    if len(_str(function)) > MAX_NAME or (module is not None and len(_str(module)) > MAX_PATH):
        raise ValueError("has a name too long")
    return FrameName(function, _u64(offset), module)


def _registers(regs: dict[str, Any]) -> RegisterSet:
    fields = _Fields(regs, "regs.")
    isa = fields.get("isa", _isa, "x86_64")
    return RegisterSet(
        vcpu=fields.get("vcpu", _int_within(0, 1 << 16)),
        general=fields.get("general", _GENERAL[isa]),
        cs=fields.get("cs", _int_within(0, 0xFFFF)),
        cpl=fields.get("cpl", _int_within(0, 3)),
        halted=fields.get("halted", _bool),
        bits=fields.get("bits", _one_of(16, 32, 64)),
        cr0=fields.get("cr0", _u64, 0),
        cr3=fields.get("cr3", _u64, 0),
        cr4=fields.get("cr4", _u64, 0),
        efer=fields.get("efer", _u64, 0),
        gs_base=fields.get("gs_base", _u64, 0),
        gdt_base=fields.get("gdt_base", _u64, 0),
        tr_base=fields.get("tr_base", _u64, 0),
        fs_base=fields.get("fs_base", _u64, 0),
        cs_base=fields.get("cs_base", _u64, 0),
        isa=isa,
        tpidr=fields.get("tpidr", _u64, 0),
    )


def _isa(value: Any) -> str:
    if value not in _GENERAL:
        raise ValueError(f"is not one of {', '.join(_GENERAL)}")
    return str(value)


def _general_with(*required: str) -> Callable[[Any], dict[str, int]]:
    """The check of a `general` that names at least `required`."""

    def check(value: Any) -> dict[str, int]:
        general = _dict(value)
        if len(general) > MAX_REGISTERS:
            raise ValueError("has too many registers")
        missing = set(required) - general.keys()
        if missing:
            raise ValueError(f"lacks {', '.join(sorted(missing))}")
        return {name: _u64(number) for name, number in general.items()}

    return check


#: The registers each instruction set's `general` must name (RegisterSet.isa).
_GENERAL = {
    "x86_64": _general_with("rip", "rsp", "rbp"),
    "aarch64": _general_with("pc", "sp", "x29", "x30"),
}


def _frames(value: Any) -> tuple[FrameAddress, ...]:
    frames = _list(value, MAX_FRAMES)
    if not frames:
        raise ValueError("is empty")
    return tuple(_frame(frame) for frame in frames)


def _frame(value: Any) -> FrameAddress:
    address, kind, how = _tuple(value, 3)
    return FrameAddress(_u64(address), _enum(FrameKind)(kind), _enum(Recovery)(how))


def _windows(value: Any) -> tuple[MemoryWindow, ...]:
    return tuple(_window(window) for window in _list(value, MAX_WINDOWS))


def _window(value: Any) -> MemoryWindow:
    base, text = _tuple(value, 2)
    data = bytes.fromhex(_str(text))
    if _u64(base) + len(data) > U64 + 1:
        raise ValueError("runs past the end of the address space")
    return MemoryWindow(base, data)


def _file_maps(value: Any) -> tuple[FileMapping, ...]:
    return tuple(_file_map(mapping) for mapping in _list(value, MAX_FILE_MAPS))


def _file_map(value: Any) -> FileMapping:
    start, end, offset, path, identity = _tuple(value, 5)
    if len(_str(path)) > MAX_PATH:
        raise ValueError("has a path too long")
    build_id = bytes.fromhex(_str(identity)) if identity is not None else None
    if build_id is not None and len(build_id) > MAX_BUILD_ID:
        raise ValueError("has a build-id too long")
    return FileMapping(_u64(start), _u64(end), _u64(offset), path, build_id)


def _process(value: Any) -> Process:
    fields = _Fields(_dict(value), "process.")
    return Process(
        pid=fields.get("pid", _optional(_int_within(-(1 << 63), U64))),
        name=fields.get("name", _str),
        tid=fields.get("tid", _optional(_int_within(-(1 << 63), U64)), None),
        thread_name=fields.get("thread_name", _optional(_str), None),
    )


T = TypeVar("T")
E = TypeVar("E", bound=Enum)
_NO_DEFAULT: Any = object()


class _Fields:
    """Reads the fields of one JSON object, naming the field when one is wrong."""

    def __init__(self, record: dict[str, Any], prefix: str) -> None:
        self._record = record
        self._prefix = prefix

    def get(self, name: str, check: Callable[[Any], T], default: T = _NO_DEFAULT) -> T:
        if name not in self._record:
            if default is _NO_DEFAULT:
                raise BadRecord(f"field '{self._prefix}{name}' is missing")
            return default
        try:
            return check(self._record[name])
        except (ValueError, TypeError) as err:
            raise BadRecord(f"field '{self._prefix}{name}' {err}") from err


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("is not an object")
    return value


def _list(value: Any, longest: int) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("is not a list")
    if len(value) > longest:
        raise ValueError(f"has more than {longest} entries")
    return value


def _tuple(value: Any, length: int) -> list[Any]:
    if not isinstance(value, list) or len(value) != length:
        raise TypeError(f"has an entry that is not a list of {length}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("is not a string")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("is not true or false")
    return value


def _int_within(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is not int:
            raise TypeError("is not an integer")
        if not low <= value <= high:
            raise ValueError(f"is outside {low}..{high}")
        return value

    return check


_u64 = _int_within(0, U64)


def _number_within(low: float, high: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if type(value) not in (int, float):
            raise TypeError("is not a number")
        if not low <= value <= high:  # also refuses NaN and infinities
            raise ValueError(f"is outside {low:g}..{high:g}")
        return float(value)

    return check


def _one_of(*choices: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is not int or value not in choices:
            raise ValueError(f"is not one of {', '.join(map(str, choices))}")
        return value

    return check


def _enum(kind: type[E]) -> Callable[[Any], E]:
    def check(value: Any) -> E:
        if not isinstance(value, str):
            raise TypeError("is not a string")
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"is not a known {kind.__name__}") from None

    return check


def _optional(check: Callable[[Any], T]) -> Callable[[Any], T | None]:
    def optional(value: Any) -> T | None:
        return None if value is None else check(value)

    return optional
