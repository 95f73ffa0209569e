"""QmpSession against a real QEMU that does not answer: a command fails after the
timeout instead of waiting forever."""

from __future__ import annotations

import pytest

import qmpprof.target.qmp as qmp
from qmpprof.errors import CommandFailed
from qmpprof.target.qmp import QmpSession
from tests.integration.conftest import Guest


async def test_a_command_qemu_never_answers_fails_after_the_timeout(
    guest: Guest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qmp, "COMMAND_TIMEOUT_S", 0.5)
    session = await QmpSession.connect(guest.qmp)
    try:
        # An unclosed JSON array: QEMU's parser waits for its end before it runs anything.
        transport = session._protocol.transport
        assert transport is not None
        transport.write(b"[")
        with pytest.raises(CommandFailed, match=r"no answer within 0\.5 s"):
            await session.execute("query-status")
    finally:
        await session.close()
