"""`qmpprof resume`: resume a VM that a qmpprof which died (SIGKILL, power loss) left paused."""

from __future__ import annotations

from qmpprof.console import Console, say
from qmpprof.errors import UsageError
from qmpprof.target.marker import PauseMarker
from qmpprof.target.qmp import QmpSession
from qmpprof.target.recovery import qemu_process, resume_left_paused


async def run_resume(qmp_socket: str, out: Console) -> None:
    """Resume the VM behind `qmp_socket` if a dead qmpprof left it paused; say what was done.

    Raises QmpprofError (ConnectionFailed, UsageError when nothing of ours holds it)."""
    session = await QmpSession.connect(qmp_socket)
    try:
        marker = PauseMarker.open(qmp_socket)
        message = None
        if marker is not None:
            try:
                message = await resume_left_paused(session, marker, qemu_process(session))
                if message is not None:
                    marker.remove()
            finally:
                marker.close()
        if message is None:
            status = (await session.execute("query-status")).get("status", "?")
            raise UsageError(
                f"nothing to resume: no qmpprof that died left this VM paused (it is {status})"
            )
        say(out, message)
    finally:
        await session.close()
