"""Errors qmpprof raises. Only the CLI turns them into messages and exit codes."""

from __future__ import annotations


class QmpprofError(Exception):
    """Root of every error qmpprof raises on purpose; its str() is one line for the user."""


class ConnectionFailed(QmpprofError):
    """The QMP socket could not be reached or did not speak QMP."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot use QMP socket {path}: {reason}")
        self.path = path
        self.reason = reason


class TargetGone(QmpprofError):
    """QEMU closed the connection (it exited, or was killed) while we were using it."""


class CommandFailed(QmpprofError):
    """QEMU answered a QMP or HMP command with an error."""

    def __init__(self, command: str, reason: str) -> None:
        super().__init__(f"QEMU refused {command!r}: {reason}")
        self.command = command
        self.reason = reason


class RegisterParseError(QmpprofError):
    """`info registers` output did not have the shape we expect."""


class MemoryFault(QmpprofError):
    """Guest memory at `address` could not be read (unmapped, outside a snapshot, ...)."""

    def __init__(self, address: int, size: int = 1) -> None:
        super().__init__(f"cannot read {size} byte(s) of guest memory at {address:#x}")
        self.address = address
        self.size = size


class BadElf(QmpprofError):
    """A file given as a guest binary is missing or is not an ELF file we can read."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class UsageError(QmpprofError):
    """The command line asked for something inconsistent."""


class KernelMismatch(QmpprofError):
    """The --kernel ELF names few of the PCs the guest runs at: probably the wrong file."""


class OutputError(QmpprofError):
    """An output file cannot be written."""


class BadCfi(QmpprofError):
    """Call frame information (.eh_frame/.debug_frame) that cannot be decoded: truncated,
    an unknown instruction or pointer encoding, no CFA rule. Costs one function (or one
    section) its unwind information, never the whole module."""


class TickOverrun(QmpprofError):
    """A tick outlived its time budget: abandoned (the VM resumed if we paused it)."""


class ResumeFailed(QmpprofError):
    """qmpprof paused the VM and could not resume it (the user must: `qmpprof resume`)."""


class MonitorStuck(QmpprofError):
    """QEMU's monitor stopped answering us: the VM was resumed on a new connection."""


class BadCapture(QmpprofError):
    """A capture file that is missing, not a qmpcap, or damaged before its first sample."""
