"""Every memory backend gives the same stacks on the same paused VM."""

from __future__ import annotations

import json

from tests.integration.conftest import Guest, run_qmpprof


def dump(guest: Guest, memory: str) -> object:
    done = run_qmpprof(
        "dump",
        "--json",
        "--qmp-socket",
        guest.qmp,
        "--kernel",
        str(guest.kernel),
        "--memory",
        memory,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_hmp_memsave_and_direct_agree(guest: Guest) -> None:
    guest.qmp_call("stop")
    try:
        dumps = {memory: dump(guest, memory) for memory in ("hmp", "memsave", "direct")}
    finally:
        guest.qmp_call("cont")
    assert dumps["hmp"] == dumps["memsave"] == dumps["direct"]
    frames = dumps["direct"]["vcpus"][0]["frames"]  # type: ignore[index]
    assert len(frames) >= 4
