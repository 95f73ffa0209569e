"""What an OS adapter needs from the kernel's ELF: variable addresses and struct layouts
from its type information, so no offset is a constant in Python.

Only what is asked for is read: the variables from the symbol table (unpacked in bulk),
the structs from the kernel's BTF when it has one (guest/btf.py: a few megabytes, and a
struct it lacks is known absent at once), else from the top-level entries of each DWARF
compilation unit (a struct a C file declares at file scope is one), skipping every
entry's children by its DW_AT_sibling where that points forward. The DWARF is mapped,
not read, and the entries read are bounded: a 600 MB kernel .debug_info costs a bounded
scan, not a walk of every entry (about 2 s for a struct it lacks, hence BTF first).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.dwarf.die import DIE

from qmpprof.errors import BadBtf, BadElf
from qmpprof.guest.btf import SIZE, Btf
from qmpprof.symbols.derived import derived, file_key, kind_for
from qmpprof.symbols.elf import read_object_symbols
from qmpprof.symbols.elf_file import ELF_PARSE_ERRORS, open_elf
from qmpprof.symbols.lines import open_mapped_dwarf

#: The most DIEs read below one struct or array type: a struct a guest adapter needs
#: has a few dozen members; the bound keeps hostile DWARF from making it millions.
MAX_CHILD_DIES = 4096
#: The most entries read while looking for structs, over all units: a small kernel
#: has a few thousand; a kernel this bound cuts short lacks the layout (about 3 s here).
MAX_SCANNED_DIES = 50_000

#: Forms of a DW_AT_sibling that are offsets from the start of their unit.
_UNIT_REFERENCES = {
    "DW_FORM_ref1",
    "DW_FORM_ref2",
    "DW_FORM_ref4",
    "DW_FORM_ref8",
    "DW_FORM_ref_udata",
}


@dataclass(frozen=True)
class Member:
    offset: int
    size: int | None


@dataclass(frozen=True)
class KernelLayout:
    """Addresses of data symbols and members of named structs, as the ELF declares them."""

    variables: dict[str, int]
    structs: dict[str, dict[str, Member]]


def read_layout(
    path: Path, variables: set[str], structs: set[str], members: Collection[str] | None = None
) -> KernelLayout:
    """Look up the named variables (.symtab) and structs (BTF, else DWARF): each struct's
    `members` only, when given (a kernel's task_struct has hundreds). Missing ones are
    absent; an unreadable ELF or DWARF gives an empty layout (the adapter then does not
    apply). Kept in the derived cache (symbols/derived.py) for this request."""
    try:
        with open_elf(path) as elf:  # checked before the DWARF is read, even for no variable
            key = file_key(elf)
    except BadElf:
        return KernelLayout({}, {})
    kind = kind_for("layout", variables, structs, members)
    read = functools.partial(_read_layout, path, variables, structs, members)
    return derived(key, kind, read, plain_layout, layout_from_plain)


def _read_layout(
    path: Path, variables: set[str], structs: set[str], members: Collection[str] | None
) -> KernelLayout:
    try:
        with open_elf(path) as elf:
            found_variables = read_object_symbols(elf, variables) if variables else {}
    except BadElf:
        return KernelLayout({}, {})
    btf = _btf(path) if structs else None
    wanted = None if members is None else frozenset(members)
    if btf is not None:
        return btf_layout(btf, found_variables, structs, members)
    return KernelLayout(found_variables, _structs(path, structs, wanted) if structs else {})


def btf_layout(
    btf: Btf, variables: dict[str, int], structs: set[str], members: Collection[str] | None
) -> KernelLayout:
    """`variables` (found elsewhere) and the `members` (all when None) of `structs` that
    `btf` describes."""
    wanted = None if members is None else frozenset(members)
    return layout_from_plain((variables, btf.structs(structs, wanted)))


PlainLayout = tuple[dict[str, int], dict[str, dict[str, tuple[int, int | None]]]]


def plain_layout(layout: KernelLayout) -> PlainLayout:
    """A layout as the derived cache keeps it."""
    structs = {
        name: {m: (at.offset, at.size) for m, at in s.items()} for name, s in layout.structs.items()
    }
    return layout.variables, structs


def layout_from_plain(plain: PlainLayout) -> KernelLayout:
    variables, structs = plain
    placed = {name: {m: Member(*at) for m, at in s.items()} for name, s in structs.items()}
    return KernelLayout(dict(variables), placed)


def _btf(path: Path) -> Btf | None:
    """The ELF's BTF, or None when it has none that reads (its DWARF is read instead):
    indexed once per file (each adapter and walker asks for its own structs)."""
    stat = path.stat()
    return _indexed_btf(path, (stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=2)
def _indexed_btf(path: Path, stamp: tuple[int, int]) -> Btf | None:
    try:
        with open_elf(path) as elf:
            section = elf.get_section_by_name(".BTF")
            data = None if section is None else section.data()
        return None if data is None else Btf(data)
    except (BadElf, BadBtf):
        return None


def _structs(
    path: Path, names: set[str], wanted: frozenset[str] | None
) -> dict[str, dict[str, Member]]:
    dwarf = open_mapped_dwarf(path)
    if dwarf is None:
        return {}
    found: dict[str, dict[str, Member]] = {}
    budget = _Budget(MAX_SCANNED_DIES)
    try:
        for unit in dwarf.iter_CUs():
            if not budget.take():  # each unit's entry counts: a file of empty units ends too
                break
            for die in _top_level(unit, budget):
                name = _name(die)
                # A declaration (no members) may come first; keep looking for the definition.
                if die.tag == "DW_TAG_structure_type" and name in names and not found.get(name):
                    found[name] = _members(die, wanted) | _size_member(die, wanted)
            if all(found.get(name) for name in names) or budget.spent():
                break
    except ELF_PARSE_ERRORS:
        return {}
    return {name: members for name, members in found.items() if members}


class _Budget:
    def __init__(self, entries: int) -> None:
        self.left = entries

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0

    def spent(self) -> bool:
        return self.left <= 0


def _top_level(unit: Any, budget: _Budget) -> Iterator[Any]:
    """The unit's top-level entries (children of its unit entry), in file order."""
    top = unit.get_top_DIE()
    if not top.has_children:
        return
    stream = unit.dwarfinfo.debug_info_sec.stream
    offset, end = top.offset + top.size, unit.cu_offset + unit.size
    while offset < end and budget.take():
        die = DIE(cu=unit, stream=stream, offset=offset)
        if die.size <= 0 or die.is_null():
            return
        yield die
        offset = _after(die, end, budget)


def _after(die: Any, end: int, budget: _Budget) -> int:
    """Where the entry after `die` and its children starts: its DW_AT_sibling when that
    points forward inside the unit (so no hostile value can loop), else found by reading
    the children."""
    following = die.offset + die.size
    if not die.has_children:
        return int(following)
    sibling = die.attributes.get("DW_AT_sibling")
    if sibling is not None and sibling.form in _UNIT_REFERENCES and _is_count(sibling.value):
        target = die.cu.cu_offset + sibling.value
        if following < target <= end:
            return int(target)
    offset, depth = following, 1
    while depth and offset < end and budget.take():
        child = DIE(cu=die.cu, stream=die.stream, offset=offset)
        if child.size <= 0:
            return end
        offset += child.size
        depth += 1 if child.has_children else -1 if child.is_null() else 0
    return int(offset)


#: How deep anonymous structs and unions are looked into (6.12's pcpu_hot: two).
MAX_ANONYMOUS_DEPTH = 3
_AGGREGATES = ("DW_TAG_structure_type", "DW_TAG_union_type")


def _members(
    struct: Any, wanted: frozenset[str] | None, base: int = 0, depth: int = 0
) -> dict[str, Member]:
    """The struct's members by name, those of its anonymous structs and unions too (C
    reaches them by name, `pcpu_hot.top_of_stack`), at offsets from the outer struct."""
    members: dict[str, Member] = {}
    for child in _children(struct):
        offset = _member_offset(child, in_union=struct.tag == "DW_TAG_union_type")
        if child.tag != "DW_TAG_member" or offset is None:
            continue
        name = _name(child)
        if name is None and depth < MAX_ANONYMOUS_DEPTH:
            inner = _anonymous_type(child)
            if inner is not None:
                nested = _members(inner, wanted, base + offset, depth + 1)
                members |= {key: value for key, value in nested.items() if key not in members}
            continue
        if name is not None and (wanted is None or name in wanted):
            members[name] = Member(base + offset, _byte_size(child))
    return members


def _member_offset(member: Any, in_union: bool) -> int | None:
    """A member's offset; a union's members may leave out their (zero) offset."""
    location = member.attributes.get("DW_AT_data_member_location")
    if location is None:
        return 0 if in_union else None
    return int(location.value) if _is_count(location.value) else None


def _anonymous_type(member: Any) -> Any:
    """The struct or union an unnamed member is, or None."""
    if "DW_AT_type" not in member.attributes:
        return None
    type_die = member.get_DIE_from_attribute("DW_AT_type")
    return type_die if type_die.tag in _AGGREGATES else None


def _children(die: Any) -> Iterator[Any]:
    """`die`'s children, read forward from it: pyelftools' iter_children follows
    DW_AT_sibling, which hostile DWARF can point backwards into an endless loop."""
    if not die.has_children:
        return
    offset = die.offset + die.size
    depth = 1
    for _ in range(MAX_CHILD_DIES):
        child = die.cu.get_DIE_from_refaddr(offset)
        offset += child.size
        if child.is_null():
            depth -= 1
            if depth == 0:
                return
            continue
        if depth == 1:
            yield child
        depth += bool(child.has_children)


#: How many array levels a member's size is multiplied through (hostile DWARF can make
#: an array type its own element type).
MAX_ARRAY_DEPTH = 8


def _size_member(die: DIE, wanted: frozenset[str] | None) -> dict[str, Member]:
    """SIZE, when asked for and the struct's definition gives its size."""
    size = die.attributes.get("DW_AT_byte_size")
    if (wanted is not None and SIZE not in wanted) or size is None:
        return {}
    return {SIZE: Member(int(size.value), None)} if isinstance(size.value, int) else {}


def _byte_size(member: Any, depth: int = 0) -> int | None:
    """Bytes of a member's (or an array type's element) type, where DWARF gives them
    directly or as elements times element size; None through typedefs."""
    if "DW_AT_type" not in member.attributes or depth > MAX_ARRAY_DEPTH:
        return None
    type_die = member.get_DIE_from_attribute("DW_AT_type")
    size = type_die.attributes.get("DW_AT_byte_size")
    if size is not None:
        return size.value if _is_count(size.value) else None
    if type_die.tag == "DW_TAG_array_type":
        element = _byte_size(type_die, depth + 1)  # an array's DW_AT_type is its element's
        for sub in _children(type_die):
            upper = sub.attributes.get("DW_AT_upper_bound")
            count = sub.attributes.get("DW_AT_count")
            elements = upper.value + 1 if upper is not None and _is_count(upper.value) else None
            if count is not None and _is_count(count.value):
                elements = count.value
            if elements is not None:
                return None if element is None else int(elements) * element
    return None


def _is_count(value: object) -> bool:
    """A constant that can be an offset or a size (not an expression block, not < 0)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _name(die: Any) -> str | None:
    attribute = die.attributes.get("DW_AT_name")
    if attribute is None or not isinstance(attribute.value, bytes):
        return None
    return attribute.value.decode("utf-8", "replace")
