"""After SIGKILL: resume the VM a qmpprof that died left paused (target.marker).

Every command that connects claims the socket's marker; before that, a marker whose
flag is set by a process that no longer exists, for the very QEMU we are connected to
(same pid and start time), with the VM paused by `stop` (status "paused", not GDB's
"debug" nor -S's "prelaunch"), means that qmpprof died between a `stop` and its
`cont`: we resume the VM and say so. A live owner's marker is never taken over.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from qmpprof.errors import DirectMemoryUnavailable, UsageError
from qmpprof.target.direct import qemu_pid
from qmpprof.target.marker import PauseMarker, Process
from qmpprof.target.qmp import QmpSession

#: Stands for a QEMU we cannot identify (another PID namespace): never matches one.
_UNKNOWN = Process(0, 0)


async def claim(session: QmpSession, notice: Callable[[str], None]) -> None:
    """Resume what a dead qmpprof left paused on this socket (telling `notice`), then
    make the socket's marker ours (`session.marker`). Raises UsageError when a live
    qmpprof still holds the marker; without a marker file it does nothing."""
    marker = PauseMarker.open(session.path)
    if marker is None:
        return
    qemu = qemu_process(session)
    try:
        message = await resume_left_paused(session, marker, qemu)
    except BaseException:
        marker.close()
        raise
    if message is not None:
        notice(message)
    me = Process.of(os.getpid())
    marker.claim(me or Process(os.getpid(), 0), qemu or _UNKNOWN)
    session.marker = marker
    marker.remove_stale()


def release(session: QmpSession) -> None:
    """Give the marker up on the way out: removed, unless the VM we paused could not be
    resumed (then its set flag tells the next qmpprof). Never raises."""
    marker, session.marker = session.marker, None
    if marker is None:
        return
    if session.resume_failed:
        marker.close()
    else:
        marker.remove()


async def resume_left_paused(
    session: QmpSession, marker: PauseMarker, qemu: Process | None
) -> str | None:
    """Resume the VM if a qmpprof that died left it paused; what was done, or None."""
    state = marker.read()
    if state is None or not state.paused:
        return None
    owner = state.owner
    if owner.pid != os.getpid() and owner.alive():
        raise UsageError(
            f"qmpprof (pid {owner.pid}) is still running and may hold the VM paused "
            f"through {session.path}: leaving it alone"
        )
    if qemu is None or state.qemu != qemu:
        return None  # another QEMU since (or one we cannot tell): not ours to resume
    status = await session.execute("query-status")
    if status.get("status") != "paused":
        return None
    await session.execute("cont")
    return f"resumed the VM: a qmpprof that died (pid {owner.pid}) had left it paused"


def qemu_process(session: QmpSession) -> Process | None:
    """The QEMU process behind the session, or None when it cannot be seen from here."""
    try:
        return Process.of(qemu_pid(session))
    except DirectMemoryUnavailable:
        return None
