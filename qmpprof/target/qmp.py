"""The QMP session: the only module that imports qemu.qmp.

Every method raises a QmpprofError subclass: ConnectionFailed while connecting,
TargetGone when QEMU disappears, CommandFailed when QEMU refuses a command or does
not answer in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator, Mapping
from typing import Any

from qemu.qmp import (
    ConnectError,
    EventListener,
    ExecInterruptedError,
    ExecuteError,
    QMPClient,
    QMPError,
)

from qmpprof.errors import CommandFailed, ConnectionFailed, TargetGone

#: QEMU answers a healthy monitor in well under a millisecond; seconds mean it is stuck
#: (for example a GDB client holding the gdbstub while we asked for `stop`).
COMMAND_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0

logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)


class QmpSession:
    """One QMP connection to one QEMU. Use `connect()` to make one."""

    def __init__(self, client: QMPClient, path: str) -> None:
        self._client = client
        self.path = path
        # The run state follows QEMU's STOP/RESUME events (GDB's stops included), so
        # a tick need not ask `query-status` before pausing.
        self._runstate_events = EventListener(("STOP", "RESUME"))
        client.register_listener(self._runstate_events)
        self._running: bool | None = None

    @classmethod
    async def connect(cls, path: str, timeout: float = CONNECT_TIMEOUT_S) -> QmpSession:
        """Connect and negotiate capabilities. Raises ConnectionFailed."""
        _check_socket_path(path)
        client = QMPClient("qmpprof")
        try:
            await asyncio.wait_for(client.connect(path), timeout)
        except TimeoutError as err:
            await _quiet_disconnect(client)
            raise ConnectionFailed(
                path, f"no QMP greeting within {timeout:g} s (is another client connected?)"
            ) from err
        except ConnectError as err:
            raise ConnectionFailed(path, _describe_connect_error(err)) from err
        return cls(client, path)

    async def close(self) -> None:
        """Disconnect; never raises."""
        await _quiet_disconnect(self._client)

    async def execute(self, command: str, arguments: Mapping[str, object] | None = None) -> Any:
        """Run one QMP command and return its `return` value."""
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                return await self._client.execute(command, arguments)
        except ExecuteError as err:
            raise CommandFailed(command, err.error.error.desc) from err
        except TimeoutError as err:
            raise CommandFailed(command, f"no answer within {COMMAND_TIMEOUT_S:g} s") from err
        except (ExecInterruptedError, QMPError, OSError, EOFError) as err:
            raise TargetGone(f"QEMU closed the QMP connection during {command!r}") from err

    def peer_socket(self) -> Any:
        """The connected socket (to ask the kernel who QEMU is), or None if not reachable.

        qemu.qmp keeps its stream private; the transport's `get_extra_info("socket")`
        is asyncio's documented way to the socket."""
        writer = getattr(self._client, "_writer", None)
        get_extra_info = getattr(writer, "get_extra_info", None)
        sock = get_extra_info("socket") if callable(get_extra_info) else None
        return sock if hasattr(sock, "getsockopt") else None

    async def hmp(self, command_line: str, cpu: int | None = None) -> str:
        """Run an HMP command (optionally on one vCPU) and return its text."""
        arguments: dict[str, object] = {"command-line": command_line}
        if cpu is not None:
            arguments["cpu-index"] = cpu
        result = await self.execute("human-monitor-command", arguments)
        return str(result)

    async def is_running(self) -> bool:
        """Whether the guest is running (not paused by us, GDB, or anyone else).

        Asks QEMU once, then follows its STOP and RESUME events."""
        if self._running is None:
            self._runstate_events.clear()
            status = await self.execute("query-status")
            self._running = bool(status["running"])
        for event in self._runstate_events.clear():
            self._running = event["event"] == "RESUME"
        return self._running

    async def stop(self) -> None:
        await self.execute("stop")

    async def cont(self) -> None:
        await self.execute("cont")


def _check_socket_path(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as err:
        raise ConnectionFailed(path, "no such file") from err
    except OSError as err:
        raise ConnectionFailed(path, err.strerror or str(err)) from err
    if not stat.S_ISSOCK(mode):
        raise ConnectionFailed(path, "not a socket (expected QEMU's -qmp unix:PATH,server=on)")


def _describe_connect_error(err: ConnectError) -> str:
    cause = err.exc
    if isinstance(cause, ConnectionRefusedError):
        return "nothing is listening (has QEMU exited?)"
    if isinstance(cause, PermissionError):
        return "permission denied"
    if isinstance(cause, OSError):
        return cause.strerror or str(cause)
    if isinstance(cause, EOFError):
        return "the other end hung up before greeting (not a QMP socket?)"
    return "not a QMP socket (the other end did not greet like QEMU)"


async def _quiet_disconnect(client: QMPClient) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.disconnect(), 2.0)


@contextlib.asynccontextmanager
async def paused(session: QmpSession) -> AsyncIterator[bool]:
    """Hold a running VM paused for the block; yields whether we paused it.

    A VM that was already paused (by the user, or by GDB holding the gdbstub) is left
    exactly as it is: we neither stop nor resume it. One we paused is resumed on every
    way out of the block, exceptions and cancellation included.
    """
    we_paused = await session.is_running()
    try:
        if we_paused:
            await session.stop()
        yield we_paused
    finally:
        if we_paused:
            await session.cont()
