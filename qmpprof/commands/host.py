"""`record --host`: perf on the QEMU process for the recording's interval, and the one
profile that merges its host stacks with the guest's (qmpprof/host/merge.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from qmpprof.errors import HostProfileFailed, QmpprofError
from qmpprof.host.merge import HostSplit, QemuThreads, merge
from qmpprof.model import Sample
from qmpprof.record.host_perf import HostRecorder, find_perf
from qmpprof.target.direct import process_name, qemu_pid
from qmpprof.target.qmp import QmpSession


@dataclass(frozen=True)
class HostOptions:
    #: perf's samples per second of CPU time, per thread (cli.py's default: 250).
    rate_hz: float


@dataclass
class HostRun:
    """A perf recording under way, and what it needs to be merged afterwards."""

    recorder: HostRecorder
    threads: QemuThreads
    period_ns: int
    #: The vCPU threads' CPU time by the kernel's own account when perf began counting.
    started_on_cpu_ns: int | None = None

    async def merged(
        self, guest: Sequence[Sample], guest_period_s: float
    ) -> tuple[list[Sample], HostSplit]:
        """Stop perf and merge what it recorded with `guest`. Raises HostProfileFailed."""
        ended_on_cpu_ns = on_cpu_ns(self.threads)
        await self.recorder.stop()
        host = await self.recorder.samples()
        within = max(2 * guest_period_s, 2 * self.period_ns / 1e9)
        merged, split = merge(host, self.threads, guest, self.recorder.offset_s, within)
        if self.started_on_cpu_ns is not None and ended_on_cpu_ns is not None:
            split.scheduled_ns = ended_on_cpu_ns - self.started_on_cpu_ns
        return merged, split


@contextlib.asynccontextmanager
async def host_recording(session: QmpSession, options: HostOptions) -> AsyncIterator[HostRun]:
    """perf recording QEMU's process from entry until the caller merges; its files are
    removed on the way out. Raises HostProfileFailed (perf missing or refused)."""
    period_ns = max(1, round(1e9 / options.rate_hz))
    command = find_perf(period_ns)
    threads = await qemu_threads(session)
    recorder = HostRecorder(command, threads.pid)
    try:
        await recorder.start()
        yield HostRun(recorder, threads, period_ns, on_cpu_ns(threads))
    finally:
        recorder.close()


async def qemu_threads(session: QmpSession) -> QemuThreads:
    """QEMU's pid, its name, and each vCPU thread (`query-cpus-fast`'s thread-id)."""
    try:
        pid = qemu_pid(session)
    except QmpprofError as err:  # no peer process to ask
        raise HostProfileFailed(f"cannot tell QEMU's process id: {err}") from err
    vcpus: dict[int, tuple[int, ...]] = {}
    for cpu in await session.execute("query-cpus-fast"):
        thread, index = cpu.get("thread-id"), cpu.get("cpu-index")
        if isinstance(thread, int) and isinstance(index, int):
            vcpus[thread] = (*vcpus.get(thread, ()), index)
    return QemuThreads(pid, process_name(pid), vcpus)


def on_cpu_ns(threads: QemuThreads) -> int | None:
    """The vCPU threads' time on a host CPU so far (schedstat's first field), to check
    perf's share against; None where the kernel does not say."""
    total = 0
    for tid in threads.vcpus:
        try:
            text = Path(f"/proc/{threads.pid}/task/{tid}/schedstat").read_text()
            total += int(text.split()[0])
        except (OSError, ValueError, IndexError):
            return None
    return total
