"""--libvirt on a system-mode libvirtd: libvirt's virt-qemu-qmp-proxy against qmpprof's
bridge over libvirt's Python binding (target/libvirt_bridge.py), then whole recordings.

Starts virtlogd and libvirtd as root (tests/libvirt_system.py) and boots the Linux
example guest as a one-vCPU TCG domain, unless --domain NAME names one of a system
libvirtd already running. For each path, --runs times:
  greeting_s  from starting the proxy or bridge to the QMP greeting read (what a
              qmpprof run waits before its first command)
  trip_ms     the median `query-status` round trip over 50 (the cost of each command
              a tick sends through libvirt)
  drops       libvirtd's log lines `End of file while reading data` the path left
              (only where the bench started libvirtd: its log is ours; the bridge
              first, so that none of the proxy's lands in its count)
Then `qmpprof --libvirt NAME --duration 10` as a user runs it: the default (chosen by
the round trip), `--stop`, and with --own also `--stop` on a second domain that has its
own QMP socket (`<qemu:commandline>`), the same on that socket with libvirtd held
stopped (SIGSTOP; only a libvirtd the bench started), beside the Linux guest booted by
boot.sh on plain QEMU with one vCPU: wall seconds, ticks, the VM's paused share by
QEMU's clock (the summary's), and the CPU seconds libvirtd used meanwhile (QEMU sends
it every STOP and RESUME event). Numbers are printed side by side, never judged; the
last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qmpprof.errors import ConnectionFailed
from qmpprof.target.libvirt import bridged
from qmpprof.target.qmp import QmpSession
from tests.libvirt_system import LinuxDomain, linux_domain, missing, system_libvirtd
from tests.libvirt_vm import Libvirt
from tests.linux_vm import running_linux

URI = "qemu:///system"
TRIPS = 50
DROPPED = "End of file while reading data"
PAUSED = re.compile(r"(\d+) ticks .* in ([\d.]+) s, .*VM paused by qmpprof (\d+) ms \(([\d.]+)%\)")


async def _trips(session: QmpSession) -> float:
    times = []
    for _ in range(TRIPS):
        began = time.perf_counter()
        await session.execute("query-status")
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


async def through_proxy(domain: str, scratch: Path) -> tuple[float, float]:
    path = scratch / "proxy.qmp"
    script = str(shutil.which("virt-qemu-qmp-proxy"))
    began = time.perf_counter()
    proxy = subprocess.Popen(["/usr/bin/python3", script, "-c", URI, domain, str(path)])
    try:
        session = await _connect_when_listening(path, proxy)
        greeting = time.perf_counter() - began
        trip = await _trips(session)
        await session.close()
    finally:
        proxy.terminate()
        proxy.wait()
    return greeting, trip


async def _connect_when_listening(path: Path, proxy: subprocess.Popen[bytes]) -> QmpSession:
    """The proxy binds its socket before it listens: connect once it does."""
    while True:
        if proxy.poll() is not None:
            raise RuntimeError(f"virt-qemu-qmp-proxy exited ({proxy.returncode})")
        try:
            return await QmpSession.connect(str(path), timeout=120)
        except ConnectionFailed:
            await asyncio.sleep(0.01)


async def through_bridge(domain: str) -> tuple[float, float]:
    began = time.perf_counter()
    async with bridged(domain, URI, 120) as sock:
        session = await QmpSession.over(sock, "bridge", 120)
        greeting = time.perf_counter() - began
        trip = await _trips(session)
        await session.close()
    return greeting, trip


def _log_drops(libvirt: Libvirt | None) -> int | None:
    log = libvirt.root / "libvirtd.log" if libvirt else None
    return log.read_text(errors="replace").count(DROPPED) if log and log.exists() else None


def compare_paths(domain: str, runs: int, libvirt: Libvirt | None) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as scratch:
        for name in ("bridge", "proxy"):
            greetings, trips = [], []
            before = _log_drops(libvirt)
            for _ in range(runs):
                if name == "proxy":
                    greeting, trip = asyncio.run(through_proxy(domain, Path(scratch)))
                else:
                    greeting, trip = asyncio.run(through_bridge(domain))
                greetings.append(greeting)
                trips.append(trip)
            # A round trip through libvirtd's event loop, which reads the end of file of
            # a connection dropped before it, before the log is counted.
            subprocess.run(["virsh", "-c", URI, "uri"], capture_output=True, check=False)
            after = _log_drops(libvirt)
            results[name] = {
                "greeting_s": statistics.median(greetings),
                "trip_ms": statistics.median(trips),
                "drops": float("nan") if before is None or after is None else after - before,
            }
    return results


def cpu_seconds(pid: int | None) -> float:
    """User and system CPU time of process `pid` so far (nan without one)."""
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def record(*target: str, daemon: int | None = None) -> dict[str, float]:
    """One 10 s recording as a user runs it: wall seconds, ticks, paused share, and the
    CPU seconds process `daemon` (libvirtd) used meanwhile."""
    used = cpu_seconds(daemon)
    with tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as scratch:
        out = Path(scratch) / "p.folded"
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "qmpprof", *target, "--duration", "10", "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        wall = time.perf_counter() - began
    found = PAUSED.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"qmpprof {' '.join(target)}: {done.stderr.strip()}")
    return {
        "wall_s": wall,
        "ticks": float(found.group(1)),
        "paused_ms": float(found.group(3)),
        "paused_pct": float(found.group(4)),
        "nonblocking": float("sampling nonblocking" in done.stderr),
        "libvirtd_cpu_s": cpu_seconds(daemon) - used,
    }


@contextmanager
def target_domain(args: argparse.Namespace) -> Iterator[tuple[str, Libvirt | None, ExitStack]]:
    with ExitStack() as stack:
        if args.domain:
            yield args.domain, None, stack
            return
        why = missing()
        if why is not None:
            raise SystemExit(f"libvirt_paths: {why}")
        libvirt = stack.enter_context(system_libvirtd())
        domain = stack.enter_context(linux_domain(libvirt, "qmpprof-bench"))
        yield domain.name, libvirt, stack


def held_stopped(daemon: int, own: LinuxDomain) -> dict[str, float]:
    """`--stop` on the domain's own socket (given as --qmp-socket: the bridge would need
    libvirtd) while libvirtd is held stopped, so that it does no work on QEMU's events."""
    target = ["--qmp-socket", str(own.own_monitor), "--pid", str(own.qemu_pid()), "--stop"]
    os.kill(daemon, signal.SIGSTOP)
    try:
        return record(*target)
    finally:
        os.kill(daemon, signal.SIGCONT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domain", help="a domain of the running system libvirtd")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--own", action="store_true", help="also a domain with its own socket")
    args = parser.parse_args()
    report: dict[str, object] = {}
    with target_domain(args) as (domain, libvirt, _):
        paths = compare_paths(domain, args.runs, libvirt)
        report["paths"] = paths
        print(f"{'path':8} {'greeting_s':>10} {'trip_ms':>8} {'log drops':>9}")
        for name, row in paths.items():
            print(f"{name:8} {row['greeting_s']:10.2f} {row['trip_ms']:8.2f} {row['drops']:9.0f}")
        lib = ["--libvirt", domain, "--libvirt-uri", URI]
        daemon = libvirt.pid if libvirt is not None else None
        runs = {
            "libvirt default": record(*lib, daemon=daemon),
            "libvirt --stop": record(*lib, "--stop", daemon=daemon),
        }
        if args.own and libvirt is not None:
            libvirt.virsh("suspend", domain)
            try:
                with linux_domain(libvirt, "qmpprof-bench-own", own_monitor=True) as own:
                    own_args = ["--libvirt", own.name, "--libvirt-uri", URI, "--stop"]
                    runs["own socket --stop"] = record(*own_args, daemon=daemon)
                    runs["own, libvirtd held"] = held_stopped(libvirt.pid, own)
                with (
                    tempfile.TemporaryDirectory() as work,
                    running_linux(Path(work), "--smp", "1") as plain,
                ):
                    runs["plain QEMU --stop"] = record("--qmp-socket", plain.qmp, "--stop")
            finally:
                libvirt.virsh("resume", domain)
    report["recordings"] = runs
    print(
        f"\n{'10 s recording':20} {'wall_s':>7} {'ticks':>6} {'paused_ms':>9} {'paused %':>8}"
        f" {'libvirtd_cpu_s':>14}"
    )
    for name, row in runs.items():
        print(
            f"{name:20} {row['wall_s']:7.1f} {row['ticks']:6.0f} {row['paused_ms']:9.0f} "
            f"{row['paused_pct']:8.2f} {row['libvirtd_cpu_s']:14.2f}"
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
