"""A Linux guest's loaded kernel modules, read from its `modules` list.

`modules` (kernel/module/main.c) is a list_head linking each `struct module` by its
`list` member. What a module is called and where its code lies comes from that struct:
`name` (56 bytes), and the text's base and size, in `core_layout` (struct
module_layout: base, text_size) before 6.4 and in `mem[MOD_TEXT]` (struct
module_memory: base, size) from 6.4 on. Every offset is read from the vmlinux's DWARF
(guest/dwarf_types.py), so one reader serves both.

The list is guest memory, so hostile: the walk stops at the head, at a node seen
before (a cycle), at a node outside the kernel half, and after MAX_MODULES; a name is
cut at MAX_NAME bytes, a text larger than MAX_TEXT or running past the address space is
skipped. The walk is resumable (`ModuleWalk`): a read that faults raises MemoryFault,
the caller reads that memory and calls again, and no module is read twice.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from qmpprof.guest.adapter import task_name
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.memory import MemoryReader
from qmpprof.model import KERNEL_HALF, KernelModule

#: More modules than any real kernel loads (a distribution kernel ships about 4,000).
MAX_MODULES = 4096
#: MODULE_NAME_LEN on 64-bit Linux: 64 - sizeof(unsigned long).
MAX_NAME = 56
#: A module's text is a few megabytes at most; the module area is 1 GiB.
MAX_TEXT = 1 << 30
#: The most bytes of one struct module read, from its start to its last member used.
MAX_SPAN = 4096
#: enum module_state's MODULE_STATE_UNFORMED: a module still being loaded, which
#: /proc/modules does not show either.
MODULE_STATE_UNFORMED = 3
#: The members of struct module the walk needs; `core_layout` or `mem`, by version.
MODULE_MEMBERS = ("state", "list", "name", "core_layout", "mem")
#: Members of struct module_layout (before 6.4) or struct module_memory (from 6.4).
TEXT_MEMBERS = ("base", "size", "text_size")
_TEXT_STRUCTS = {"core_layout": "module_layout", "mem": "module_memory"}
_ADDRESS_END = 1 << 64


@dataclass(frozen=True)
class ModuleListLayout:
    """Where the list head is (link address) and where struct module keeps what the
    walk reads: offsets into its first `span` bytes, read at once."""

    head: int
    next: int  # list_head.next, from the list_head
    state: int
    list: int
    name: int
    name_size: int
    base: int
    size: int
    size_bytes: int
    span: int

    def module_at(self, span: bytes) -> KernelModule | None:
        """The module one struct's bytes describe; None if it is still unformed or its
        text is no place a module can be."""
        state = int.from_bytes(span[self.state : self.state + 4], "little")
        base = int.from_bytes(span[self.base : self.base + 8], "little")
        size = int.from_bytes(span[self.size : self.size + self.size_bytes], "little")
        if state == MODULE_STATE_UNFORMED or base < KERNEL_HALF:
            return None
        if not 0 < size <= MAX_TEXT or base + size > _ADDRESS_END:
            return None
        return KernelModule(task_name(span[self.name : self.name + self.name_size]), base, size)

    def next_node(self, span: bytes) -> int:
        start = self.list + self.next
        return int(struct.unpack_from("<Q", span, start)[0])


@functools.lru_cache(maxsize=4)
def module_list_layout(types: KernelTypes) -> ModuleListLayout | None:
    """The module list's layout in the vmlinux at `path`; None when its symbols or DWARF
    lack any part (about 0.3 s on Debian's kernels: two bounded DWARF scans, the second
    for the struct the first said holds the text)."""
    first = types.layout({"modules"}, {"module", "list_head"}, (*MODULE_MEMBERS, "next"))
    head = first.variables.get("modules")
    module = first.structs.get("module", {})
    next_member = first.structs.get("list_head", {}).get("next")
    holder = next((name for name in _TEXT_STRUCTS if name in module), None)
    if head is None or next_member is None or holder is None:
        return None
    inner = _TEXT_STRUCTS[holder]
    text = types.layout(set(), {inner}, TEXT_MEMBERS).structs.get(inner, {})
    return layout_from_members(head, next_member, module, holder, text)


def layout_from_members(
    head: int,
    next_member: Member,
    module: dict[str, Member],
    holder: str,
    text: dict[str, Member],
) -> ModuleListLayout | None:
    """The layout from DWARF's members: `holder` is the member of struct module that
    holds the text (`mem`'s first entry is MOD_TEXT, enum value 0), `text` the
    members of its struct. None when one is missing or the span is too long."""
    size = text.get("text_size") or text.get("size")
    base = text.get("base")
    wanted = [module.get(name) for name in ("state", "list", "name", holder)]
    if base is None or size is None or size.size not in (4, 8) or None in wanted:
        return None
    state, listed, name, inner = (m for m in wanted if m is not None)
    base_at, size_at = inner.offset + base.offset, inner.offset + size.offset
    name_size = min(name.size or MAX_NAME, MAX_NAME)
    span = max(state.offset + 4, listed.offset + next_member.offset + 8, name.offset + name_size)
    span = max(span, base_at + 8, size_at + size.size)
    if span > MAX_SPAN:
        return None
    return ModuleListLayout(
        head,
        next_member.offset,
        state.offset,
        listed.offset,
        name.offset,
        name_size,
        base_at,
        size_at,
        size.size,
        span,
    )


class ModuleWalk:
    """One walk of the guest's module list, resumed after each MemoryFault."""

    def __init__(self, layout: ModuleListLayout, slide: int) -> None:
        self._layout = layout
        self._head = (layout.head + slide) % _ADDRESS_END
        self._node: int | None = None
        self._seen: set[int] = set()
        self.found: list[KernelModule] = []
        #: Where each module found has its struct module, by name.
        self.structs: dict[str, int] = {}

    def advance(self, memory: MemoryReader) -> tuple[KernelModule, ...]:
        """Walk on to the end of the list and give every module found. Raises
        MemoryFault for the memory it needs next; call again once that is readable."""
        layout = self._layout
        if self._node is None:
            self._node = memory.read_u64((self._head + layout.next) % _ADDRESS_END)
        while self._goes_on(self._node):
            module = self._node - layout.list
            span = memory.read(module, layout.span)
            self._seen.add(self._node)
            found = layout.module_at(span)
            if found is not None:
                self.found.append(found)
                self.structs[found.name] = module
            self._node = layout.next_node(span)
        return tuple(self.found)

    def _goes_on(self, node: int) -> bool:
        if node == self._head or node in self._seen or len(self._seen) >= MAX_MODULES:
            return False
        start = node - self._layout.list
        return start >= KERNEL_HALF and start + self._layout.span <= _ADDRESS_END
