"""Hostile gdbstub replies: whatever comes back on the socket, reading registers ends in
one of target/gdbstub.py's refusals (or the stream's end), bounded, never another error."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.target import gdbstub
from tests.fuzz.budget import cases, counted

#: Bytes of real replies (packets, stop replies, target descriptions, register values).
LOOKALIKE = b'$#+-OKTmlE0123456789abcdef<reg name="TTBR1_EL1" regnum="175"/>xi:include href=""'
REPLIES = (
    b"$PacketSize=1000;qXfer:features:read+#00",
    b'$l<target><xi:include href="system-registers.xml"/></target>#00',
    b'$l<feature><reg name="TTBR1_EL1" bitsize="64" regnum="175"/></feature>#00',
    b"$m1,2#00$l#00",
    b"$OK#00",
    b"$0010214000000000#00",
    b"$T02thread:01;#00",
)


class _Sink:
    """A writer that takes everything (the stub's side is what is fuzzed)."""

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


async def _read_over(stream: bytes) -> None:
    reader = asyncio.StreamReader(limit=1 << 20)
    reader.feed_data(stream)
    reader.feed_eof()
    stub = gdbstub._Stub(reader, _Sink())  # type: ignore[arg-type]
    numbers = await gdbstub._register_numbers(stub)
    assert all(0 <= number < 1 << 20 for number in numbers.values())
    for thread in await gdbstub._threads(stub):
        assert len(thread) <= 32
        await stub.answer(b"Hg" + thread)
        assert 0 <= await gdbstub._register(stub, 175) < 1 << 128


@settings(max_examples=cases(300), deadline=None)
@given(
    stream=st.lists(st.sampled_from(REPLIES) | st.binary(max_size=64), max_size=24).map(b"".join)
    | st.builds(lambda body: b"$" + body + b"#00", st.binary(max_size=3000))
    | st.lists(st.sampled_from(list(LOOKALIKE)), max_size=400).map(bytes)
    | st.integers(1, 600).map(lambda n: b"$m#00" * n)  # a reply that never ends
)
@counted
def test_any_reply_is_refused_or_read(stream: bytes) -> None:
    with contextlib.suppress(gdbstub._Unavailable, asyncio.IncompleteReadError, TimeoutError):
        asyncio.run(_read_over(stream))
