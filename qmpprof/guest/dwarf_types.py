"""What an OS adapter needs from the kernel's ELF: variable addresses and struct layouts
from DWARF, so no offset is a constant in Python."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.common.exceptions import DWARFError, ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection


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
        with path.open("rb") as stream:
            elf = ELFFile(stream)
            found_variables = _variables(elf, variables)
            found_structs = _structs(elf, structs) if elf.has_dwarf_info() else {}
    except (OSError, ELFError, DWARFError, ValueError, KeyError):
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
    for unit in elf.get_dwarf_info().iter_CUs():
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
    for child in struct.iter_children():
        location = child.attributes.get("DW_AT_data_member_location")
        if (
            child.tag == "DW_TAG_member"
            and location is not None
            and isinstance(location.value, int)
        ):
            members[_name(child) or ""] = Member(location.value, _byte_size(child))
    return members


def _byte_size(member: Any) -> int | None:
    if "DW_AT_type" not in member.attributes:
        return None
    type_die = member.get_DIE_from_attribute("DW_AT_type")
    size = type_die.attributes.get("DW_AT_byte_size")
    if size is not None:
        return int(size.value)
    if type_die.tag == "DW_TAG_array_type":
        for sub in type_die.iter_children():
            bound = sub.attributes.get("DW_AT_upper_bound") or sub.attributes.get("DW_AT_count")
            if bound is not None:
                return int(bound.value) + (1 if "DW_AT_upper_bound" in sub.attributes else 0)
    return None


def _name(die: Any) -> str | None:
    attribute = die.attributes.get("DW_AT_name")
    return attribute.value.decode("utf-8", "replace") if attribute is not None else None
