"""Each guest process's earlier file mappings, as perf keeps a record of each process's
mappings: what names a user pc that the maps read now no longer hold.

    history = ProcessHistory()
    history.remember(tgid, parent_tgid, files)            # after each successful walk
    named = history.holding(tgid, current_files, pcs)     # None: no earlier map holds them

A process (tgid) keeps the files of its last HISTORY_DEPTH distinct walks, in any address
space, newest first; its history starts with its parent's newest maps (fork copied the
parent's mm), or with `inherited`, the parent's maps just read when no walk saw them.
Inside execve, once the new mm is loaded, the registers are still those of the program
that called it; in exit, after exit_mmap, the process has no maps left: the earlier maps
name both. A walk whose parent is not the history's belongs to another process that got
the same pid, and starts it over. MAX_HISTORIES processes are kept, the least recently
walked forgotten first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qmpprof.model import FileMapping

#: Earlier maps kept per process, newest first: its address spaces before an exec, and
#: at its first walk the maps of the parent it was forked from.
HISTORY_DEPTH = 4
#: Processes whose earlier maps are kept (the least recently walked forgotten first).
MAX_HISTORIES = 4096

Maps = tuple[FileMapping, ...]


@dataclass(frozen=True)
class _History:
    """A process's earlier maps, newest first, and its parent's process id."""

    parent: int | None
    maps: tuple[Maps, ...]


class ProcessHistory:
    """Every process's earlier maps (see the module docstring)."""

    def __init__(self) -> None:
        #: By process id, the least recently walked first.
        self._kept: dict[int, _History] = {}

    def knows(self, process: int) -> bool:
        return process in self._kept

    def starts(self, process: int, parent: int | None) -> bool:
        """Whether a walk that found `parent` starts the history of `process`: none yet,
        or one whose parent is not `parent` (another process that had the same pid)."""
        kept = self._kept.get(process)
        return kept is None or kept.parent != parent

    def remember(self, process: int, parent: int | None, files: Maps, inherited: Maps = ()) -> None:
        """Keep the files of a successful walk of `process` (forked from `parent`),
        after its parent's newest maps, or `inherited`, when its history starts."""
        starts = self.starts(process, parent)
        kept = self._kept.pop(process, None)
        if kept is None or starts:
            from_parent = self._kept.get(parent) if parent is not None else None
            first = from_parent.maps[:1] if from_parent else (inherited,) if inherited else ()
            kept = _History(parent, first)
        if files and (not kept.maps or kept.maps[0] != files):
            kept = _History(kept.parent, (files, *kept.maps)[:HISTORY_DEPTH])
        if not kept.maps:
            return
        if len(self._kept) >= MAX_HISTORIES:
            del self._kept[next(iter(self._kept))]
        self._kept[process] = kept

    def holding(self, process: int | None, files: Maps | None, pcs: Sequence[int]) -> Maps | None:
        """`files` with the mappings of the process's earlier maps that hold `pcs` (and
        overlap none of `files`), sorted by start; None when they hold none."""
        kept = self._kept.get(process) if process is not None else None
        if kept is None or not pcs:
            return None
        current = files or ()
        added: list[FileMapping] = []
        for pc in pcs:
            mapping = _holding(kept.maps, pc)
            if mapping is None or mapping in added:
                continue
            if not any(m.start < mapping.end and mapping.start < m.end for m in current):
                added.append(mapping)
        if not added:
            return None
        return tuple(sorted((*current, *added), key=lambda mapping: mapping.start))

    def clear(self) -> None:
        self._kept.clear()


def _holding(history: tuple[Maps, ...], pc: int) -> FileMapping | None:
    """The newest mapping of `history` that holds `pc` (or ends at it: a return address
    after a mapping's last call)."""
    for files in history:
        for mapping in files:
            if mapping.start <= pc <= mapping.end:
                return mapping
    return None
