"""A Linux process's executable file mappings, read from its kernel's memory map.

What /proc/PID/maps prints comes from the mm's VMAs: `task->mm->mm_mt` is a maple tree
(include/linux/maple_tree.h, 6.1 on) whose leaves hold the `struct vm_area_struct`s;
before 6.1 they are a list, sorted by address, from `mm->mmap` along each `vm_next`.
Which one a kernel has is told by its types (mm_struct has `mm_mt` or `mmap`), never by
its version.
Each VMA gives vm_start, vm_end, vm_pgoff (pages), vm_flags (VM_EXEC) and vm_file; a
file's path is its dentry's name and its parents' (`f_path.dentry`, d_name, d_parent) up
to the root of its filesystem. The vDSO has no file: it is the executable VMA whose
vm_private_data is a `struct vm_special_mapping` named "[vdso]" (as /proc/PID/maps
names it), mapped whole from its ELF header, and given as a file of that name. The
offsets of every struct member come from the vmlinux's DWARF (guest/dwarf_types.py);
the maple node's own layout does not, since its structs are only in lib/maple_tree.c's
unit, past the DWARF scan's bound: it is fixed by the header for 64-bit kernels
(256-byte nodes, type in the encoded pointer's bits 3-6) and the same in 6.1 and 6.12
(GDB's ptype of both: tests/unit/test_linux_maps.py).

Mount points are not crossed: a path is from its filesystem's root (the whole path for a
file on the root filesystem, as in the Linux test guest).

Each mapping also keeps its file's `struct file *` and the process's VMAs of that file
(FileSource), so a page of the file the process never touched can be found in the
page cache (guest/linux/page_cache.py): a VMA with an anon_vma may hold private copies
of its pages, which the page cache does not have, so none of its pages are taken from
there.

Two resumable walks, each raising MemoryFault for what it reads next (the caller reads
it and calls again; nothing read twice): `MapsWalk` over kernel memory gives the
mappings with their paths, and `BuildIdRead` over the process's own memory reads a
file's build-id from its ELF header where the file is mapped at offset 0.

The memory is the guest's, so hostile: the tree's depth, its nodes, the VMAs, a path's
depth and each name are bounded; a node or VMA seen before is not read again (cycles);
a kernel pointer outside the kernel half ends its branch.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from qmpprof.errors import MemoryFault
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.memory import MemoryReader
from qmpprof.model import KERNEL_HALF, FileMapping

#: The kernel's own cap on one process's VMAs (the default vm.max_map_count).
MAX_VMAS = 65_536
#: Maple nodes: a tree of MAX_VMAS entries has fewer; a bound on hostile ones.
MAX_NODES = MAX_VMAS
#: A maple tree of 2**64 indices is at most about 10 levels deep.
MAX_DEPTH = 16
#: Path components followed up from a file's dentry, and bytes of a whole path.
MAX_PATH_DEPTH = 256
PATH_MAX = 4096
#: NAME_MAX: the longest name of one path component.
NAME_MAX = 255
VM_EXEC = 0x4
PAGE_SHIFT = 12
PAGE_SIZE = 1 << PAGE_SHIFT

# The maple tree's encoding (include/linux/maple_tree.h, lib/maple_tree.c).
NODE_SIZE = 256
_NODE_MASK = NODE_SIZE - 1
_TYPE_SHIFT, _TYPE_MASK = 3, 0xF
LEAF_64, RANGE_64, ARANGE_64 = 1, 2, 3
#: XA_ZERO_ENTRY: a reserved slot, no VMA.
_ZERO_ENTRY = (257 << 2) | 2
_ADDRESS_END = 1 << 64
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class NodeShape:
    """Where a maple node type keeps its pivots, slots and metadata end."""

    pivots: int  # offset of pivot[0]
    count: int  # slots; pivots are one fewer
    slots: int
    meta_end: int
    #: maple_arange_64 always keeps its end in its metadata; the others only when
    #: their last pivot is 0 (ma_data_end).
    end_in_meta: bool
    leaf: bool


#: maple_range_64 (leaves too) and maple_arange_64, as GDB prints them in 6.1 and 6.12.
SHAPES = {
    LEAF_64: NodeShape(8, 16, 128, 248, end_in_meta=False, leaf=True),
    RANGE_64: NodeShape(8, 16, 128, 248, end_in_meta=False, leaf=False),
    ARANGE_64: NodeShape(8, 10, 80, 240, end_in_meta=True, leaf=False),
}

_STRUCTS = {"task_struct", "mm_struct", "maple_tree", "vm_area_struct", "file", "path"}
_STRUCTS |= {"dentry", "qstr", "vm_special_mapping"}
_MEMBERS = (
    *("mm", "mm_mt", "ma_root", "vm_start", "vm_end", "vm_pgoff", "vm_flags", "vm_file"),
    *("anon_vma", "pgd", "mmap", "vm_next", "vm_private_data", "real_parent", "tgid"),
    *("active_mm", "mm_users"),
    *("f_path", "dentry", "d_name", "d_parent", "len", "name"),
)
#: The name the kernel gives the vDSO's special mapping (/proc/PID/maps prints it).
VDSO_NAME = "[vdso]"
#: The most bytes of one struct read at once (a VMA, a dentry).
MAX_SPAN = 1024


@dataclass(frozen=True)
class MapsLayout:
    """Offsets of what the walk reads, from the vmlinux's DWARF."""

    task_mm: int
    #: mm_struct.mm_mt.ma_root (6.1 on), else mm_struct.mmap, the head of a VMA list.
    mm_root: int
    vm_start: int
    vm_end: int
    vm_flags: int
    vm_pgoff: int
    vm_file: int
    file_dentry: int  # file.f_path.dentry
    d_parent: int
    d_len: int  # d_name.len (u32)
    d_name: int  # d_name.name (pointer)
    #: vm_area_struct.anon_vma; None: unknown, so every VMA may hold private copies.
    vm_anon_vma: int | None = None
    #: mm_struct.pgd: the page tables CR3 holds while the mm is loaded.
    mm_pgd: int | None = None
    #: vm_area_struct.vm_next: the VMAs are a list from mm_root (before 6.1), not a tree.
    vm_next: int | None = None
    #: vm_area_struct.vm_private_data and vm_special_mapping.name: what names a special
    #: mapping such as the vDSO (None: the vDSO is not told from other anonymous code).
    vm_private_data: int | None = None
    special_name: int | None = None
    #: task_struct.real_parent and task_struct.tgid: whose copy a forked process's first
    #: maps are (None: unknown).
    task_parent: int | None = None
    task_tgid: int | None = None
    #: task_struct.active_mm and mm_struct.mm_users: the mm an exiting task still runs
    #: on after exit_mm, while exit_mmap tears it down (None: unknown).
    task_active_mm: int | None = None
    mm_users: int | None = None

    @property
    def vma_span(self) -> int:
        fields = (self.vm_start, self.vm_end, self.vm_flags, self.vm_pgoff, self.vm_file)
        optional = (self.vm_anon_vma, self.vm_next, self.vm_private_data)
        return max(*fields, *(offset or 0 for offset in optional)) + 8

    @property
    def dentry_span(self) -> int:
        return max(self.d_parent, self.d_name) + 8

    @classmethod
    def from_members(cls, structs: dict[str, dict[str, Member]]) -> MapsLayout | None:
        """The layout, if DWARF has every member and each struct's span is bounded."""
        try:
            return cls._from(structs)
        except KeyError:
            return None

    @classmethod
    def _from(cls, s: dict[str, dict[str, Member]]) -> MapsLayout | None:
        vma, name, mm = s["vm_area_struct"], s["dentry"]["d_name"].offset, s["mm_struct"]
        if "mm_mt" in mm:
            root, vm_next = mm["mm_mt"].offset + s["maple_tree"]["ma_root"].offset, None
        else:
            root, vm_next = mm["mmap"].offset, vma["vm_next"].offset
        layout = cls(
            s["task_struct"]["mm"].offset,
            root,
            vma["vm_start"].offset,
            vma["vm_end"].offset,
            vma["vm_flags"].offset,
            vma["vm_pgoff"].offset,
            vma["vm_file"].offset,
            s["file"]["f_path"].offset + s["path"]["dentry"].offset,
            s["dentry"]["d_parent"].offset,
            name + s["qstr"]["len"].offset,
            name + s["qstr"]["name"].offset,
            vma["anon_vma"].offset if "anon_vma" in vma else None,
            mm["pgd"].offset if "pgd" in mm else None,
            vm_next,
            *_special_mapping(s),
            *_task_parent(s["task_struct"]),
            *_near(s["task_struct"].get("active_mm"), mm.get("mm_users")),
        )
        spans_fit = layout.vma_span <= MAX_SPAN and layout.dentry_span <= MAX_SPAN
        return layout if spans_fit and layout.task_mm < 1 << 16 else None


def _task_parent(task: dict[str, Member]) -> tuple[int | None, int | None]:
    """task_struct.real_parent and task_struct.tgid, if both are known and near."""
    return _near(task.get("real_parent"), task.get("tgid"))


def _near(first: Member | None, second: Member | None) -> tuple[int | None, int | None]:
    """The offsets of two members, if both are known and within 64 KiB of their
    structs' starts (else neither)."""
    if first is None or second is None or max(first.offset, second.offset) >= 1 << 16:
        return None, None
    return first.offset, second.offset


def _special_mapping(s: dict[str, dict[str, Member]]) -> tuple[int | None, int | None]:
    """vm_area_struct.vm_private_data and vm_special_mapping.name, if both are known."""
    private = s["vm_area_struct"].get("vm_private_data")
    name = s.get("vm_special_mapping", {}).get("name")
    if private is None or name is None or name.offset >= MAX_SPAN:
        return None, None
    return private.offset, name.offset


@functools.lru_cache(maxsize=4)
def maps_layout(types: KernelTypes) -> MapsLayout | None:
    """The layout in the vmlinux at `path`; None when its DWARF lacks a part."""
    return MapsLayout.from_members(types.layout(set(), _STRUCTS, _MEMBERS).structs)


#: The most VMAs of one file kept in its FileSource (a library has about five).
MAX_FILE_VMAS = 64


@dataclass(frozen=True)
class FileVma:
    """One VMA of a file: `copied` when it may hold private copies of its pages."""

    start: int
    end: int
    pgoff: int
    copied: bool


@dataclass(frozen=True)
class FileSource:
    """A mapped file's `struct file *` and the process's VMAs of it: where the page
    cache has what the process sees at an address it never touched."""

    file: int
    vmas: tuple[FileVma, ...]

    def page_index(self, address: int) -> int | None:
        """The index in the file (in pages) of the page at `address`, None when no VMA
        of the file maps it or its VMA may hold a private copy of it."""
        for vma in self.vmas:
            if vma.start <= address < vma.end:
                return None if vma.copied else vma.pgoff + (address - vma.start) // PAGE_SIZE
        return None


@dataclass(frozen=True)
class MappedFile:
    """An executable file mapping as the kernel has it; `header` is where the same file
    is mapped from offset 0 (its ELF header), None when it is not."""

    start: int
    end: int
    offset: int
    path: str
    header: int | None
    header_size: int = 0
    source: FileSource | None = None

    def with_build_id(self, build_id: bytes | None) -> FileMapping:
        return FileMapping(self.start, self.end, self.offset, self.path, build_id)


def _optional_u64(memory: MemoryReader, base: int, offset: int | None) -> int | None:
    """The word at base + offset when the memory already read holds it (the page the
    walk read for its neighbours, nearly always); None, not a fault, when not."""
    if offset is None or not is_kernel(base + offset):
        return None
    try:
        return memory.read_u64(base + offset)
    except MemoryFault:
        return None


def is_node(entry: int) -> bool:
    """xa_is_node: an encoded maple node pointer, not an entry."""
    return entry & 3 == 2 and entry > 4096


def is_kernel(address: int, size: int = 8) -> bool:
    return address >= KERNEL_HALF and address + size <= _ADDRESS_END


@dataclass
class _Pending:
    """A node still to be read: its encoded pointer, the largest index it covers and
    its depth."""

    enode: int
    maximum: int
    depth: int


@dataclass
class _Vma:
    start: int
    end: int
    flags: int
    pgoff: int
    file: int
    copied: bool
    #: The next VMA of a list (before 6.1); 0 at its end and in a maple tree.
    next: int = 0
    #: vm_private_data: a special mapping's description (the vDSO's), else whatever
    #: its owner keeps there.
    private: int = 0


@dataclass
class _State:
    root_read: bool = False
    nodes: list[_Pending] = field(default_factory=list)
    seen_nodes: set[int] = field(default_factory=set)
    vmas: list[int] = field(default_factory=list)
    seen_vmas: set[int] = field(default_factory=set)
    read_vmas: list[_Vma] = field(default_factory=list)
    executable: list[_Vma] | None = None
    paths: list[str] = field(default_factory=list)
    file_paths: dict[int, str] = field(default_factory=dict)
    dentries: dict[int, tuple[int, bytes | None]] = field(default_factory=dict)
    files: dict[int, int] = field(default_factory=dict)
    #: The executable VMAs of no file that describe themselves in vm_private_data (a
    #: special mapping's, as the vDSO's is), in address order; and the name of each
    #: description read (by its address).
    special: list[_Vma] = field(default_factory=list)
    special_names: dict[int, str | None] = field(default_factory=dict)


class MapsWalk:
    """One walk of a task's memory map, resumed after each MemoryFault."""

    def __init__(self, layout: MapsLayout, task: int) -> None:
        self._layout = layout
        self._task = task
        self._state = _State()
        #: Every executable range (file or not), once the walk is done.
        self.executable: list[tuple[int, int]] = []
        #: Whether the task has an mm (a kernel thread has none), and its page tables.
        self.has_mm = False
        self.pgd: int | None = None
        #: The task has no mm, past exit_mm, and the walk read the mm it ran on instead.
        self.exiting = False

    def advance(self, memory: MemoryReader) -> tuple[MappedFile, ...]:
        """Every executable file mapping, sorted by start (none for a kernel thread).
        Raises MemoryFault for the memory it needs next; call again once readable."""
        state = self._state
        if not state.root_read:
            self._read_root(memory)
        while state.nodes:
            pending = state.nodes.pop()
            try:
                self._read_node(memory, pending)
            except MemoryFault:
                state.nodes.append(pending)
                raise
        while len(state.read_vmas) < len(state.vmas):
            vma = self._read_vma(memory, state.vmas[len(state.read_vmas)])
            state.read_vmas.append(vma)
            if vma.next:
                self._add_vma(vma.next)
        if state.executable is None:
            state.executable = self._executable_files()
        while len(state.paths) < len(state.executable):
            file = state.executable[len(state.paths)].file
            if file not in state.file_paths:
                state.file_paths[file] = self._path(memory, file)
            state.paths.append(state.file_paths[file])
        for vma in state.special:
            if vma.private not in state.special_names:
                state.special_names[vma.private] = self._special_name(memory, vma.private)
        return self._mapped(state.executable)

    def _read_root(self, memory: MemoryReader) -> None:
        if is_kernel(self._task + self._layout.task_mm):
            mm = memory.read_u64(self._task + self._layout.task_mm)
            self.has_mm = mm != 0
            if mm == 0:
                mm = self._exiting_mm(memory)
                self.exiting = mm != 0
            if mm != 0:
                self.pgd = _optional_u64(memory, mm, self._layout.mm_pgd)
            if mm != 0 and is_kernel(mm + self._layout.mm_root):
                root = memory.read_u64(mm + self._layout.mm_root)
                if self._layout.vm_next is None:
                    self._add_root(root)
                elif root:
                    self._add_vma(root)
        self._state.root_read = True

    def _exiting_mm(self, memory: MemoryReader) -> int:
        """The task's active_mm when no process uses it any more (mm_users 0: exit_mmap
        is tearing it down, its VMAs still there until the end); else 0. A task past
        exit_mm that is switched out and in again borrows the mm of the task before it,
        as a kernel thread does: that one's users are not 0."""
        active, users = self._layout.task_active_mm, self._layout.mm_users
        if active is None or users is None or not is_kernel(self._task + active):
            return 0
        mm = memory.read_u64(self._task + active)
        if not is_kernel(mm + users, 4):
            return 0
        return mm if memory.read(mm + users, 4) == bytes(4) else 0

    def _add_root(self, root: int) -> None:
        """ma_root: a node (xa_is_node), or the tree's one entry."""
        if is_node(root):
            self._add_node(root, _ADDRESS_END - 1, 0)
        else:
            self._add_vma(root)

    def _add_node(self, enode: int, maximum: int, depth: int) -> None:
        """A node to read: within an inner node every slot is one (mt_mk_node: no
        xa_is_node bits, only the type's)."""
        state = self._state
        if depth < MAX_DEPTH and len(state.seen_nodes) + len(state.nodes) < MAX_NODES:
            state.nodes.append(_Pending(enode, maximum, depth))

    def _add_vma(self, entry: int) -> None:
        state = self._state
        usable = entry & 7 == 0 and is_kernel(entry, self._layout.vma_span)
        if usable and entry not in state.seen_vmas and len(state.vmas) < MAX_VMAS:
            state.seen_vmas.add(entry)
            state.vmas.append(entry)

    def _read_node(self, memory: MemoryReader, pending: _Pending) -> None:
        node = pending.enode & ~_NODE_MASK
        shape = SHAPES.get((pending.enode >> _TYPE_SHIFT) & _TYPE_MASK)
        if shape is None or node in self._state.seen_nodes or not is_kernel(node, NODE_SIZE):
            return
        data = memory.read(node, NODE_SIZE)
        self._state.seen_nodes.add(node)
        # Children are pushed last first, so that the stack visits them in order.
        for entry, maximum in reversed(node_entries(data, shape, pending.maximum)):
            if not shape.leaf:
                self._add_node(entry, maximum, pending.depth + 1)
            elif entry != _ZERO_ENTRY:
                self._add_vma(entry)

    def _read_vma(self, memory: MemoryReader, address: int) -> _Vma:
        layout = self._layout
        span = memory.read(address, layout.vma_span)

        def word(offset: int) -> int:
            return int(_U64.unpack_from(span, offset)[0])

        start, end, flags = word(layout.vm_start), word(layout.vm_end), word(layout.vm_flags)
        anon = 1 if layout.vm_anon_vma is None else word(layout.vm_anon_vma)
        following = 0 if layout.vm_next is None else word(layout.vm_next)
        pgoff, file = word(layout.vm_pgoff), word(layout.vm_file)
        private = 0 if layout.vm_private_data is None else word(layout.vm_private_data)
        return _Vma(start, end, flags, pgoff, file, anon != 0, following, private)

    def _executable_files(self) -> list[_Vma]:
        """The executable VMAs of a file, in address order, once all are read; every
        executable range (file or not) goes to `self.executable`, and those of no file
        that may be a special mapping to the state's `special`."""
        self.executable = []
        files = []
        name = self._layout.special_name
        for vma in sorted(self._state.read_vmas, key=lambda v: v.start):
            if not vma.start < vma.end <= KERNEL_HALF or vma.pgoff >> 52:
                continue
            if vma.flags & VM_EXEC:
                self.executable.append((vma.start, vma.end))
                if is_kernel(vma.file):
                    files.append(vma)
                elif vma.file == 0 and name is not None and is_kernel(vma.private + name):
                    self._state.special.append(vma)
        return files

    def _special_name(self, memory: MemoryReader, description: int) -> str | None:
        """The name in the vm_special_mapping at `description`; None when it has none
        that reads as text."""
        assert self._layout.special_name is not None
        at = memory.read_u64(description + self._layout.special_name)
        if not is_kernel(at, len(VDSO_NAME) + 1):
            return None
        text = memory.read(at, len(VDSO_NAME) + 1)
        return text[: text.find(b"\0")].decode("ascii", "replace") if b"\0" in text else None

    def _vdso(self) -> list[MappedFile]:
        """The vDSO's mapping (an ELF image the kernel maps into the process), as a file
        mapped whole from offset 0, named as /proc/PID/maps names it."""
        names = self._state.special_names
        return [
            MappedFile(vma.start, vma.end, 0, VDSO_NAME, vma.start, vma.end - vma.start)
            for vma in self._state.special
            if names.get(vma.private) == VDSO_NAME
        ]

    def _mapped(self, executable: list[_Vma]) -> tuple[MappedFile, ...]:
        headers: dict[int, _Vma] = {}
        of_file: dict[int, list[FileVma]] = {}
        for vma in sorted(self._state.read_vmas, key=lambda v: v.start):
            if not vma.start < vma.end <= KERNEL_HALF or vma.pgoff >> 52:
                continue
            if vma.pgoff == 0:
                headers.setdefault(vma.file, vma)
            kept = of_file.setdefault(vma.file, [])
            if len(kept) < MAX_FILE_VMAS:
                kept.append(FileVma(vma.start, vma.end, vma.pgoff, vma.copied))
        found = []
        for vma, path in zip(executable, self._state.paths, strict=True):
            header = headers.get(vma.file)
            start, size = (header.start, header.end - header.start) if header else (None, 0)
            source = FileSource(vma.file, tuple(of_file.get(vma.file, ())))
            offset = vma.pgoff << PAGE_SHIFT
            found.append(MappedFile(vma.start, vma.end, offset, path, start, size, source))
        return tuple(sorted([*found, *self._vdso()], key=lambda mapped: mapped.start))

    def _path(self, memory: MemoryReader, file: int) -> str:
        """The file's path from its filesystem's root; "?" for a part unreadable."""
        layout, state = self._layout, self._state
        if file not in state.files:
            state.files[file] = memory.read_u64(file + layout.file_dentry)
        names: list[bytes] = []
        dentry, length = state.files[file], 0
        for _ in range(MAX_PATH_DEPTH):
            if not is_kernel(dentry, layout.dentry_span) or length > PATH_MAX:
                return "?"
            parent, name = self._dentry(memory, dentry)
            if parent == dentry:  # IS_ROOT
                break
            if name is None:
                return "?"
            names.append(name)
            length += len(name) + 1
            dentry = parent
        return "/" + "/".join(n.decode("utf-8", "backslashreplace") for n in reversed(names))

    def _dentry(self, memory: MemoryReader, dentry: int) -> tuple[int, bytes | None]:
        """A dentry's parent and name (None: a name no dentry can have)."""
        dentries = self._state.dentries
        if dentry not in dentries:
            layout = self._layout
            span = memory.read(dentry, layout.dentry_span)
            parent = int(_U64.unpack_from(span, layout.d_parent)[0])
            length = int.from_bytes(span[layout.d_len : layout.d_len + 4], "little")
            at = int(_U64.unpack_from(span, layout.d_name)[0])
            name = None
            if 0 < length <= NAME_MAX and is_kernel(at, length):
                name = memory.read(at, length)
                name = None if b"/" in name or b"\0" in name else name
            dentries[dentry] = (parent, name)
        return dentries[dentry]


def parent_read(layout: MapsLayout, task: int) -> Callable[[MemoryReader], tuple[int, int] | None]:
    """A step that reads the task `task` was forked from (its real_parent) and that
    task's process id (tgid); None when the layout lacks them or the pointer is not the
    kernel's. Raises MemoryFault for the page it needs next."""

    def advance(memory: MemoryReader) -> tuple[int, int] | None:
        offset, tgid = layout.task_parent, layout.task_tgid
        if offset is None or tgid is None or not is_kernel(task + offset):
            return None
        parent = memory.read_u64(task + offset)
        if not is_kernel(parent + tgid, 4):
            return None
        return parent, int.from_bytes(memory.read(parent + tgid, 4), "little")

    return advance


def node_entries(data: bytes, shape: NodeShape, maximum: int) -> list[tuple[int, int]]:
    """A node's slots in use, each with the largest index it covers (ma_data_end)."""
    pivots = [int(_U64.unpack_from(data, shape.pivots + 8 * i)[0]) for i in range(shape.count - 1)]
    last = pivots[-1]
    if shape.end_in_meta or last == 0:
        end = min(data[shape.meta_end], shape.count - 1)
    elif last == maximum:
        end = shape.count - 2
    else:
        end = shape.count - 1
    slots = (int(_U64.unpack_from(data, shape.slots + 8 * i)[0]) for i in range(end + 1))
    return [(slot, pivots[i] if i < end else maximum) for i, slot in enumerate(slots) if slot]


# ELF (include/uapi/linux/elf.h): what a build-id's note is found by.
_ELF_MAGIC = b"\x7fELF\x02\x01"  # 64-bit, little-endian
_PHDR_SIZE = 56
PT_NOTE = 4
NT_GNU_BUILD_ID = 3
#: Program headers read at most, and bytes of one PT_NOTE segment.
MAX_PHDRS = 64
MAX_NOTES_SIZE = 4096
#: The longest build-id taken (qmpprof.modules' bound).
MAX_BUILD_ID = 64


class BuildIdRead:
    """The GNU build-id of the ELF file mapped at `header` (its offset-0 mapping of
    `size` bytes), read from the process's memory; resumed after each MemoryFault."""

    def __init__(self, header: int, size: int) -> None:
        self._header = header
        self._size = size
        self._read: dict[tuple[int, int], bytes] = {}

    def advance(self, memory: MemoryReader) -> bytes | None:
        """The build-id, None if the ELF has none (or not in its first mapping). Raises
        MemoryFault for the memory it needs next."""
        head = self._bytes(memory, 0, 64)
        if head is None or not head.startswith(_ELF_MAGIC):
            return None
        phoff = int(_U64.unpack_from(head, 32)[0])
        entry_size, count = struct.unpack_from("<HH", head, 54)
        if entry_size != _PHDR_SIZE or count > MAX_PHDRS:
            return None
        headers = self._bytes(memory, phoff, count * _PHDR_SIZE)
        for offset, size in _notes(headers or b""):
            notes = self._bytes(memory, offset, size)
            found = build_id_note(notes or b"")
            if found is not None:
                return found
        return None

    def _bytes(self, memory: MemoryReader, offset: int, size: int) -> bytes | None:
        """`size` bytes at `offset` into the mapping; None when past its end."""
        if offset + size > self._size:
            return None
        key = (self._header + offset, size)
        if key not in self._read:
            self._read[key] = memory.read(*key)
        return self._read[key]


def _notes(headers: bytes) -> Iterable[tuple[int, int]]:
    """(file offset, size) of each PT_NOTE segment, bounded."""
    for at in range(0, len(headers) - _PHDR_SIZE + 1, _PHDR_SIZE):
        kind = int.from_bytes(headers[at : at + 4], "little")
        offset, _, _, size = struct.unpack_from("<QQQQ", headers, at + 8)
        if kind == PT_NOTE and 0 < size <= MAX_NOTES_SIZE:
            yield offset, size


def build_id_note(notes: bytes) -> bytes | None:
    """The descriptor of the NT_GNU_BUILD_ID note named "GNU" among `notes`."""
    at = 0
    while at + 12 <= len(notes):
        name_size, desc_size, kind = struct.unpack_from("<III", notes, at)
        name_at = at + 12
        desc_at = name_at + (name_size + 3) // 4 * 4
        desc_end = desc_at + desc_size
        if desc_end > len(notes):
            return None
        name = notes[name_at : name_at + name_size]
        if kind == NT_GNU_BUILD_ID and name == b"GNU\0" and 0 < desc_size <= MAX_BUILD_ID:
            return notes[desc_at:desc_end]
        at = desc_at + (desc_size + 3) // 4 * 4
    return None
