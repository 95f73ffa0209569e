"""The QMP session: the only module that speaks to QEMU's monitor.

A small asyncio protocol of our own rather than the `qemu.qmp` package: in the
sampling loop qemu.qmp's writer and reader tasks cost several event-loop hand-offs per
command, which measured 2-3x the latency of a bare socket for stop / info registers /
cont (bench/sample_cost.py). Here a reply resolves its caller's future directly from
the protocol's read, and a command first waits for its reply on the socket itself for up to
DIRECT_READ_S, which saves the event loop's two turns when QEMU answers at once (as it
does within a millisecond for every command the sampler sends). Out-of-band execution
is not negotiated, so QEMU answers in order and replies match requests first in, first
out.

QEMU 7 reads QMP input one byte per turn of its monitor thread's loop, several
microseconds a byte: an 85-byte `info registers -a` request spends most of its round
trip being read. So commands go out without the usual newline (QEMU's parser ends a
command at its closing brace), and `prime()` sends a command ahead of time but for that
brace, so that executing it later sends one byte (measured: 0.73 ms → 0.26 ms a round
trip). A primed command that is not executed is cancelled, never run (see prime).

Every method raises a QmpprofError subclass: ConnectionFailed while connecting,
TargetGone when QEMU disappears, CommandFailed when QEMU refuses a command or does
not answer in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import select
import stat
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

from qmpprof.errors import CommandFailed, ConnectionFailed, TargetGone

#: QEMU answers a healthy monitor in well under a millisecond; seconds mean it is stuck
#: (for example a GDB client holding the gdbstub while we asked for `stop`).
COMMAND_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
#: A monitor line longer than this is not QMP (`info registers -a` of 64 vCPUs is ~200 KB).
MAX_LINE = 64 << 20
#: How long a command waits for its reply on the socket itself before it yields to the
#: event loop. QEMU answers the sampler's commands within a millisecond, and a reply read
#: straight away skips two event-loop turns: measured 10 us a command at the median, and
#: 2 points more ticks on time at 1050-1150 Hz nonblocking (A/B, 8 runs each).
DIRECT_READ_S = 0.002
#: Every read lands in one buffer of this size, allocated once: a fresh 1 MiB (or
#: asyncio's default 256 KiB) object per read measured 15-17 us a read here, 1.7 us.
_READ_SIZE = 1 << 16


class _QmpProtocol(asyncio.BufferedProtocol):
    """Splits QEMU's JSON lines into the greeting, replies (FIFO) and run-state events."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.greeting: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        #: One entry per command sent, in order; None for a reply nobody waits for.
        self.pending: deque[asyncio.Future[dict[str, Any]] | None] = deque()
        self.running: bool | None = None
        #: QEMU's timestamp of the STOP event not yet followed by a RESUME.
        self.stopped_at: float | None = None
        #: The last pause QEMU reported (STOP to RESUME, its own timestamps), in seconds.
        self.last_pause_s: float | None = None
        self.closed: Exception | None = None
        self._buffer = b""
        self._chunk = memoryview(bytearray(_READ_SIZE))
        self._fd = -1
        self._poller = select.poll()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._fd = transport.get_extra_info("socket").fileno()
        self._poller.register(self._fd, select.POLLIN)

    def read_directly(self, future: asyncio.Future[dict[str, Any]], seconds: float) -> None:
        """Read the socket without the event loop until `future` has its reply or
        `seconds` pass. Blocks the loop meanwhile, so only for a short wait.

        Whatever is read goes through buffer_updated as the transport's reads do; an
        end of file or error is left for the transport to find and report."""
        if self.transport is None or self.transport.is_closing():
            return
        end = time.monotonic() + seconds
        while not future.done() and self.closed is None:
            left_ms = (end - time.monotonic()) * 1000
            if left_ms <= 0 or not self._poller.poll(left_ms):
                return
            try:
                count = os.readv(self._fd, [self._chunk])
            except OSError:
                return
            if not count:
                return
            self.buffer_updated(count)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._chunk

    def buffer_updated(self, nbytes: int) -> None:
        self._buffer += self._chunk[:nbytes]
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                self._message(line)
        if len(self._buffer) > MAX_LINE:
            self._fail(ValueError("monitor line too long"))

    def _message(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError as err:
            self._fail(err)
            return
        if not isinstance(message, dict):
            self._fail(ValueError("not a JSON object"))
        elif "event" in message:
            self._event(message)
        elif not self.greeting.done():
            self.greeting.set_result(message)
        elif self.pending:
            future = self.pending.popleft()
            if future is not None and not future.done():
                future.set_result(message)

    def _event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if event not in ("STOP", "RESUME"):
            return
        if self.running is not None:
            self.running = event == "RESUME"
        stamp = _timestamp(message)
        if event == "STOP":
            self.stopped_at = stamp
        elif self.stopped_at is not None and stamp is not None:
            self.last_pause_s = max(stamp - self.stopped_at, 0.0)
            self.stopped_at = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or EOFError("QEMU closed the connection"))

    def _fail(self, error: Exception) -> None:
        self.closed = error
        for future in [self.greeting, *self.pending]:
            if future is not None and not future.done():
                future.set_exception(error)
        self.pending.clear()
        if self.transport is not None:
            self.transport.close()


class QmpSession:
    """One QMP connection to one QEMU. Use `connect()` to make one."""

    def __init__(self, protocol: _QmpProtocol, path: str) -> None:
        self._protocol = protocol
        self.path = path
        #: The encoded command whose all but last bytes QEMU has been sent (see prime).
        self._primed: bytes | None = None

    @classmethod
    async def connect(cls, path: str, timeout: float = CONNECT_TIMEOUT_S) -> QmpSession:
        """Connect and negotiate capabilities. Raises ConnectionFailed."""
        _check_socket_path(path)
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_unix_connection(_QmpProtocol, path)
        except OSError as err:
            raise ConnectionFailed(path, _describe_os_error(err)) from err
        session = cls(protocol, path)
        try:
            await session._handshake(timeout)
        except BaseException:
            await session.close()
            raise
        return session

    async def _handshake(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                greeting = await self._protocol.greeting
        except TimeoutError as err:
            raise ConnectionFailed(
                self.path, f"no QMP greeting within {timeout:g} s (is another client connected?)"
            ) from err
        except (ValueError, OSError, EOFError) as err:
            raise ConnectionFailed(self.path, _NOT_QMP) from err
        if "QMP" not in greeting:
            raise ConnectionFailed(self.path, _NOT_QMP)
        try:
            await self.execute("qmp_capabilities")
        except (CommandFailed, TargetGone) as err:
            raise ConnectionFailed(self.path, f"capability negotiation failed ({err})") from err

    async def close(self) -> None:
        """Disconnect; never raises."""
        transport = self._protocol.transport
        if transport is not None:
            transport.close()
        await asyncio.sleep(0)

    async def execute(self, command: str, arguments: Mapping[str, object] | None = None) -> Any:
        """Run one QMP command and return its `return` value."""
        (future,) = self._send((command, _request(command, arguments)))
        return await self._result(command, future)

    def prime(self, command: str, arguments: Mapping[str, object] | None = None) -> None:
        """Send `command` now but for its closing brace: `execute` of the same command
        then sends only that, and QEMU has read the rest meanwhile.

        Safe for any command, `stop` included: executing a different command (or priming
        one) first cancels the primed one. Its closing brace comes after a member QEMU
        refuses, so QEMU answers with an error (dropped) and never runs it. A primed
        command never completed is forgotten by QEMU when the connection closes. A hint:
        does nothing once QEMU has gone (the next `execute` says so).
        """
        self._prime(command, _request(command, arguments))

    def _prime(self, command: str, encoded: bytes) -> None:
        if encoded == self._primed or self._protocol.closed is not None:
            return
        self._write(self._cancel_primed() + encoded[:-_LAST_BYTES], command)
        self._primed = encoded

    def _cancel_primed(self) -> bytes:
        """The bytes that end a primed command so that QEMU refuses it unrun."""
        if self._primed is None:
            return b""
        self._protocol.pending.append(None)  # the refusal, which nobody waits for
        self._primed = None
        return _CANCEL

    def _write(self, data: bytes, command: str) -> None:
        transport = self._protocol.transport
        if self._protocol.closed is not None or transport is None:
            raise TargetGone(f"QEMU closed the QMP connection before {command!r}")
        transport.write(data)

    def _send(self, *requests: tuple[str, bytes]) -> list[asyncio.Future[dict[str, Any]]]:
        """Send (command, encoded) requests in one write, completing a primed one; the
        futures of their replies, in order."""
        data = b"".join(self._unsent(encoded) for _, encoded in requests)
        self._write(data, requests[0][0])
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in requests]
        self._protocol.pending.extend(futures)
        return futures

    def _unsent(self, encoded: bytes) -> bytes:
        """What QEMU has not been sent of an encoded command yet."""
        if encoded == self._primed:
            self._primed = None
            return encoded[-_LAST_BYTES:]
        return self._cancel_primed() + encoded

    async def _result(self, command: str, future: asyncio.Future[dict[str, Any]]) -> Any:
        """The `return` value of a sent command's reply."""
        reply = await self._reply(command, future)
        if "error" in reply:
            error = reply["error"]
            raise CommandFailed(command, str(error.get("desc", error)))
        return reply.get("return")

    async def _reply(self, command: str, future: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self._protocol.read_directly(future, DIRECT_READ_S)
        timer = None
        if not future.done():
            # A bare timer, not asyncio.timeout(): 35 us less a command (bench/sample_cost.py).
            timer = loop.call_at(loop.time() + COMMAND_TIMEOUT_S, _expire, future)
        try:
            return await future
        except TimeoutError as err:
            raise CommandFailed(command, f"no answer within {COMMAND_TIMEOUT_S:g} s") from err
        except (OSError, EOFError, ValueError) as err:
            raise TargetGone(f"QEMU closed the QMP connection during {command!r}") from err
        finally:
            if timer is not None:
                timer.cancel()

    def peer_socket(self) -> Any:
        """The connected socket (to ask the kernel who QEMU is), or None."""
        transport = self._protocol.transport
        return transport.get_extra_info("socket") if transport is not None else None

    async def hmp(self, command_line: str, cpu: int | None = None, first: str | None = None) -> str:
        """Run an HMP command (optionally on one vCPU) and return its text.

        `first`: a QMP command without arguments that QEMU runs just before it (`stop`),
        sent without waiting for its reply: one round trip for both. Raises if either fails.
        """
        request = (_HMP, _hmp_request(command_line, cpu))
        if first is None:
            (future,) = self._send(request)
            return str(await self._result(_HMP, future))
        leading, future = self._send((first, _plain(first)), request)
        try:
            await self._result(first, leading)
        except BaseException:
            future.cancel()  # its reply, if it comes, is skipped
            raise
        return str(await self._result(_HMP, future))

    def hmp_prime(self, command_line: str, cpu: int | None = None) -> None:
        """`prime` an HMP command for a later `hmp` of the same command line."""
        self._prime(_HMP, _hmp_request(command_line, cpu))

    async def is_running(self) -> bool:
        """Whether the guest is running (not paused by us, GDB, or anyone else).

        Asks QEMU once, then follows its STOP and RESUME events (GDB's stops raise
        them too), so a tick needs no `query-status` round trip."""
        if self._protocol.running is None:
            status = await self.execute("query-status")
            self._protocol.running = bool(status["running"])
        return self._protocol.running

    def take_last_pause(self) -> float | None:
        """How long the last pause lasted by QEMU's own clock (its STOP and RESUME events'
        timestamps), once: None if no pause ended since the last call."""
        pause, self._protocol.last_pause_s = self._protocol.last_pause_s, None
        return pause

    async def stop(self) -> None:
        await self.execute("stop")

    async def cont(self) -> None:
        await self.execute("cont")


_NOT_QMP = "not a QMP socket (the other end did not greet like QEMU)"
#: A command's closing brace: what `execute` sends of a primed command.
_LAST_BYTES = 1
#: Ends a primed command with a member QEMU refuses before it looks at the command
#: ("QMP input member '...' is unexpected"): the command is answered with an error, not run.
_CANCEL = b',"qmpprof-cancelled":true}'


def _timestamp(message: dict[str, Any]) -> float | None:
    """An event's `timestamp` in seconds, or None if it has none that makes sense."""
    stamp = message.get("timestamp")
    if not isinstance(stamp, dict):
        return None
    seconds, microseconds = stamp.get("seconds"), stamp.get("microseconds")
    if not isinstance(seconds, int) or not isinstance(microseconds, int):
        return None
    return seconds + microseconds / 1e6


def _expire(future: asyncio.Future[dict[str, Any]]) -> None:
    if not future.done():  # its reply, if it ever comes, is skipped (the future is done)
        future.set_exception(TimeoutError())


_HMP = "human-monitor-command"


@functools.lru_cache(maxsize=64)
def _hmp_request(command_line: str, cpu: int | None) -> bytes:
    """An HMP command encoded (kept: the sampler sends the same one every tick)."""
    arguments: dict[str, object] = {"command-line": command_line}
    if cpu is not None:
        arguments["cpu-index"] = cpu
    return _encode(_HMP, arguments)


def _request(command: str, arguments: Mapping[str, object] | None) -> bytes:
    """A QMP command encoded; from the cache when it has no arguments."""
    return _encode(command, arguments) if arguments else _plain(command)


@functools.lru_cache(maxsize=64)
def _plain(command: str) -> bytes:
    """A command without arguments, encoded (kept: `stop` and `cont` go every tick)."""
    return _encode(command, None)


def _encode(command: str, arguments: Mapping[str, object] | None) -> bytes:
    """One QMP command on the wire, compact and with no newline after it: QEMU reads it
    a byte at a time, and with a newline after each command the pipelined stop-mode
    tick measured a longer tail (p90 2.7-3.3 ms against 1.4-1.5 ms without, A/B)."""
    message: dict[str, object] = {"execute": command}
    if arguments:
        message["arguments"] = dict(arguments)
    return json.dumps(message, separators=(",", ":")).encode()


def _check_socket_path(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as err:
        raise ConnectionFailed(path, "no such file") from err
    except OSError as err:
        raise ConnectionFailed(path, err.strerror or str(err)) from err
    if not stat.S_ISSOCK(mode):
        raise ConnectionFailed(path, "not a socket (expected QEMU's -qmp unix:PATH,server=on)")


def _describe_os_error(err: OSError) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "nothing is listening (has QEMU exited?)"
    if isinstance(err, PermissionError):
        return "permission denied"
    return err.strerror or str(err)


@contextlib.asynccontextmanager
async def paused(session: QmpSession) -> AsyncIterator[bool]:
    """Hold a running VM paused for the block; yields whether we paused it.

    A VM that was already paused (by the user, or by GDB holding the gdbstub) is left
    exactly as it is: we neither stop nor resume it. One we paused is resumed on every
    way out of the block, exceptions and cancellation included.
    """
    if not await session.is_running():
        yield False
        return
    async with resumed_after(session):
        await session.stop()
        yield True


@contextlib.asynccontextmanager
async def resumed_after(session: QmpSession) -> AsyncIterator[None]:
    """Resume the VM on every way out of the block, exceptions and cancellation included:
    for a block that pauses a running VM itself (`hmp(..., first="stop")`)."""
    try:
        yield
    finally:
        await session.cont()
