"""Whose pause is it: qmpprof resumes the VM only when its own `stop` paused it.

What QEMU (7.2) tells every monitor: a `stop` that pauses a running VM emits a STOP
event, broadcast to all monitors at once, before the reply to that `stop`; a `stop` of
a VM not running changes nothing and emits nothing; each event carries QEMU's
timestamp from the host's real-time clock. So a pause is ours when, after we read
every event waiting (the VM running by them), exactly one STOP came between sending our
`stop` and its reply, stamped no earlier than the moment we sent its last byte, and no
STOP or RESUME came after it. Anything else (a STOP before ours was sent, a RESUME, a
second STOP) means someone else changed the run state, and the VM is left as they left
it. What cannot be told apart (see docs/promises.md): another client's
`stop` executed between our last byte leaving and QEMU executing our `stop` looks like
ours; one executed while we hold the VM paused does nothing in QEMU, so nobody sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from qmpprof.errors import CommandFailed, MonitorStuck, QmpprofError, ResumeFailed, TargetGone

if TYPE_CHECKING:
    from qmpprof.target.qmp import QmpSession, RunEvent

#: A fresh connection to resume on is given this long (the old one was stuck).
RECONNECT_TIMEOUT_S = 5.0


def paused_by_us(events: Sequence[RunEvent] | None, stop_sent_us: int | None) -> bool:
    """Whether our `stop`, sent at `stop_sent_us`, paused the VM, from the run-state events
    read since the VM was last seen running (before it was sent), up to now."""
    if events is None or stop_sent_us is None:
        return False  # never sent, or more events than kept: not ours to resume
    after = 0  # how many events, at the end, are stamped no earlier than our stop
    for event in reversed(events):
        if event.stamp_us is not None and event.stamp_us < stop_sent_us:
            if not event.running:
                return False  # paused by someone else before ours went: ours did nothing
            break
        after += 1
    return after == 1 and not events[-1].running


class PauseHold:
    """One pause of the VM by qmpprof: the marker flag set before the `stop` goes, the
    VM resumed on the way out only if that `stop` paused it, on every way out.

    The caller sends `stop` itself within the block (`session.execute("stop")` or
    `hmp(..., first="stop")`), after a drain found the VM running; `ours()` says whether
    it paused the VM. `budget_s` bounds the block: a command still running then is
    abandoned (TickOverrun) and the VM resumed."""

    def __init__(self, session: QmpSession, budget_s: float | None = None) -> None:
        self._session = session
        self._budget_s = budget_s
        self._mark = 0

    def ours(self) -> bool:
        session = self._session
        session.drain()
        return paused_by_us(session.run_events_since(self._mark), session.stop_sent_us)

    async def __aenter__(self) -> PauseHold:
        session = self._session
        self._mark = session.run_event_count
        session.stop_sent_us = None
        if self._budget_s is not None:
            session.deadline = asyncio.get_running_loop().time() + self._budget_s
        if session.marker is not None:
            session.marker.set_paused(True)  # before the stop can go: SIGKILL may follow
        return self

    async def __aexit__(self, kind: object, error: object, traceback: object) -> None:
        session = self._session
        session.deadline = None
        if error is not None and session.stop_sent_us is not None:
            await _settle(session)
        try:
            if self.ours():
                await resume(session)
            else:
                session.cancel_primed()  # a primed `cont` must never run now
        except ResumeFailed:
            raise  # the flag stays: the next qmpprof, or `qmpprof resume`, will see it
        finally:
            if session.marker is not None and not session.resume_failed:
                session.marker.set_paused(False)


async def _settle(session: QmpSession) -> None:
    """After a failure with our `stop` sent: wait until QEMU has answered it (a command
    sent now is answered after it, and its STOP event, if any, comes before), so that
    `ours()` sees the whole story. A session that cannot tell is left to `resume`."""
    if session.timed_out:
        return
    with contextlib.suppress(QmpprofError):
        await session.execute("query-status")


async def resume(session: QmpSession) -> None:
    """`cont` a VM we paused. When this connection is stuck (a command timed out: QEMU
    may never answer it), resume on a fresh one: QEMU serves one client per socket, so
    ours is closed first. Raises ResumeFailed when the VM may still be paused, and
    TargetGone when QEMU is gone (nothing left to resume)."""
    if not session.timed_out:
        try:
            await session.execute("cont")
            return
        except CommandFailed:
            pass  # timed out (or refused): try afresh
    await session.close()
    try:
        await _cont_on_fresh_connection(session)
    except TargetGone:
        raise
    except QmpprofError as err:
        session.resume_failed = True
        raise ResumeFailed(
            f"could not resume the VM qmpprof paused ({err}): "
            f"run `{session.resume_hint or f'qmpprof resume --qmp-socket {session.path}'}`"
        ) from err
    raise MonitorStuck("QEMU's monitor stopped answering; the VM was resumed on a new connection")


async def _cont_on_fresh_connection(session: QmpSession) -> None:
    """`cont` on a second connection to the same socket (the session's own class opens it:
    this module and target/qmp.py do not import each other at run time)."""
    async with asyncio.timeout(RECONNECT_TIMEOUT_S + 1):
        fresh = await type(session).connect(session.path, RECONNECT_TIMEOUT_S)
        try:
            status = await fresh.execute("query-status")
            if status.get("status") == "paused":
                await fresh.execute("cont")
        finally:
            await fresh.close()


@contextlib.asynccontextmanager
async def paused(session: QmpSession, budget_s: float | None = None) -> AsyncIterator[bool]:
    """Hold a running VM paused for the block; yields whether we paused it.

    A VM that was already paused (by the user, by GDB holding the gdbstub, by another
    QMP client a moment ago) is left exactly as it is: we neither stop nor resume it.
    One we paused is resumed on every way out of the block, exceptions, cancellation and
    an overrun of `budget_s` (TickOverrun) included; one someone else paused or resumed
    meanwhile is left as they left it."""
    if not await session.is_running():
        yield False
        return
    async with PauseHold(session, budget_s) as hold:
        await session.execute("stop")
        yield hold.ours()
