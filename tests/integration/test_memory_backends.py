"""Every memory backend gives the same stacks on the same paused VM."""

from __future__ import annotations

from tests.integration.conftest import Guest, dump_json


def test_hmp_memsave_and_direct_agree(guest: Guest) -> None:
    guest.qmp_call("stop")
    try:
        dumps = {
            memory: dump_json(guest, "--memory", memory) for memory in ("hmp", "memsave", "direct")
        }
    finally:
        guest.qmp_call("cont")
    assert dumps["hmp"] == dumps["memsave"] == dumps["direct"]
    frames = dumps["direct"][0]["frames"]
    assert len(frames) >= 4
