"""Struct layouts from a kernel's BTF (.BTF): the compact type information every
distribution kernel carries for BPF, a few megabytes against DWARF's hundreds.

One pass over the type records finds each record's place (they have variable length);
a struct is then found by its name's offset in the string section, so asking for a
struct the kernel lacks costs that same pass, not a scan of all of DWARF. Only what the
kernel's BTF holds is read (one little-endian blob, base BTF only: a module's split BTF
refers to the vmlinux's types). The bytes come from a file we did not build: every
count is bounded and every read checked, malformed data is BadBtf.
"""

from __future__ import annotations

import struct
import sys
from array import array

from qmpprof.errors import BadBtf

MAGIC = 0xEB9F
HEADER = struct.Struct("<HBBIIIII")
#: More types than any kernel has (Debian's 6.12: 112,000).
MAX_TYPES = 1 << 21
#: How many typedefs, qualifiers and array levels one member's size goes through.
MAX_TYPE_CHAIN = 32
#: How deep anonymous structs and unions are looked into (6.12's pcpu_hot: two).
MAX_ANONYMOUS_DEPTH = 3
#: The most member entries read for one struct, its anonymous parts included (task_struct
#: has about 250): hostile BTF could nest 65,535 members three deep.
MAX_MEMBERS = 1 << 14

INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
#: 32-bit words of a type record, by kind: its fixed part, and each of its vlen entries
#: (BTF keeps every record a multiple of four bytes; kinds past ENUM64 are unknown).
_FIXED = [3] * (ENUM64 + 1)
_PER_ENTRY = [0] * (ENUM64 + 1)
for _kind_words, _extra in ((INT, 1), (ARRAY, 3), (VAR, 1), (DECL_TAG, 1)):
    _FIXED[_kind_words] += _extra
for _kind_words, _entry in ((STRUCT, 3), (UNION, 3), (ENUM, 2), (FUNC_PROTO, 2), (DATASEC, 3)):
    _PER_ENTRY[_kind_words] = _entry
_PER_ENTRY[ENUM64] = 3
_QUALIFIERS = {TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG}
_SIZED = {INT, STRUCT, UNION, ENUM, ENUM64, FLOAT}
POINTER_SIZE = 8
#: A member name no C struct can have: asked for, its offset is the struct's size (from
#: BTF, and from DWARF in guest/dwarf_types.py).
SIZE = "(size)"


#: A member: its offset in bytes from the start of the struct asked for, and the size
#: of its type through typedefs and qualifiers (None where BTF gives none).
Placed = tuple[int, int | None]


class Btf:
    """The type records of one BTF blob, as 32-bit words, indexed by type id."""

    def __init__(self, data: bytes) -> None:
        if len(data) < HEADER.size:
            raise BadBtf("shorter than its header")
        magic, version, _, header_size, type_off, type_len, str_off, str_len = HEADER.unpack_from(
            data
        )
        if magic != MAGIC or version != 1 or header_size < HEADER.size:
            raise BadBtf(f"not little-endian BTF version 1 (magic {magic:#x})")
        self._words = _words(_slice(data, header_size + type_off, type_len))
        self._strings = _slice(data, header_size + str_off, str_len)
        self._starts = _index(self._words)  # type id N starts at word _starts[N - 1]

    def structs(
        self, names: set[str], wanted: frozenset[str] | None
    ) -> dict[str, dict[str, Placed]]:
        """The members of each struct called one of `names` (its first definition with
        members), those of its anonymous structs and unions too, at offsets from it:
        `wanted` only, when given; SIZE's offset is the struct's size. A struct the BTF
        lacks is absent."""
        named = {at: name for name in names for at in _string_offsets(self._strings, name)}
        found: dict[str, int] = {}
        words = self._words
        for type_id, at in enumerate(self._starts, start=1):
            name = named.get(words[at])
            if name is not None and name not in found:
                info = words[at + 1]
                if _kind(info) == STRUCT and _vlen(info):
                    found[name] = type_id
        layouts = {}
        for name, type_id in found.items():
            members = self._members(type_id, wanted, 0, 0, [MAX_MEMBERS])
            if wanted is None or SIZE in wanted:
                members[SIZE] = (words[self._starts[type_id - 1] + 2], None)
            if members:
                layouts[name] = members
        return layouts

    def section_variables(self, section: str, names: set[str]) -> dict[str, int]:
        """The offset in data section `section` (a DATASEC: `.data..percpu` lists every
        per-CPU variable) of each variable called one of `names` that it lists."""
        sections = _string_offsets(self._strings, section)
        words = self._words
        found: dict[str, int] = {}
        for at in self._starts:
            info = words[at + 1]
            if _kind(info) != DATASEC or words[at] not in sections:
                continue
            for entry in range(at + 3, at + 3 + 3 * _vlen(info), 3):
                variable, offset = words[entry], words[entry + 1]
                if not 0 < variable <= len(self._starts):
                    continue
                var_at = self._starts[variable - 1]
                if _kind(words[var_at + 1]) == VAR:
                    name = self._string(words[var_at])
                    if name in names:
                        found.setdefault(name, offset)
        return found

    def _members(
        self, type_id: int, wanted: frozenset[str] | None, base: int, depth: int, budget: list[int]
    ) -> dict[str, Placed]:
        words, at = self._words, self._starts[type_id - 1]
        bitfields = bool(words[at + 1] >> 31)
        members: dict[str, Placed] = {}
        for entry in range(at + 3, at + 3 + 3 * _vlen(words[at + 1]), 3):
            budget[0] -= 1
            if budget[0] < 0:
                break
            name_off, member_type, bits = words[entry : entry + 3]
            offset = base + ((bits & 0xFFFFFF) if bitfields else bits) // 8
            if name_off == 0:
                inner = self._aggregate(member_type)
                if inner is not None and depth < MAX_ANONYMOUS_DEPTH:
                    nested = self._members(inner, wanted, offset, depth + 1, budget)
                    members |= {key: value for key, value in nested.items() if key not in members}
                continue
            name = self._string(name_off)
            if wanted is None or name in wanted:
                members.setdefault(name, (offset, self._size(member_type)))
        return members

    def _aggregate(self, type_id: int) -> int | None:
        """The struct or union `type_id` is (through qualifiers), or None."""
        resolved = self._resolve(type_id)
        if resolved is None:
            return None
        return resolved if _kind(self._info(resolved)) in (STRUCT, UNION) else None

    def _size(self, type_id: int) -> int | None:
        """Bytes of type `type_id`: through typedefs and qualifiers, arrays multiplied out."""
        count = 1
        for _ in range(MAX_TYPE_CHAIN):
            if not 0 < type_id <= len(self._starts):
                return None
            at = self._starts[type_id - 1]
            kind, size_or_type = _kind(self._words[at + 1]), self._words[at + 2]
            if kind in _SIZED:
                return count * size_or_type
            if kind == PTR:
                return count * POINTER_SIZE
            if kind == ARRAY:
                type_id, count = self._words[at + 3], count * self._words[at + 5]
            elif kind in _QUALIFIERS:
                type_id = size_or_type
            else:
                return None
        return None

    def _resolve(self, type_id: int) -> int | None:
        """`type_id` with typedefs and qualifiers taken off; None for void or a bad id."""
        for _ in range(MAX_TYPE_CHAIN):
            if not 0 < type_id <= len(self._starts):
                return None
            if _kind(self._info(type_id)) not in _QUALIFIERS:
                return type_id
            type_id = self._words[self._starts[type_id - 1] + 2]
        return None

    def _info(self, type_id: int) -> int:
        return self._words[self._starts[type_id - 1] + 1]

    def _string(self, offset: int) -> str:
        end = self._strings.find(b"\0", offset)
        return self._strings[offset : end if end >= 0 else None].decode("utf-8", "replace")


def _slice(data: bytes, start: int, length: int) -> bytes:
    if start + length > len(data):
        raise BadBtf("a section runs past the end of .BTF")
    return data[start : start + length]


def _words(types: bytes) -> array[int]:
    """The type section as little-endian 32-bit words."""
    if len(types) % 4:
        raise BadBtf("its type section is not whole 32-bit words")
    words = array("I", types)
    if sys.byteorder == "big":
        words.byteswap()
    return words


def _index(words: array[int]) -> list[int]:
    """Where each type record starts: a record's length is its kind's fixed part plus
    its vlen entries, so they are found one after the other. Raises BadBtf."""
    starts: list[int] = []
    at, end = 0, len(words)
    fixed, per_entry = _FIXED, _PER_ENTRY
    while at < end:
        if at + 3 > end or len(starts) >= MAX_TYPES:
            raise BadBtf("its type records do not fill the type section")
        info = words[at + 1]
        kind = (info >> 24) & 0x1F
        if kind == 0 or kind > ENUM64:
            raise BadBtf(f"unknown type kind {kind}")
        starts.append(at)
        at += fixed[kind] + per_entry[kind] * (info & 0xFFFF)
    if at != end:
        raise BadBtf("its last type record runs past the type section")
    return starts


def _string_offsets(strings: bytes, name: str) -> set[int]:
    """Every offset at which `name` is stored whole (after a NUL or at 0)."""
    encoded = name.encode() + b"\0"
    found = set()
    at = strings.find(encoded)
    while at >= 0:
        if at == 0 or strings[at - 1] == 0:
            found.add(at)
        at = strings.find(encoded, at + 1)
    return found


def _kind(info: int) -> int:
    return (info >> 24) & 0x1F


def _vlen(info: int) -> int:
    return info & 0xFFFF
