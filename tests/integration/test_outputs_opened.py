"""A real recording of the example guest, saved in every format and opened by the tool
people open it with: go tool pprof, Chromium (the SVG), speedscope's own app."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.consumers.conftest import INSTALL, SPEEDSCOPE_APP, dump_dom
from tests.consumers.test_speedscope_app import load
from tests.integration.conftest import Guest, run_qmpprof

LEAVES = ("physics_leaf", "render_leaf", "audio_leaf")
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def recorded(guest: Guest, workdir: Path) -> dict[str, Path]:
    files = {fmt: workdir / f"profile.{fmt}" for fmt in ("pb.gz", "svg", "speedscope.json")}
    args = [arg for path in files.values() for arg in ("-o", str(path))]
    done = run_qmpprof(
        "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), "--duration", "4", *args
    )
    assert done.returncode == 0, done.stderr
    return files


def needs(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed; {INSTALL}")
    return path


def test_go_tool_pprof_shows_the_guest_chains(recorded: dict[str, Path]) -> None:
    go = needs("go")
    top = subprocess.run(
        [go, "tool", "pprof", "-top", "-sample_index=samples", str(recorded["pb.gz"])],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    for leaf in LEAVES:
        assert leaf in top
    assert "workload_loop" in top and "kernel_entry" in top


def test_chromium_draws_the_chains_and_search_finds_them(recorded: dict[str, Path]) -> None:
    chromium = needs("chromium")
    dom, _ = dump_dom(chromium, recorded["svg"].as_uri() + "#s=physics_leaf", 3000)
    frames = [g for g in ET.fromstring(dom).iter(f"{SVG}g") if "frame" in g.get("class", "")]
    assert set(LEAVES) <= {g.get("data-n") for g in frames}
    matches = [g for g in frames if "match" in g.get("class", "").split()]
    assert matches and all(g.get("data-n") == "physics_leaf" for g in matches)


def test_speedscope_imports_the_recording(recorded: dict[str, Path], tmp_path: Path) -> None:
    chromium = needs("chromium")
    if not SPEEDSCOPE_APP.is_file():
        pytest.skip(f"the speedscope npm package is not installed; {INSTALL}")
    page, log = load(chromium, SPEEDSCOPE_APP, recorded["speedscope.json"], tmp_path)
    assert "Importing as speedscope json file" in log
    text = str(page.tables)
    assert all(leaf in text for leaf in LEAVES)
