"""Hypothesis draws from a fixed seed: every run tries the same cases, so a failure repeats.

QMPPROF_SEED=N draws other cases; the seed in force is printed with every failure.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

SEED = int(os.environ.get("QMPPROF_SEED", "0"))

#: No test reads what an earlier run (or the user's qmpprof) derived and cached: each
#: qmpprof the tests start, in this process or as a child, reads its ELF files afresh.
#: The tests of the cache itself give it a directory of their own.
os.environ["QMPPROF_DERIVED_CACHE"] = "off"
# No test asks a debuginfod server it did not start itself (Debian's profile.d sets one).
os.environ.pop("DEBUGINFOD_URLS", None)

#: Hypothesis's time limits (a deadline per example, the too_slow health check on
#: drawing) are timing thresholds: a loaded host would fail them. A test that sets its
#: own suppress_health_check replaces this list, so it names too_slow again.
settings.register_profile(
    "qmpprof",
    derandomize=SEED == 0,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("qmpprof")


def pytest_configure(config: pytest.Config) -> None:
    if SEED and not config.getoption("hypothesis_seed", None):
        config.option.hypothesis_seed = SEED


def pytest_report_header() -> str:
    return f"qmpprof seed: {SEED or 'fixed (derandomized)'}; QMPPROF_SEED=N draws others"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        report.sections.append(("qmpprof seed", f"QMPPROF_SEED={SEED} (0: the fixed seed)"))
    return None
