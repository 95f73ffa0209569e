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
not answer in time, BadQmpMessage when it sends a line that is not a QMP message.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import select
import socket
import stat
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qmpprof.errors import (
    BadQmpMessage,
    CommandFailed,
    ConnectionFailed,
    QmpprofError,
    TargetGone,
    TickOverrun,
)
from qmpprof.target.marker import PauseMarker
from qmpprof.target.pause import paused

__all__ = ["QmpSession", "RunEvent", "paused"]

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
#: Run-state events kept for attribution (a tick looks at the few since it began).
_RUN_EVENTS_KEPT = 64
#: Through a proxy, how long a `stop` or `cont` waits for the event it raised; libvirt
#: forwards it a millisecond or so after the reply.
RUN_EVENT_WAIT_S = 1.0
_RUN_STATE_COMMANDS = ("stop", "cont")


@dataclass(frozen=True)
class RunEvent:
    """A STOP or RESUME event: which, and QEMU's timestamp of it in microseconds of the
    host's real-time clock (g_get_real_time), or None if it had none."""

    running: bool
    stamp_us: int | None


class _Malformed(ValueError):
    """A line from QEMU that is not a QMP message; str() says what is wrong with it."""


class _QmpProtocol(asyncio.BufferedProtocol):
    """Splits QEMU's JSON lines into the greeting, replies (FIFO) and run-state events."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.greeting: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        #: One entry per command sent, in order; None for a reply nobody waits for.
        self.pending: deque[asyncio.Future[dict[str, Any]] | None] = deque()
        self.running: bool | None = None
        #: The last STOP and RESUME events, and how many came in all (a position in them).
        self.run_events: deque[RunEvent] = deque(maxlen=_RUN_EVENTS_KEPT)
        self.run_event_count = 0
        #: QEMU's timestamp of the STOP event not yet followed by a RESUME.
        self.stopped_at: float | None = None
        #: The last pause QEMU reported (STOP to RESUME, its own timestamps), in seconds.
        self.last_pause_s: float | None = None
        self.closed: Exception | None = None
        #: While set, replies are dropped until the one carrying this id (the handshake).
        self.sync_id: str | None = None
        self._buffer = b""
        self._chunk = memoryview(bytearray(_READ_SIZE))
        self._fd = -1
        self._poller = select.poll()
        #: Done once no reply is due (QmpSession.one_at_a_time waits on it).
        self.idle: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._fd = transport.get_extra_info("socket").fileno()
        self._poller.register(self._fd, select.POLLIN)

    def drain(self) -> None:
        """Read whatever QEMU has sent and we have not read yet, without waiting: the
        run state must not be decided on a STOP still sitting in the socket."""
        if self.transport is None or self.transport.is_closing():
            return
        while self.closed is None and self._read_once(0):
            pass

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
            if left_ms <= 0 or not self._read_once(left_ms):
                return

    def await_run_event(self, running: bool, mark: int, seconds: float) -> None:
        """Read the socket without the event loop until a run-state event of `running`
        came after the first `mark`, or `seconds` pass (blocks the loop meanwhile)."""
        end = time.monotonic() + seconds
        while self.closed is None and not self._run_event_since(running, mark):
            left_ms = (end - time.monotonic()) * 1000
            if left_ms <= 0 or not self._read_once(left_ms):
                return

    def _run_event_since(self, running: bool, mark: int) -> bool:
        count = min(self.run_event_count - mark, len(self.run_events))
        return any(self.run_events[-i].running == running for i in range(1, count + 1))

    def _read_once(self, wait_ms: float) -> bool:
        """One read of what arrives within `wait_ms`, through buffer_updated; False when
        nothing came, or at an end of file or error (left for the transport to report)."""
        if not self._poller.poll(wait_ms):
            return False
        try:
            count = os.readv(self._fd, [self._chunk])
        except OSError:
            return False
        if not count:
            return False
        self.buffer_updated(count)
        return True

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._chunk

    def buffer_updated(self, nbytes: int) -> None:
        self._buffer += self._chunk[:nbytes]
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                self._message(line)
        if len(self._buffer) > MAX_LINE:
            self._fail(_Malformed(f"a line longer than {MAX_LINE} bytes"))

    def _message(self, line: bytes) -> None:
        try:
            # Decoded here: json.loads of bytes first guesses their encoding in Python.
            message = json.loads(line.decode())
        except ValueError as err:
            self._fail(_Malformed(f"not JSON: {err}"))
            return
        if not isinstance(message, dict):
            self._fail(_Malformed(f"JSON {type(message).__name__}, not an object"))
        elif "event" in message:
            self._event(message)
        elif not self.greeting.done():
            self.greeting.set_result(message)
        elif self.sync_id is not None and message.get("id") != self.sync_id:
            pass  # the reply to a command of the connection before ours (see _handshake)
        elif self.pending:
            self.sync_id = None
            future = self.pending.popleft()
            if future is not None and not future.done():
                future.set_result(message)
            if not self.pending and self.idle is not None and not self.idle.done():
                self.idle.set_result(None)

    def _event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if event not in ("STOP", "RESUME"):
            return
        self.running = event == "RESUME"
        stamp_us = _timestamp_us(message)
        self.run_events.append(RunEvent(self.running, stamp_us))
        stamp = None if stamp_us is None else stamp_us / 1e6
        self.run_event_count += 1
        if event == "STOP":
            self.stopped_at = stamp
        elif self.stopped_at is not None and stamp is not None:
            self.last_pause_s = max(stamp - self.stopped_at, 0.0)
            self.stopped_at = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or EOFError("QEMU closed the connection"))

    def _fail(self, error: Exception) -> None:
        if self.closed is None:  # the first failure says why; closing then adds an EOF
            self.closed = error
        for future in [self.greeting, *self.pending, self.idle]:
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
        #: When the last `stop` was sent (its last byte), by the host's real-time clock in
        #: microseconds, as QEMU stamps events: a STOP stamped before it is not ours.
        self.stop_sent_us: int | None = None
        #: Set when a command timed out (QEMU may still be busy with it) or QEMU sent a
        #: malformed line: the replies of this connection can no longer be trusted to come
        #: in time, or at all, so a VM we paused is resumed on a fresh one (target.pause).
        self.timed_out = False
        #: The pause marker of this socket once claimed (target.recovery), else None.
        self.marker: PauseMarker | None = None
        #: Set when the VM we paused could not be resumed: the marker flag must stay.
        self.resume_failed = False
        #: The event loop time by which the current tick must end (PauseHold's budget):
        #: no command is sent after it and none is waited for beyond it (TickOverrun).
        self.deadline: float | None = None
        #: Send one command at a time, never primed nor pipelined, and let a `stop` or
        #: `cont` return only with its STOP or RESUME event read (waited for up to
        #: RUN_EVENT_WAIT_S). Set when the socket's peer is not QEMU but a proxy
        #: (target/direct.py identify_qemu): virt-qemu-qmp-proxy parses each read as one
        #: command and stalls on two, and its events come from libvirt on another path
        #: than the replies, after them, where QEMU sends them before (target/pause.py
        #: relies on that order to tell its own pause).
        self.one_at_a_time = False
        #: one_at_a_time: (the state, the event count when sent) of a `stop` or `cont`
        #: whose run-state event is still to be read.
        self._awaited_event: tuple[bool, int] | None = None
        #: The QEMU process behind the socket, once checked (identify_qemu); `not_qemu`
        #: says why the socket's peer is not it, when it is not.
        self.qemu_pid: int | None = None
        self.not_qemu: str | None = None
        #: The greeting the other end sent (QEMU's, or a bridge's with more in it).
        self.greeting: dict[str, Any] = {}
        #: The command that resumes a VM this session left paused, when it is not
        #: `qmpprof resume --qmp-socket PATH` (through libvirt: any command on the domain).
        self.resume_hint: str | None = None

    @classmethod
    async def connect(cls, path: str, timeout: float = CONNECT_TIMEOUT_S) -> QmpSession:
        """Connect and negotiate capabilities within `timeout`. Raises ConnectionFailed."""
        _check_socket_path(path)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        sock = await _queued_socket(path, end, timeout)
        return await cls.over(sock, path, timeout, end)

    @classmethod
    async def over(
        cls, sock: socket.socket, path: str, timeout: float, end: float | None = None
    ) -> QmpSession:
        """A session on a connected socket `sock` (named `path` in messages and pause
        markers), capabilities negotiated by loop time `end` (default: `timeout` from
        now). The session owns the socket. Raises ConnectionFailed."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout if end is None else end
        try:
            _, protocol = await loop.create_unix_connection(_QmpProtocol, sock=sock)
        except OSError as err:
            sock.close()
            raise ConnectionFailed(path, _describe_os_error(err)) from err
        session = cls(protocol, path)
        try:
            await session._handshake(timeout, end)
        except BaseException:
            await session.close()
            raise
        return session

    async def _handshake(self, timeout: float, end: float) -> None:
        """The greeting by loop time `end` (`timeout` after connect() began), then the
        capabilities. QEMU greets a client only once it accepts it, and it serves one
        client at a time: a client queued behind another waits here for its turn."""
        try:
            async with asyncio.timeout_at(end):
                greeting = await self._protocol.greeting
        except TimeoutError as err:
            raise ConnectionFailed(
                self.path,
                f"no QMP greeting within {timeout:g} s (is another client connected?)",
            ) from err
        except (ValueError, OSError, EOFError) as err:
            raise ConnectionFailed(self.path, _NOT_QMP) from err
        if "QMP" not in greeting:
            raise ConnectionFailed(self.path, _NOT_QMP)
        self.greeting = greeting
        # QEMU finishes the command a closed connection had running and sends its reply
        # to whoever is connected next (a qmpprof killed mid-tick leaves one): replies
        # are matched in order, so this first command carries an id and every reply
        # before its own is dropped. Later commands carry none: each byte costs ~6 µs.
        self._protocol.sync_id = _session_id()
        try:
            await self.execute("qmp_capabilities", _capabilities(greeting), self._protocol.sync_id)
        except (CommandFailed, TargetGone, BadQmpMessage) as err:
            raise ConnectionFailed(self.path, f"capability negotiation failed ({err})") from err

    async def close(self) -> None:
        """Disconnect; never raises."""
        transport = self._protocol.transport
        if transport is not None:
            transport.close()
        await asyncio.sleep(0)

    async def execute(
        self,
        command: str,
        arguments: Mapping[str, object] | None = None,
        id: str | None = None,
    ) -> Any:
        """Run one QMP command and return its `return` value; `id` goes with it when given."""
        encoded = _request(command, arguments) if id is None else _encode(command, arguments, id)
        if self.one_at_a_time:
            return await self._execute_alone(command, encoded)
        (future,) = self._send((command, encoded))
        return await self._result(command, future)

    async def _execute_alone(self, command: str, encoded: bytes) -> Any:
        """`execute` through a proxy (one_at_a_time): after every reply still due, and a
        `stop` or `cont` back only with its run-state event read (see drain)."""
        await self._replies_in()
        if command in _RUN_STATE_COMMANDS:
            self._awaited_event = (command == "cont", self._protocol.run_event_count)
        (future,) = self._send((command, encoded))
        try:
            result = await self._result(command, future)
        except CommandFailed:
            if not self.timed_out:
                self._awaited_event = None  # refused: the run state did not change
            raise
        self.drain()
        return result

    async def _replies_in(self) -> None:
        """Wait for the replies still due: a command abandoned by a tick's budget may
        still be running behind the proxy, which must never be sent two at once."""
        protocol = self._protocol
        if not protocol.pending:
            return
        protocol.idle = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                await protocol.idle
        except TimeoutError as err:
            self.timed_out = True
            raise CommandFailed(
                "(the command before)", f"no answer within {COMMAND_TIMEOUT_S:g} s"
            ) from err
        except (OSError, EOFError, ValueError) as err:
            raise self._lost(err, "while a reply was due") from err
        finally:
            protocol.idle = None

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
        if encoded == self._primed or self._protocol.closed is not None or self.one_at_a_time:
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
            raise self._lost(self._protocol.closed, f"before {command!r}")
        transport.write(data)

    def _lost(self, error: Exception | None, when: str) -> QmpprofError:
        """What to raise for a connection that ended with `error`, `when` a command went."""
        if isinstance(error, _Malformed):
            self.timed_out = True
            return BadQmpMessage(f"QEMU's monitor sent a malformed line {when} ({error})")
        return TargetGone(f"QEMU closed the QMP connection {when}")

    def _send(self, *requests: tuple[str, bytes]) -> list[asyncio.Future[dict[str, Any]]]:
        """Send (command, encoded) requests in one write, completing a primed one; the
        futures of their replies, in order."""
        loop = asyncio.get_running_loop()
        if self.deadline is not None and loop.time() >= self.deadline:
            raise TickOverrun(f"the tick outlived its time budget before {requests[0][0]!r}")
        data = b"".join(self._unsent(encoded) for _, encoded in requests)
        if requests[0][0] == "stop":
            self.stop_sent_us = time.time_ns() // 1000  # before: QEMU cannot stop earlier
        self._write(data, requests[0][0])
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
            when = loop.time() + COMMAND_TIMEOUT_S
            if self.deadline is not None and self.deadline < when:
                overrun = TickOverrun(f"the tick outlived its time budget in {command!r}")
                timer = loop.call_at(self.deadline, _expire, future, overrun)
            else:
                timer = loop.call_at(when, _expire, future, TimeoutError())
        try:
            return await future
        except TimeoutError as err:
            self.timed_out = True
            raise CommandFailed(command, f"no answer within {COMMAND_TIMEOUT_S:g} s") from err
        except (OSError, EOFError, ValueError) as err:
            raise self._lost(err, f"during {command!r}") from err
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
        if first is not None and self.one_at_a_time:
            await self.execute(first)
            return await self.hmp(command_line, cpu)
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
        them too), read up to now, so a tick needs no `query-status` round trip.
        Raises TargetGone once QEMU has closed the connection: the last event read may
        say paused (a VM someone else paused, then shut down), which must not pass for
        a VM still there whose ticks are skipped."""
        self.drain()
        if self._protocol.closed is not None:
            raise self._lost(self._protocol.closed, "before the tick")
        if self._protocol.running is None:
            status = await self.execute("query-status")
            if self._protocol.running is None:  # no event since, which would be newer
                self._protocol.running = bool(status["running"])
        return self._protocol.running

    def drain(self) -> None:
        """Read what QEMU has sent already (events), without waiting; through a proxy
        (one_at_a_time), once the reply of a `stop` or `cont` is in, also wait for the
        STOP or RESUME event it raised, as QEMU would have sent it before that reply.
        A `stop` of a paused VM raises none: that wait ends after RUN_EVENT_WAIT_S."""
        self._protocol.drain()
        if self._awaited_event is not None and not self._protocol.pending:
            running, mark = self._awaited_event
            self._awaited_event = None
            self._protocol.await_run_event(running, mark, RUN_EVENT_WAIT_S)

    @property
    def run_event_count(self) -> int:
        """How many STOP and RESUME events came so far: a mark for `run_events_since`."""
        return self._protocol.run_event_count

    def run_events_since(self, mark: int) -> list[RunEvent] | None:
        """The STOP and RESUME events read since `run_event_count` was `mark`; None when
        more came than are kept (then nobody can say what happened)."""
        count = self._protocol.run_event_count - mark
        kept = self._protocol.run_events
        if count > len(kept):
            return None
        return [kept[i] for i in range(len(kept) - count, len(kept))]  # count is 1 or 2

    def cancel_primed(self) -> None:
        """Cancel a primed command now (QmpSession.prime), so that it can never run."""
        if self._primed is not None and self._protocol.closed is None:
            self._write(self._cancel_primed(), "cancel")

    def take_last_pause(self) -> float | None:
        """How long the last pause lasted by QEMU's own clock (its STOP and RESUME events'
        timestamps), once: None if no pause ended since the last call."""
        pause, self._protocol.last_pause_s = self._protocol.last_pause_s, None
        return pause

    async def stop(self) -> None:
        await self.execute("stop")

    async def cont(self) -> None:
        await self.execute("cont")


def _capabilities(greeting: dict[str, Any]) -> dict[str, object] | None:
    """qmp_capabilities' arguments: out-of-band execution when QEMU offers it. We send
    no out-of-band command; what it changes is who reads our input: QEMU's monitor
    thread, all of it at once, instead of the main loop a byte per turn that waits while
    a command runs. So the register request sent with `stop` is read while `stop` runs,
    and the VM's pause per stop-mode sample is ~0.6 ms shorter (bench/linux_sample_cost.py).
    Commands still run one at a time, in order, and replies keep that order."""
    offered = greeting["QMP"].get("capabilities") if isinstance(greeting["QMP"], dict) else None
    return {"enable": ["oob"]} if isinstance(offered, list) and "oob" in offered else None


_NOT_QMP = "not a QMP socket (the other end did not greet like QEMU)"
#: A command's closing brace: what `execute` sends of a primed command.
_LAST_BYTES = 1
#: Ends a primed command with a member QEMU refuses before it looks at the command
#: ("QMP input member '...' is unexpected"): the command is answered with an error, not run.
_CANCEL = b',"qmpprof-cancelled":true}'


def _timestamp_us(message: dict[str, Any]) -> int | None:
    """An event's `timestamp` in microseconds, or None if it has none that makes sense."""
    stamp = message.get("timestamp")
    if not isinstance(stamp, dict):
        return None
    seconds, microseconds = stamp.get("seconds"), stamp.get("microseconds")
    if not isinstance(seconds, int) or not isinstance(microseconds, int):
        return None
    return seconds * 1_000_000 + microseconds


def _expire(future: asyncio.Future[dict[str, Any]], error: Exception) -> None:
    if not future.done():  # its reply, if it ever comes, is skipped (the future is done)
        future.set_exception(error)


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


def _encode(command: str, arguments: Mapping[str, object] | None, id: str | None = None) -> bytes:
    """One QMP command on the wire, compact and with no newline after it: QEMU reads it
    a byte at a time, and with a newline after each command the pipelined stop-mode
    tick measured a longer tail (p90 2.7-3.3 ms against 1.4-1.5 ms without, A/B)."""
    message: dict[str, object] = {"execute": command}
    if arguments:
        message["arguments"] = dict(arguments)
    if id is not None:
        message["id"] = id
    return json.dumps(message, separators=(",", ":")).encode()


def _session_id() -> str:
    """An id no other session sends (pid and clock), always 29 characters long."""
    return f"qmpprof-{os.getpid() % 10**7:07d}-{time.monotonic_ns() % 10**12:012d}"


async def _queued_socket(path: str, end: float, timeout: float) -> socket.socket:
    """A unix socket connected to `path`: in QEMU's queue of clients waiting for their
    turn, if not served at once. QEMU 7.2 listens with a backlog of 1, so while one
    client holds the monitor two more may wait and a fourth is refused with EAGAIN (a
    Proxmox VM's socket, used by its tools command by command, frees up within
    milliseconds): try again until loop time `end` (`timeout` after the first try).
    Raises ConnectionFailed."""
    loop = asyncio.get_running_loop()
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            sock.connect(path)  # a unix connect is done at once, or refused at once
            return sock
        except BlockingIOError:
            sock.close()
            if loop.time() >= end:
                raise ConnectionFailed(path, _QUEUE_FULL.format(timeout=timeout)) from None
            await asyncio.sleep(_QUEUE_RETRY_S)
        except OSError as err:
            sock.close()
            raise ConnectionFailed(path, _describe_os_error(err)) from err


_QUEUE_FULL = (
    "QEMU's monitor is busy: another client holds it and its queue of waiting clients "
    "stayed full for {timeout:g} s"
)
#: How often a full queue is tried again (a Proxmox tool's command takes milliseconds).
_QUEUE_RETRY_S = 0.02


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
