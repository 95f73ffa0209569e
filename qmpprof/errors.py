"""Every error qmpprof raises on purpose. Only the CLI turns them into messages and exit codes.

The whole tree (`python -c "import qmpprof.errors"` imports nothing else of qmpprof):

    QmpprofError                 one line for the user (cli.py prints it, exit 1)
    ├── ConnectionFailed         the socket is missing, silent, or not QMP
    ├── TargetGone               QEMU closed the connection
    ├── BadQmpMessage            QEMU sent a line that is not a QMP message (connection dropped)
    ├── CommandFailed            QEMU refused a command or did not answer in time
    ├── MonitorStuck             the monitor stopped answering; the VM resumed on a new connection
    ├── ResumeFailed             qmpprof paused the VM and could not resume it (`qmpprof resume`)
    ├── TickOverrun              a tick outlived its budget (abandoned, VM resumed, counted)
    ├── RegisterParseError       `info registers` text of an unknown shape
    ├── DirectMemoryUnavailable  guest RAM cannot be read from this host (auto falls back)
    ├── MemoryFault              guest memory that cannot be read (ends one unwind, not the run)
    ├── BadElf                   a binary that is missing or cannot be read
    ├── BadBtf                   a kernel's .BTF that cannot be trusted (its DWARF is read instead)
    ├── BadCfi                   call-frame information that cannot be decoded
    ├── UnsupportedExpression    a CFI expression the evaluator does not handle (ends one unwind)
    ├── BadCapture               a .qmpcap without a readable header
    │   └── BadRecord            one record that does not check (the reader stops before it)
    ├── OutputError              an output that cannot be written
    ├── KernelMismatch           the --kernel ELF does not name the guest's PCs
    ├── BadGuestKernel           the kernel's own tables in guest memory do not check (no --kernel)
    ├── NothingSampled           a recording, `top` or scrape took no sample (VM paused throughout)
    ├── HostProfileFailed        `record --host`: perf is missing, refused, or wrote nothing usable
    ├── BadRequest               `serve`: an HTTP request refused (a status, one line to the client)
    ├── ListenFailed             `serve`: the address to listen on cannot be had
    └── UsageError               the command line asked for something inconsistent

Two private exceptions never leave their module: `_Stop` (unwind/unwinder.py) ends an
unwind with its StopReason, `_Broken` (record/qmpcap_read.py) ends reading a capture.
"""

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


class BadQmpMessage(QmpprofError):
    """QEMU's monitor sent a line that is not a QMP message (not JSON, not a JSON object,
    or endless): the connection is dropped, since no later reply could be matched to its
    command with certainty."""


class CommandFailed(QmpprofError):
    """QEMU answered a QMP or HMP command with an error."""

    def __init__(self, command: str, reason: str) -> None:
        super().__init__(f"QEMU refused {command!r}: {reason}")
        self.command = command
        self.reason = reason


class RegisterParseError(QmpprofError):
    """`info registers` output did not have the shape we expect."""


class DirectMemoryUnavailable(QmpprofError):
    """Guest RAM cannot be read directly from this host (the reason says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot read guest memory directly: {reason}")
        self.reason = reason


class MemoryFault(QmpprofError):
    """Guest memory at `address` could not be read (unmapped, outside a snapshot, ...)."""

    def __init__(self, address: int, size: int = 1) -> None:
        # No message made here: a sample meets several faults (a stack's guard page, code
        # not in memory) and is costlier for formatting one it never shows. The
        # arguments stay in `args`, as BaseException keeps them, so a copy is the same.
        self.address = address
        self.size = size

    def __str__(self) -> str:
        return f"cannot read {self.size} byte(s) of guest memory at {self.address:#x}"


class BadElf(QmpprofError):
    """A file given as a guest binary is missing or is not an ELF file we can read."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class BadBtf(QmpprofError):
    """A kernel's type information (.BTF) that cannot be trusted; never leaves the
    layout reader, which reads the kernel's DWARF instead."""


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


class UnsupportedExpression(QmpprofError):
    """A CFI expression uses an operation (or shape) this evaluator does not handle."""


class TickOverrun(QmpprofError):
    """A tick outlived its time budget: abandoned (the VM resumed if we paused it)."""


class ResumeFailed(QmpprofError):
    """qmpprof paused the VM and could not resume it (the user must: `qmpprof resume`)."""


class MonitorStuck(QmpprofError):
    """QEMU's monitor stopped answering us: the VM was resumed on a new connection."""


class BadCapture(QmpprofError):
    """A capture file that is missing, not a qmpcap, or damaged before its first sample."""


class BadRecord(BadCapture):
    """A header or sample record that is not what the writer writes: the reader keeps
    the samples before it and says why it stopped."""


class BadGuestKernel(QmpprofError):
    """What a Linux guest keeps of its own kernel (VMCOREINFO, kallsyms, ORC, BTF) is
    missing or does not check: qmpprof goes on without the kernel's symbols."""


class NothingSampled(QmpprofError):
    """A recording, `top` or a scrape ended without one sample: the VM was paused by
    someone else throughout (left paused), or every tick failed. Raised after the
    outputs asked for are written."""


class HostProfileFailed(QmpprofError):
    """`record --host` could not profile the QEMU process on this host: perf is not
    installed, the kernel refused it (perf_event_paranoid, permissions), it died, or
    `perf script` printed what cannot be read. Raised before any output is written."""


class BadRequest(QmpprofError):
    """An HTTP request `qmpprof serve` refuses: `status` is the HTTP status it answers
    with, str() the one line the client reads; `headers` go with the answer (Allow)."""

    def __init__(self, status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(reason)
        self.status = status
        self.headers = headers


class ListenFailed(QmpprofError):
    """`qmpprof serve` cannot listen where it was told (in use, not an address here,
    a privileged port)."""
