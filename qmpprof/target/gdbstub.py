"""System registers that QEMU's register dump lacks, read once from its gdbstub.

An AArch64 vCPU's page-table roots (TTBR0_EL1, TTBR1_EL1) and translation control
(TCR_EL1) are not in `info registers`; QEMU's gdbstub serves them (its
system-register feature). A gdbstub serves one client and stops the VM while a client
is attached, so this module uses it only where that disturbs nobody:

- the VM must be running (detaching resumes it: a pause someone else made would be
  undone), and it is running again when this returns;
- a stub a debugger is attached to is left alone; one configured with no client (`-gdb
  unix:PATH`) is borrowed and left as it was; with none, one is started on a private
  socket (HMP `gdbserver`) and removed after (`gdbserver none`).

The GDB remote protocol is spoken here in its smallest form: qSupported, the target
description (qXfer:features:read) for the registers' numbers, the thread (vCPU) list,
`Hg` and `p` per register, `D`. Every reply is bounded and every wait has a deadline;
what the stub says is guest-controlled data, checked before use. Where a debugger
negotiated multiprocess with this QEMU before, `D` is refused (E22) and leaves the VM
paused: the VM is resumed over QMP then, as it was running. A user whose GDB connects
during the few milliseconds the stub is ours waits that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import Iterable

from qmpprof.errors import CommandFailed, DirectMemoryUnavailable
from qmpprof.target.qmp import QmpSession

#: The most bytes one reply may have, and the target description in all.
MAX_PACKET = 1 << 16
MAX_DESCRIPTION = 1 << 20
MAX_THREADS = 4096
#: Replies a question may take: stop replies sent meanwhile, pieces of a description.
MAX_REPLIES = 256
#: Seconds one exchange with the stub may take.
TIMEOUT_S = 5.0
_REG = re.compile(rb'<reg\s[^>]*?name="([^"]{1,64})"[^>]*>')
_REGNUM = re.compile(rb'regnum="(\d{1,6})"')
_INCLUDE = re.compile(rb'<xi:include\s+href="([A-Za-z0-9_.-]{1,64})"')


class _Unavailable(Exception):
    """Why the stub could not be used (one line)."""


class _Stub:
    """One connection to a gdbstub, packet by packet."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def ask(self, payload: bytes) -> bytes:
        checksum = sum(payload) & 0xFF
        self._writer.write(b"$" + payload + b"#%02x" % checksum)
        await self._writer.drain()
        return await asyncio.wait_for(self._reply(), TIMEOUT_S)

    async def _reply(self) -> bytes:
        """The next packet, acknowledged; stop replies sent meanwhile ('T..') skipped
        only where the caller expects another answer is up to it."""
        while True:
            start = await self._reader.readexactly(1)
            if start in (b"+", b"-"):
                continue
            if start != b"$":
                continue
            body = bytearray()
            while (byte := await self._reader.readexactly(1)) != b"#":
                body += byte
                if len(body) > MAX_PACKET:
                    raise _Unavailable("a gdbstub reply too long")
            await self._reader.readexactly(2)  # the checksum: the socket is reliable
            self._writer.write(b"+")
            return bytes(body)

    async def answer(self, payload: bytes) -> bytes:
        """The reply to `payload`, past any stop reply the stub sent on its own."""
        reply = await self.ask(payload)
        for _ in range(MAX_REPLIES):
            if not reply.startswith((b"T", b"S")):
                return reply
            reply = await asyncio.wait_for(self._reply(), TIMEOUT_S)
        raise _Unavailable("QEMU's gdbstub sends only stop replies")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.write(b"$D#44")
            await self._writer.drain()
            await asyncio.wait_for(self._reply(), TIMEOUT_S)
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


async def read_system_registers(
    session: QmpSession, names: Iterable[str]
) -> dict[int, dict[str, int]]:
    """{vCPU index: {register: value}} for `names` (as QEMU's target description names
    them: TTBR0_EL1...), read through the gdbstub. Raises DirectMemoryUnavailable with
    the reason where that cannot be done without disturbing the VM or a debugger."""
    status = await session.execute("query-status")
    if not isinstance(status, dict) or status.get("status") != "running":
        raise DirectMemoryUnavailable("the VM is not running, and QEMU's gdbstub would resume it")
    path, own = await _stub_path(session)
    try:
        return await _read(path, tuple(names))
    except (TimeoutError, OSError, EOFError, asyncio.IncompleteReadError) as err:
        raise DirectMemoryUnavailable(f"QEMU's gdbstub: {type(err).__name__}") from err
    except _Unavailable as err:
        raise DirectMemoryUnavailable(str(err)) from err
    finally:
        await _restore(session, path, own)


async def _stub_path(session: QmpSession) -> tuple[str, bool]:
    """The unix socket of a stub to use, and whether it is ours (started here)."""
    chardevs = await session.execute("query-chardev")
    for chardev in chardevs if isinstance(chardevs, list) else []:
        if not isinstance(chardev, dict) or chardev.get("label") != "gdb":
            continue
        filename = str(chardev.get("filename", ""))
        if not filename.startswith("disconnected:"):
            raise DirectMemoryUnavailable("a debugger is attached to QEMU's gdbstub")
        found = re.fullmatch(r"disconnected:unix:([^,]{1,4096})(?:,.*)?", filename)
        if found is None:
            raise DirectMemoryUnavailable(f"QEMU's gdbstub is not on a unix socket ({filename})")
        return found.group(1), False
    path = os.path.join(tempfile.mkdtemp(prefix="qmpprof-gdb-"), "gdb.sock")
    await session.hmp(f"gdbserver unix:{path},server=on,wait=off")
    return path, True


async def _read(path: str, names: tuple[str, ...]) -> dict[int, dict[str, int]]:
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), TIMEOUT_S)
    stub = _Stub(reader, writer)
    try:
        await stub.answer(b"qSupported:xmlRegisters=aarch64")
        numbers = await _register_numbers(stub)
        missing = [name for name in names if name not in numbers]
        if missing:
            raise _Unavailable(f"QEMU's gdbstub has no {', '.join(missing)}")
        values: dict[int, dict[str, int]] = {}
        for vcpu, thread in enumerate(await _threads(stub)):
            if await stub.answer(b"Hg" + thread) != b"OK":
                raise _Unavailable("QEMU's gdbstub refused a vCPU")
            values[vcpu] = {name: await _register(stub, numbers[name]) for name in names}
        return values
    finally:
        await stub.close()


async def _register_numbers(stub: _Stub) -> dict[str, int]:
    """Each register's number, from the target description and the files it includes."""
    target = await _description(stub, b"target.xml")
    numbers: dict[str, int] = {}
    number = 0
    for document in [target, *[await _description(stub, name) for name in _includes(target)]]:
        for found in _REG.finditer(document):
            explicit = _REGNUM.search(found.group(0))
            number = int(explicit.group(1)) if explicit else number
            numbers[found.group(1).decode("ascii", "replace")] = number
            number += 1
    return numbers


def _includes(document: bytes) -> list[bytes]:
    return [found.group(1) for found in _INCLUDE.finditer(document)][:16]


async def _description(stub: _Stub, name: bytes) -> bytes:
    data = bytearray()
    for _ in range(MAX_REPLIES):
        reply = await stub.answer(b"qXfer:features:read:%s:%x,%x" % (name, len(data), 0xFFF))
        if not reply or reply[:1] not in (b"m", b"l") or (reply[:1] == b"m" and len(reply) < 2):
            raise _Unavailable(f"QEMU's gdbstub has no {name.decode('ascii', 'replace')}")
        data += reply[1:]
        if reply[:1] == b"l":
            return bytes(data)
        if len(data) > MAX_DESCRIPTION:
            break
    raise _Unavailable("QEMU's target description too long")


async def _threads(stub: _Stub) -> list[bytes]:
    threads: list[bytes] = []
    reply = await stub.answer(b"qfThreadInfo")
    for _ in range(MAX_REPLIES):
        if not reply.startswith(b"m") or len(threads) >= MAX_THREADS:
            break
        threads += [t for t in reply[1:].split(b",") if re.fullmatch(rb"[0-9a-fp.-]{1,32}", t)]
        reply = await stub.answer(b"qsThreadInfo")
    if not threads:
        raise _Unavailable("QEMU's gdbstub lists no vCPU")
    return threads


async def _register(stub: _Stub, number: int) -> int:
    reply = await stub.answer(b"p%x" % number)
    if not re.fullmatch(rb"(?:[0-9a-f]{2}){1,16}", reply):
        raise _Unavailable(f"QEMU's gdbstub gave no register {number}")
    return int.from_bytes(bytes.fromhex(reply.decode()), "little")


async def _restore(session: QmpSession, path: str, own: bool) -> None:
    """The stub as it was (ours removed), and the VM running: connecting stopped it and
    it was running before (read_system_registers checked)."""
    with contextlib.suppress(CommandFailed):
        if own:
            await session.hmp("gdbserver none")
        status = await session.execute("query-status")
        if isinstance(status, dict) and status.get("status") != "running":
            await session.execute("cont")
    if own:
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
