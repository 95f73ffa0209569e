"""A fake QMP server that replays an exchange recorded from a real QEMU, byte for byte.

The recordings are tests/unit/data/qmp/*.jsonl, written by record.py beside them. The
server sends QEMU's chunks as QEMU sent them and checks that the client sends exactly
the bytes qmpprof sent when it was recorded, in the same order.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

RECORDINGS = Path(__file__).parent / "data" / "qmp"

#: (who sent it: "client" or "qemu", the bytes)
Chunk = tuple[str, bytes]


def recorded(name: str) -> list[Chunk]:
    lines = (RECORDINGS / f"{name}.jsonl").read_text().splitlines()
    return [(entry["from"], entry["bytes"].encode()) for entry in map(json.loads, lines)]


def until(chunks: list[Chunk], marker: bytes) -> list[Chunk]:
    """The chunks before the first one holding `marker`."""
    index = next(i for i, (_, data) in enumerate(chunks) if marker in data)
    return chunks[:index]


@dataclass
class Replay:
    """What the fake server does with one connection, and what it saw."""

    chunks: list[Chunk]
    #: After the last chunk: hang up (QEMU gone) instead of waiting for the client to.
    hang_up: bool = False
    #: Client bytes that differ from the recording (empty when qmpprof spoke as recorded).
    mismatches: list[str] = field(default_factory=list)
    #: Whether the client closed before sending every recorded byte.
    client_left_early: bool = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._play(reader, writer)
            if not self.hang_up:
                await reader.read()  # until the client closes
        except asyncio.CancelledError:
            pass  # the test's event loop ended first: nothing more to replay
        finally:
            writer.close()

    async def _play(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ids: dict[bytes, bytes] = {}  # recorded handshake id -> this client's
        for number, (who, data) in enumerate(self.chunks):
            if who == "qemu":
                for recorded_id, client_id in ids.items():
                    data = data.replace(recorded_id, client_id)
                writer.write(data)
                await writer.drain()
                continue
            try:
                got = await reader.readexactly(len(data))
            except asyncio.IncompleteReadError:
                self.client_left_early = True
                return
            if not _same_but_for_id(got, data, ids):
                self.mismatches.append(f"chunk {number}: sent {got!r}, recorded {data!r}")
                return


#: The handshake's id: unique to each qmpprof session (its pid and a clock), so a
#: replayed client sends another one of the same length than the recording holds.
_SESSION_ID = re.compile(rb'"id":"(qmpprof-[0-9]+-[0-9]+)"')


def _same_but_for_id(got: bytes, recorded: bytes, ids: dict[bytes, bytes]) -> bool:
    """Whether the client sent the recorded bytes, its session id aside (noted in `ids`)."""
    mine, theirs = _SESSION_ID.search(got), _SESSION_ID.search(recorded)
    if mine and theirs and _SESSION_ID.sub(b"", got) == _SESSION_ID.sub(b"", recorded):
        ids[theirs.group(1)] = mine.group(1)
        return True
    return got == recorded


async def serve(path: Path, replay: Replay) -> asyncio.Server:
    """Listen at `path`; each connection is served `replay`."""
    return await asyncio.start_unix_server(replay.serve, str(path))
