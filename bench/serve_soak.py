"""Soak of `qmpprof serve`: many scrapes over a long time, and what its memory does.

Boots two example guests, starts `qmpprof serve` on both, and scrapes them in turn
(--scrapes over --minutes, each `?seconds=--seconds`, started on a fixed schedule) with
Python's http.client, as a scraper would. Every answer must be a 200 with a pprof whose
samples carry the VM's label. The server's resident memory (VmRSS) is read before the
first scrape, after the first scrape of each VM (`start`: what a scrape's imports and
caches settle at) and after the last (`end`); growth is end against start. Issue 26's
acceptance: 200 scrapes over 20 minutes, growth under 10 %. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.guest_vm import running_guest
from tests.integration.test_serve import Serve, samples_by_label, serving


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seconds", type=int, default=5, help="each scrape's ?seconds=")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    interval = args.minutes * 60 / args.scrapes
    if interval < args.seconds:
        parser.error(f"{args.scrapes} scrapes of {args.seconds} s do not fit {args.minutes} min")
    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-soak-a-") as first,
        tempfile.TemporaryDirectory(prefix="qmpprof-soak-b-") as second,
        running_guest(Path(first), "--accel", args.accel) as a,
        running_guest(Path(second), "--accel", args.accel) as b,
        serving({"a": a.qmp, "b": b.qmp}, a.kernel) as serve,
    ):
        result = soak(serve, args.scrapes, interval, args.seconds)
    print(json.dumps(result))
    return 0 if result["failed"] == 0 and result["growth_pct"] < 10 else 1


VMS = ("a", "b")


def soak(serve: Serve, scrapes: int, interval: float, seconds: int) -> dict[str, float]:
    """Scrape the VMs in turn, one scrape every `interval` seconds."""
    before = serve.rss_kib()
    start_rss = peak = 0
    failed = 0
    began = time.monotonic()
    for i in range(scrapes):
        _wait_until(began + i * interval)
        vm = VMS[i % len(VMS)]
        status, _, body = serve.get(f"/vm/{vm}/debug/pprof/profile?seconds={seconds}")
        if status != 200 or samples_by_label(body, "vm").get(vm, 0) == 0:
            failed += 1
            print(f"scrape {i + 1}: {status} {body[:200]!r}", flush=True)
        rss = serve.rss_kib()
        if i == len(VMS) - 1:  # each VM scraped once: imports and caches settled
            start_rss = rss
        peak = max(peak, rss)
        if (i + 1) % 20 == 0 or i == 0:
            print(f"scrape {i + 1}/{scrapes}: RSS {rss / 1024:.1f} MiB", flush=True)
    end = serve.rss_kib()
    growth = 100 * (end - start_rss) / start_rss
    print(
        f"RSS before the first scrape {before / 1024:.1f} MiB, after one of each VM (start) "
        f"{start_rss / 1024:.1f} MiB, after scrape {scrapes} (end) {end / 1024:.1f} MiB, "
        f"peak {peak / 1024:.1f} MiB: growth {growth:+.1f} % "
        f"over {(time.monotonic() - began) / 60:.1f} min; {failed} scrapes failed"
    )
    return {
        "scrapes": scrapes,
        "failed": failed,
        "rss_before_kib": before,
        "rss_start_kib": start_rss,
        "rss_end_kib": end,
        "rss_peak_kib": peak,
        "growth_pct": round(growth, 2),
    }


def _wait_until(moment: float) -> None:
    """A fixed schedule, as a scraper keeps one (not synchronisation: nothing waits on it)."""
    left = moment - time.monotonic()
    if left > 0:
        time.sleep(left)


if __name__ == "__main__":
    sys.exit(main())
