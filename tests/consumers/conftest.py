"""The real consumers of qmpprof's output files, and the files they are fed.

Each fixture skips its tests, saying why, when its consumer is not installed;
`bash tests/consumers/install.sh` installs them all.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from qmpprof.output.flamegraph import write_flamegraph
from qmpprof.output.pprof import write_pprof
from qmpprof.output.speedscope import write_speedscope
from qmpprof.profile import Grouping
from tests.consumers.cdp import CHROMIUM_FLAGS
from tests.consumers.samples import RECORDING, realistic_samples

HERE = Path(__file__).parent
SPEEDSCOPE_APP = HERE / "node" / "node_modules" / "speedscope" / "dist" / "release" / "index.html"
INSTALL = "run `bash tests/consumers/install.sh` to install it"


@dataclass(frozen=True)
class Outputs:
    """The realistic samples written in each format."""

    pprof: Path
    svg: Path
    speedscope: Path


@pytest.fixture(scope="session")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Outputs:
    directory = tmp_path_factory.mktemp("outputs")
    files = Outputs(
        directory / "profile.pb.gz",
        directory / "profile.svg",
        directory / "profile.speedscope.json",
    )
    samples = realistic_samples()
    write_pprof(samples, RECORDING, files.pprof)
    # grouped by vCPU: the viewers' tests name profiles and frames per vCPU
    write_flamegraph(samples, RECORDING, files.svg, grouping=Grouping.VCPU)
    write_speedscope(samples, RECORDING, files.speedscope, grouping=Grouping.VCPU)
    return files


@pytest.fixture(scope="session")
def go() -> str:
    path = shutil.which("go")
    if path is None:
        pytest.skip(f"go (for `go tool pprof`) is not installed; {INSTALL}")
    return path


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(f"chromium is not installed; {INSTALL}")
    return path


@pytest.fixture(scope="session")
def speedscope_app(chromium: str) -> Path:
    if not SPEEDSCOPE_APP.is_file():
        pytest.skip(f"the speedscope npm package is not in {HERE / 'node'}; {INSTALL}")
    return SPEEDSCOPE_APP


def dump_dom(chromium: str, url: str, budget_ms: int, *flags: str) -> tuple[str, str]:
    """(the DOM after `budget_ms` of virtual time, Chromium's stderr) for `url`."""
    with tempfile.TemporaryDirectory(prefix="qmpprof-chromium-") as profile:
        result = subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                *flags,
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    return result.stdout, result.stderr
