"""`qmpprof resume`: resume a VM that a qmpprof which died (SIGKILL, power loss) left paused."""

from __future__ import annotations

from rich.console import Console

from qmpprof.errors import UsageError


async def run_resume(qmp_socket: str, out: Console) -> None:
    """Resume the VM behind `qmp_socket` if a dead qmpprof left it paused; say what was done.

    Raises QmpprofError (ConnectionFailed, UsageError when nothing of ours holds it)."""
    raise UsageError(f"{qmp_socket}: resume is not implemented yet")
