"""What an OS adapter needs from the kernel's ELF: variable addresses and struct layouts
from DWARF, so no offset is a constant in Python."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from qmpprof.errors import BadElf
from qmpprof.symbols.elf_file import open_elf

#: The most DIEs read below one struct or array type: a struct a guest adapter needs
#: has a few dozen members; the bound keeps hostile DWARF from making it millions.
MAX_CHILD_DIES = 4096


@dataclass(frozen=True)
class Member:
    offset: int
    size: int | None


@dataclass(frozen=True)
class KernelLayout:
    """Addresses of data symbols and members of named structs, as the ELF declares them."""

    variables: dict[str, int]
    structs: dict[str, dict[str, Member]]


def read_layout(path: Path, variables: set[str], structs: set[str]) -> KernelLayout:
    """Look up the named variables (.symtab) and structs (DWARF). Missing ones are absent;
    an unreadable ELF or DWARF gives an empty layout (the adapter then does not apply)."""
    try:
        with open_elf(path) as elf:
            found_variables = _variables(elf, variables)
            found_structs = _structs(elf, structs) if elf.has_dwarf_info() else {}
    except BadElf:
        return KernelLayout({}, {})
    return KernelLayout(found_variables, found_structs)


def _variables(elf: ELFFile, names: set[str]) -> dict[str, int]:
    table = elf.get_section_by_name(".symtab")
    if not isinstance(table, SymbolTableSection):
        return {}
    return {
        sym.name: int(sym["st_value"])
        for sym in table.iter_symbols()
        if sym.name in names and sym["st_info"]["type"] == "STT_OBJECT"
    }


def _structs(elf: ELFFile, names: set[str]) -> dict[str, dict[str, Member]]:
    found: dict[str, dict[str, Member]] = {}
    # follow_links=False: a .gnu_debugaltlink names another file, which we do not open.
    for unit in elf.get_dwarf_info(follow_links=False).iter_CUs():
        for die in unit.iter_DIEs():
            name = _name(die)
            if die.tag == "DW_TAG_structure_type" and name in names and name not in found:
                members = _members(die)
                if members:
                    found[name] = members
        if found.keys() == names:
            break
    return found


def _members(struct: Any) -> dict[str, Member]:
    members = {}
    for child in _children(struct):
        location = child.attributes.get("DW_AT_data_member_location")
        if child.tag == "DW_TAG_member" and location is not None and _is_count(location.value):
            members[_name(child) or ""] = Member(location.value, _byte_size(child))
    return members


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


def _byte_size(member: Any) -> int | None:
    if "DW_AT_type" not in member.attributes:
        return None
    type_die = member.get_DIE_from_attribute("DW_AT_type")
    size = type_die.attributes.get("DW_AT_byte_size")
    if size is not None:
        return size.value if _is_count(size.value) else None
    if type_die.tag == "DW_TAG_array_type":
        for sub in _children(type_die):
            upper = sub.attributes.get("DW_AT_upper_bound")
            count = sub.attributes.get("DW_AT_count")
            if upper is not None and _is_count(upper.value):
                return int(upper.value) + 1
            if count is not None and _is_count(count.value):
                return int(count.value)
    return None


def _is_count(value: object) -> bool:
    """A constant that can be an offset or a size (not an expression block, not < 0)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _name(die: Any) -> str | None:
    attribute = die.attributes.get("DW_AT_name")
    if attribute is None or not isinstance(attribute.value, bytes):
        return None
    return attribute.value.decode("utf-8", "replace")
